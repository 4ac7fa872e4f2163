# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.role_options: the collection's role options by declared type."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: role_options
author:
  - sparkops contributors (@sparkops)
short_description: Names of the collection's role options, by their declared type
version_added: 0.1.0
description:
  - Reads C(roles/*/meta/argument_specs.yml) of this collection (every entry point) and returns the
    names of the options whose C(type) is O(type), sorted. The strict-type checks of preflight are
    derived from these files, so a new option is checked as soon as it is declared.
options:
  _terms:
    description: Role names (without the collection prefix) to read; none means every role.
    type: list
    elements: str
    required: false
  type:
    description: The declared type wanted (an option without C(type) is a C(str)).
    type: str
    default: bool
    choices: [bool, int, float, str, path, list, dict, raw]
"""

EXAMPLES = r"""
- name: Every boolean option of every role
  ansible.builtin.debug:
    msg: "{{ query('sparkops.appliance.role_options', type='bool') }}"
"""

RETURN = r"""
_raw:
  description: Option names.
  type: list
  elements: str
"""

from ansible_collections.sparkops.appliance.plugins.plugin_utils._role_inputs import (
    RoleInputsLookup,
    names_by_type,
)


class LookupModule(RoleInputsLookup):
    """sparkops.appliance.role_options"""

    def run(self, terms, variables=None, **kwargs):
        return names_by_type(self.role_options(terms, variables, **kwargs), self.get_option('type'))
