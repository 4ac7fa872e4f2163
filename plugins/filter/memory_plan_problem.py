# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.memory_plan_problem: why the memory plan refuses its inputs ("" when it does not)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: memory_plan_problem
short_description: The memory plan's own refusal of its inputs, as a message ("" when the plan is fine)
version_added: 0.1.0
description:
  - Computes the plan like M(sparkops.appliance.memory_plan) and returns the plan's refusal message
    (naming the input and the C(memory_plan_*) variable to change) instead of raising it, so that an
    C(ansible.builtin.assert) task can fail with that message alone rather than a templating error
    around it.
options:
  _input:
    description: The plan inputs, as for M(sparkops.appliance.memory_plan).
    type: dict
    required: true
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Refuse a plan that cannot be served, with the plan's own message
  ansible.builtin.assert:
    that: __problem | length == 0
    fail_msg: "{{ __problem }}"
  vars:
    __problem: "{{ plan_inputs | sparkops.appliance.memory_plan_problem }}"
"""

RETURN = r"""
_value:
  description: The refusal message, or an empty string.
  type: str
"""

from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import (
    MemoryPlanError,
    compute_plan,
)


def memory_plan_problem(inputs):
    """The plan's refusal of `inputs` as a message; '' when the plan can be computed."""
    try:
        compute_plan(inputs)
    except MemoryPlanError as exc:
        return str(exc)
    return ''


class FilterModule(object):
    """sparkops.appliance.memory_plan_problem"""

    def filters(self):
        return {'memory_plan_problem': memory_plan_problem}
