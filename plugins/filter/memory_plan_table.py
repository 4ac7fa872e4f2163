# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.memory_plan_table: the --no-launch view of memory plans."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: memory_plan_table
short_description: Render memory plans as a readable table, one column per host
version_added: 0.1.0
description:
  - Rows are checkpoint, PLE size, KV dtype, MTP, context, concurrency, chunk, tensor
    parallel, MemTotal, host reserve, and every figure of the plan, including whether the host
    cap squeezed the KV target. Each warning follows the table on its own line.
  - "When a plan's request is not full attention alone (a model read from config.json with
    sliding-window, chunked-local or recurrent layers), rows under C(kv_need) break one
    max-length request down: full attention, sliding window and chunked local GiB (with layers
    and span), and the recurrent state GiB per sequence; the rows are shown for every host
    when any host has them (C(-) where a host has none of that kind)."
  - "When a plan was given the runtime image's vLLM KV figure (RV(sparkops.appliance.memory_plan#filter:kv_source)
    C(vllm)), rows under the KV bytes per token show which reading was used and both readings (bytes per
    token and the kv_need of one max-length request by config.json and by vLLM); the rows are shown for
    every host when any host has them."
  - Formatting only; the figures come from P(sparkops.appliance.memory_plan#filter).
options:
  _input:
    description: One plan, or a mapping host -> plan.
    type: dict
    required: true
  sources:
    description: Where each input came from (for example C(measured) or C(given)), per host
      (host -> {input -> text}) or, for a single plan, input -> text.
    type: dict
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Print the plan of every host of the play
  ansible.builtin.debug:
    msg: "{{ plans | sparkops.appliance.memory_plan_table }}"
  vars:
    plans: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'spark_memory_plan'))) }}"
  run_once: true
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
    plan_table,
)


def memory_plan_table(plans, sources=None):
    """Table lines."""
    try:
        return plan_table(plans, sources)
    except (MemoryPlanError, KeyError, TypeError) as exc:
        raise AnsibleFilterError('memory_plan_table: cannot render %r: %s'
                                 % (type(plans).__name__, exc)) from exc


class FilterModule(object):
    """sparkops.appliance.memory_plan_table"""

    def filters(self):
        return {'memory_plan_table': memory_plan_table}
