# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.memory_host_plan: one memory plan for several models on one Spark (SPEC section 13)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: memory_host_plan
short_description: One memory plan for several models on one DGX Spark (KV budgets, container caps)
version_added: 0.1.0
description:
  - Pure function of its inputs; with P(sparkops.appliance.memory_plan#filter) the only place memory is
    planned. Each vLLM process's C(--gpu-memory-utilization) is a fraction of the whole unified memory,
    so models planned one by one overcommit it; this filter plans them together (SPEC section 13).
  - "Each model's own figures are the single plan's (SPEC section 3): C(fixed), C(kv_need) (ONE
    max-length request), C(kv_wish = max(kv_need, kv_target_gib)). Tensor parallel 1 only."
  - "C(cap = mem_total_gib - host_reserve_gib - sum(co-located gib)). When
    C(sum(fixed + kv_wish) <= cap) every model gets its KV wish and the rest of the cap is left
    unplanned (headroom). When only C(sum(fixed + kv_need) <= cap), every model gets its kv_need and
    the rest goes to the wishes in priority order, the highest C(priority) first. Otherwise the set is
    refused: the message names each model (name, priority, fixed, kv_need, wish), the shortfall in GiB
    and the variables to change."
  - "Per model: the KV budget as vLLM's C(--kv-cache-memory-bytes) (floored bytes), the model's budget
    (fixed + KV budget) and its container cap (budget + docker_headroom_gib, Docker C(--memory) =
    C(--memory-swap))."
  - "Refuses (AnsibleFilterError naming C(spark_models[i].field) or C(spark_colocated_services[i].gib)):
    an empty or non-list C(spark_models); an entry without a safe unique C(name) (C([a-z0-9][a-z0-9._-]*)),
    a unique whole C(priority) or a unique C(port) (1-65535); an unknown key; a host-level key
    (C(mem_total_gib), C(host_reserve_gib)) in an entry; C(tensor_parallel_size) other than 1; every
    refusal of the single plan's inputs; a co-located service without a safe unique name or with a
    C(gib) that is not a number >= 0."
  - Computed in decimal arithmetic like the single plan (docs/memory-plan.md, "Floating point").
  - See docs/memory-plan.md, "Several models on one Spark (SPEC §13)", for the arithmetic and a worked example.
options:
  _input:
    description:
      - The host's C(spark_models), a non-empty list. Each entry is a model with C(name), C(priority)
        (a whole number, unique on the host, higher is more important) and C(port) (unique), and the
        model's plan inputs as P(sparkops.appliance.memory_plan#filter) takes them (C(weight_bytes),
        C(ple_gib), C(mtp_enabled), C(overhead_gib), C(max_model_len), C(kv_bytes_per_token),
        C(kv_cache_dtype), C(kv_target_gib), C(max_num_seqs), ...) but for C(mem_total_gib) and
        C(host_reserve_gib), which are the host's.
      - "An entry leaves out what it takes as the memory_plan role's defaults: C(ple_gib) 0,
        C(mtp_enabled) false, C(mtp_off_credit_gib) 0, C(overhead_gib) 5.60, C(mtp_gib) 1.49,
        C(kv_cache_dtype) auto, C(kv_target_gib) 20, C(max_num_seqs) 8."
      - The model's C(extra_args) (the serve role's) and its checkpoint settings C(checkpoint_source),
        C(checkpoint_revision), C(checkpoint_url), C(checkpoint_manifest), C(checkpoint_hf_repo) and
        C(checkpoint_src_path) (the checkpoint role's, which fetches the model into C(spark_model_dir/<name>) and
        checks them) are accepted and not read. Any other C(checkpoint_*) key is refused as the host's setting.
    type: list
    elements: dict
    required: true
  mem_total_gib:
    description: MemTotal as Linux reports it, GiB (C(memory_plan_mem_total_gib)).
    type: float
    required: true
  host_reserve_gib:
    description: GiB kept for the OS, CPU processes, PLE page cache and driver (C(memory_plan_host_reserve_gib)).
    type: float
    required: true
  colocated_services:
    description: The host's C(spark_colocated_services), each C(name) and C(gib) (the most it takes).
    type: list
    elements: dict
    default: []
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: A chat model and an embedding model beside an image generator (docs/memory-plan.md)
  ansible.builtin.set_fact:
    spark_memory_host_plan: >-
      {{ spark_models | sparkops.appliance.memory_host_plan(
           mem_total_gib=121.69, host_reserve_gib=26, colocated_services=spark_colocated_services) }}
  vars:
    spark_colocated_services:
      - {name: image-gen, gib: 12}
    spark_models:
      - {name: chat, priority: 10, port: 8000, weight_bytes: 42949672960, max_model_len: 131072,
         kv_bytes_per_token: 65536, kv_cache_dtype: fp8, kv_target_gib: 20}
      - {name: embed, priority: 5, port: 8001, weight_bytes: 8589934592, overhead_gib: 2.5,
         max_model_len: 32768, kv_bytes_per_token: 16384, kv_target_gib: 2, max_num_seqs: 4}
"""

RETURN = r"""
_value:
  description: The host plan. Figures are floats in GiB unless named bytes.
  type: dict
  contains:
    models:
      description: One per model, in the order of C(spark_models).
      type: list
      elements: dict
      contains:
        name: {description: The model's name., type: str}
        priority: {description: Its priority (higher is more important)., type: int}
        port: {description: Its port., type: int}
        weights_gib: {description: w as in the single plan., type: float}
        ple_gib: {description: PLE GiB., type: float}
        fixed_gib: {description: w + overhead (+ MTP reserve)., type: float}
        kv_bytes_per_token: {description: BF16 KV bytes per token., type: float}
        kv_source: {description: "C(given), C(config) or C(vllm), as the single plan.", type: str}
        kv_mult: {description: Cache-dtype factor., type: float}
        kv_request_bytes: {description: Bytes of ONE max-length request., type: float}
        kv_need_gib: {description: KV of ONE max-length request., type: float}
        kv_target_gib: {description: The model's KV target., type: float}
        kv_wish_gib: {description: "max(kv_need, kv_target).", type: float}
        wish_gib: {description: fixed + kv_wish., type: float}
        kv_budget_gib: {description: The KV budget the host plan gives the model (kv_need <= it <= kv_wish)., type: float}
        kv_cache_memory_bytes: {description: "kv_budget in bytes (floored), for vLLM --kv-cache-memory-bytes.", type: int}
        budget_gib: {description: fixed + kv_budget., type: float}
        budget_bytes: {description: budget in bytes (floored)., type: int}
        gmu: {description: "budget / mem_total rounded down to 3 decimals (the ratio, should vLLM be given one).", type: float}
        docker_memory_gib: {description: "budget + docker_headroom_gib: Docker --memory / --memory-swap.", type: float}
        docker_memory_bytes: {description: docker_memory_gib in bytes (floored)., type: int}
        full_length_fit: {description: Whole max-length requests that fit in the KV budget at once., type: int}
        max_model_len_fit: {description: Longest context one request could have in the KV budget; null when any fits., type: int}
        squeezed: {description: The KV budget is below the KV wish (the wishes did not all fit)., type: bool}
        warnings: {description: The single plan's max_num_seqs warnings against the KV budget., type: list, elements: str}
        inputs: {description: The model's normalised plan inputs., type: dict}
    host:
      description: The host's sums.
      type: dict
      contains:
        mem_total_gib: {description: MemTotal., type: float}
        host_reserve_gib: {description: The host reserve., type: float}
        colocated: {description: "The co-located services, [{name, gib}].", type: list, elements: dict}
        colocated_gib: {description: Their sum., type: float}
        cap_gib: {description: mem_total - host_reserve - colocated, shared by the models., type: float}
        fixed_gib: {description: Sum of the fixed costs., type: float}
        kv_need_gib: {description: Sum of kv_need., type: float}
        kv_wish_gib: {description: Sum of kv_wish., type: float}
        wish_gib: {description: fixed + kv_wish summed., type: float}
        least_gib: {description: fixed + kv_need summed (what the set needs at least)., type: float}
        kv_budget_gib: {description: Sum of the KV budgets., type: float}
        models_gib: {description: Sum of the models' budgets., type: float}
        headroom_gib: {description: cap - models, left unplanned., type: float}
        total_gib: {description: models + colocated + host_reserve + headroom (= mem_total)., type: float}
        squeezed: {description: The KV wishes did not all fit (budgets shrunk in priority order)., type: bool}
    warnings: {description: Every model's warnings, each prefixed with the model's name., type: list, elements: str}
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import (
    MemoryPlanError,
    compute_host_plan,
)


def memory_host_plan(models, mem_total_gib=None, host_reserve_gib=None, colocated_services=None):
    """The host plan (see RETURN)."""
    try:
        return compute_host_plan(models, mem_total_gib, host_reserve_gib, colocated_services)
    except MemoryPlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule(object):
    """sparkops.appliance.memory_host_plan"""

    def filters(self):
        return {'memory_host_plan': memory_host_plan}
