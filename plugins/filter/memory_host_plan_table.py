# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.memory_host_plan_table: the --no-launch view of host plans (several models on one Spark)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: memory_host_plan_table
short_description: Render host plans (several models on one Spark) as a table, one row per model
version_added: 0.1.0
description:
  - "One row per model of each host (priority, port, fixed, kv_need, KV wish, KV budget,
    C(--kv-cache-memory-bytes), its budget, its Docker C(--memory), whole max-length requests at once,
    squeezed), then the host's co-located services, host reserve, unplanned headroom and the total,
    which is MemTotal. Each warning follows the table on its own line."
  - Formatting only; the figures come from P(sparkops.appliance.memory_host_plan#filter).
options:
  _input:
    description: A mapping host -> host plan.
    type: dict
    required: true
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Print the host plans
  ansible.builtin.debug:
    msg: "{{ {'spark-04': spark_memory_host_plan} | sparkops.appliance.memory_host_plan_table }}"
"""

RETURN = r"""
_value:
  description: The table's lines.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import (
    MemoryPlanError,
    host_plan_table,
)


def memory_host_plan_table(plans):
    """Table lines."""
    try:
        return host_plan_table(plans)
    except (MemoryPlanError, KeyError, TypeError) as exc:
        raise AnsibleFilterError('memory_host_plan_table: cannot render %r: %s'
                                 % (type(plans).__name__, exc)) from exc


class FilterModule(object):
    """sparkops.appliance.memory_host_plan_table"""

    def filters(self):
        return {'memory_host_plan_table': memory_host_plan_table}
