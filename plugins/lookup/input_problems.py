# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.input_problems: what is wrong with the role options' values, by their specs."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: input_problems
author:
  - sparkops contributors (@sparkops)
short_description: Check every defined role option against its declared type, strictly
version_added: 0.1.0
description:
  - For every option declared in C(roles/*/meta/argument_specs.yml) of this collection that is
    defined for the host, templates its value and returns one message per problem, naming the
    variable, the value (hidden for C(no_log) options) and the fix. An empty list means all is well.
  - Stricter than Ansible's own role argument validation, which converts instead of refusing
    (C("false") passes as a bool and is true in a condition; a string passes as a list).
  - "Checks: C(bool) is a YAML boolean; C(int)/C(float) a number (never a boolean); C(str) a
    string; C(list) a list; C(dict) a mapping; C(path) an absolute, normalised path without
    whitespace; C(choices); and no control character (newline, tab, ...) in any string of any
    option, keys included."
  - Then, for a value of the right type, the checks beyond type in C(roles/*/meta/checks.yml)
    (ranges, named patterns, relations between options, refused flags and keys; the format is in
    the docstring of C(plugins/plugin_utils/_role_inputs.py)), one message per failing check.
  - A value that cannot be templated yet (it refers to a fact set later) is left to the role.
options:
  _terms:
    description: Role names (without the collection prefix) whose options are checked; none means every role.
    type: list
    elements: str
    required: false
"""

EXAMPLES = r"""
- name: Refuse any option of any role with a wrong type or a control character
  ansible.builtin.assert:
    that: __problems | length == 0
    fail_msg: "{{ __problems | join(' ') }}"
    quiet: true
  vars:
    __problems: "{{ query('sparkops.appliance.input_problems') }}"
"""

RETURN = r"""
_raw:
  description: Messages, one per problem.
  type: list
  elements: str
"""

from ansible_collections.sparkops.appliance.plugins.plugin_utils._role_inputs import (
    RoleInputsLookup,
    input_problems,
)


class LookupModule(RoleInputsLookup):
    """sparkops.appliance.input_problems"""

    def run(self, terms, variables=None, **kwargs):
        options = self.role_options(terms, variables, **kwargs)
        values = self.defined_values(options, variables)
        return input_problems(values, options, self.role_checks(terms), self.resolver(values, options, variables))
