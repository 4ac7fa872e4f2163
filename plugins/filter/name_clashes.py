# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.name_clashes: two of the collection's names that are the same, controller-side."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: name_clashes
short_description: Refusals for two of the collection's names that are the same, or a unit name the system uses
version_added: 0.1.0
author:
  - sparkops contributors (@sparkops)
description:
  - "Input: the claims of one host, every unit, container, file and folder the collection would
    write or run there, each with the variable it comes from (the preflight role builds them:
    C(__preflight_claims))."
  - "Output: one message per problem, naming both variables and the value: two claims that take
    the same unit, container or path (a unit is also its file in C(/etc/systemd/system)); a folder
    two roles share passes when both want the same mode. A unit name that starts like one the system
    uses (C(systemd-), C(dbus), C(ssh), C(docker), C(containerd), C(getty), C(nvidia), ...) is
    refused outright. An empty list means all is well."
  - Reads nothing on the host; M(sparkops.appliance.spark_facts) checks the claims against what is there.
options:
  _input:
    description: "The claims: mappings with C(var), C(value), C(kind) (C(unit), C(container), C(file),
      C(directory)), C(name) (the unit's full name, the container's name, the path) and for a folder C(mode)."
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Refuse two of the collection's names that are the same
  ansible.builtin.fail:
    msg: "{{ __clashes | join(' ') }}"
  when: __clashes | length > 0
  vars:
    __clashes: "{{ __preflight_claims | sparkops.appliance.name_clashes }}"
"""

RETURN = r"""
_value:
  description: Messages, one per problem.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.module_utils._owned import name_clashes as _name_clashes


def name_clashes(claims):
    """Messages for claims that take the same name, or a unit name the system uses."""
    keys = {"var", "value", "kind", "name"}
    if not isinstance(claims, list) or not all(isinstance(c, dict) and keys <= set(c) for c in claims):
        raise AnsibleFilterError("name_clashes: the input must be a list of claims (var, value, kind, name), got %r"
                                 % (claims,))
    return _name_clashes(claims)


class FilterModule(object):
    """sparkops.appliance.name_clashes"""

    def filters(self):
        return {"name_clashes": name_clashes}
