# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.memory_host_plan_problem: why the host plan refuses a set of models ("" when it does not)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: memory_host_plan_problem
short_description: The host plan's own refusal of a set of models, as a message ("" when the plan is fine)
version_added: 0.1.0
description:
  - Computes the plan like P(sparkops.appliance.memory_host_plan#filter) and returns its refusal message
    (naming each model, the shortfall and the variable to change) instead of raising it, so that an
    C(ansible.builtin.fail) task can fail with that message alone rather than a templating error around it.
options:
  _input:
    description: The host's C(spark_models), as for P(sparkops.appliance.memory_host_plan#filter).
    type: list
    elements: dict
    required: true
  mem_total_gib:
    description: MemTotal, GiB.
    type: float
    required: true
  host_reserve_gib:
    description: The host reserve, GiB.
    type: float
    required: true
  colocated_services:
    description: The host's C(spark_colocated_services).
    type: list
    elements: dict
    default: []
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Refuse a set of models that does not fit, with the plan's own message
  ansible.builtin.fail:
    msg: "{{ __problem }}"
  when: __problem | length > 0
  vars:
    __problem: >-
      {{ spark_models | sparkops.appliance.memory_host_plan_problem(
           mem_total_gib=121.69, host_reserve_gib=26, colocated_services=spark_colocated_services) }}
"""

RETURN = r"""
_value:
  description: The refusal message, or an empty string.
  type: str
"""

from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import (
    MemoryPlanError,
    compute_host_plan,
)


def memory_host_plan_problem(models, mem_total_gib=None, host_reserve_gib=None, colocated_services=None):
    """The host plan's refusal as a message; '' when the plan can be computed."""
    try:
        compute_host_plan(models, mem_total_gib, host_reserve_gib, colocated_services)
    except MemoryPlanError as exc:
        return str(exc)
    return ''


class FilterModule(object):
    """sparkops.appliance.memory_host_plan_problem"""

    def filters(self):
        return {'memory_host_plan_problem': memory_host_plan_problem}
