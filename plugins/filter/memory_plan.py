# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.memory_plan: the GMU / KV budget of a DGX Spark (SPEC section 3)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: memory_plan
short_description: Compute the GMU / KV budget / container cap of a DGX Spark
version_added: 0.1.0
description:
  - Pure function of its inputs, the only place the memory plan is computed. Every role that
    needs the plan consumes its output (the host fact C(spark_memory_plan)); no plan
    arithmetic anywhere else.
  - "All capacities in GiB (2^30 bytes). The arithmetic (SPEC section 3):
    C(w = weight_bytes/2^30 - ple_gib); when MTP is off C(w -= min(mtp_off_credit_gib, max(w, 0)));
    C(w /= tensor_parallel_size);
    C(fixed = w + overhead_gib [+ mtp_gib when MTP is on] [+ tp_comm_reserve_gib when TP > 1]);
    C(kv_need = max_model_len * kv_bytes_per_token/TP * kv_mult / 2^30) with a given
    O(_input.kv_bytes_per_token);
    C(wish = fixed + max(kv_need, kv_target_gib)); C(cap = mem_total_gib - host_reserve_gib);
    C(gmu = floor(min(wish, cap) / mem_total_gib * 1000) / 1000);
    C(budget = gmu * mem_total_gib); C(kv_exp = budget - fixed)."
  - "The KV reading used, in this order: a given O(_input.kv_bytes_per_token); the runtime image's own
    vLLM spec O(_input.kv_layout_measured); the reading of O(_input.model_config). RV(_value.kv_source)
    says which, and RV(_value.kv_config) and RV(_value.kv_vllm) keep both readings to be compared."
  - "From O(_input.model_config) (no O(_input.kv_bytes_per_token)), kv_need is what vLLM allocates
    for ONE max-length request on this node: C(full_bytes_per_token * max_model_len * kv_mult
    + sum(sliding bytes_per_token * min(max_model_len, window)) * kv_mult
    + sum(chunked bytes_per_token * min(max_model_len, chunk)) * kv_mult
    + recurrent_state_bytes_per_sequence), in bytes before the division by 2^30. The recurrent
    (Mamba-2 / gated delta net) state keeps its own dtype (BF16 conv state, the SSM state at the
    config's mamba_ssm_cache_dtype / mamba_ssm_dtype, else BF16): kv_mult does not scale it.
    full_length_fit and the max_num_seqs warning therefore count the state of every sequence."
  - Computed in decimal arithmetic from the inputs' shortest decimal form, so a ratio that is
    exactly 0.786 is not floored to 0.785 by binary float error, and gmu is never rounded up.
  - "Refuses (AnsibleFilterError naming the input and the C(memory_plan_*) variable to change):
    a missing, negative, non-numeric or boolean-as-string input, an unknown input name, an
    unknown KV cache dtype, C(host_reserve_gib >= mem_total_gib), PLE larger than the checkpoint,
    and C(kv_exp < kv_need) (not even one max-length request fits: vLLM would refuse to start).
    From O(_input.model_config): a config it cannot read, sliding-window layers without
    C(sliding_window), and recurrent layers whose state it does not derive (each naming
    C(memory_plan_kv_bytes_per_token))."
  - "Warns (in RV(_value.warnings), not an error) when C(max_num_seqs * kv_need > kv_exp): at
    most K of N sequences can be at max length at once; and, for a model with recurrent
    layers, when C(max_num_seqs) states alone exceed kv_exp."
  - See docs/memory-plan.md for the tensor-parallel assumptions.
options:
  _input:
    description: The plan inputs (the inventory's C(memory_plan_*) values without the prefix).
      A key whose value is null counts as absent.
    type: dict
    required: true
    suboptions:
      weight_bytes:
        description: Bytes of the local checkpoint directory (PLE and MTP draft included).
        type: int
        required: true
      ple_gib:
        description: GiB of the PLE tables served through mmap (not GPU-resident).
          Required unless O(_input.ple_bytes) is given.
        type: float
      ple_bytes:
        description: Bytes of the packed PLE file, instead of O(_input.ple_gib).
        type: int
      mtp_enabled:
        description: Speculative decoding with the model's MTP head. A real boolean; the
          strings C(true)/C(yes)/... are refused.
        type: bool
        required: true
      mtp_off_credit_gib:
        description: GiB of draft weights counted in the checkpoint but not loaded when MTP is off.
        type: float
        required: true
      overhead_gib:
        description: Runtime reserve (CUDA graphs, activations, workspaces), GiB per node.
        type: float
        required: true
      mtp_gib:
        description: Reserve for the MTP module when on, GiB per node.
        type: float
        required: true
      max_model_len:
        description: Context length in tokens.
        type: int
        required: true
      kv_bytes_per_token:
        description:
          - BF16 KV bytes per token of the whole model (all ranks). Required unless
            O(_input.model_config) is given; wins over it when both are.
          - Divided by O(_input.tensor_parallel_size) unless O(_input.kv_split_across_tp) is false.
        type: float
      model_config:
        description: The checkpoint's parsed C(config.json); when O(_input.kv_bytes_per_token) is
          absent, the KV one max-length request holds on one rank is derived from it (full
          attention per token, sliding-window and chunked layers up to their span, the recurrent
          state per sequence; see the P(sparkops.appliance.kv_bytes_per_token#filter) filter and
          docs/memory-plan.md).
        type: dict
      kv_layout_measured:
        description:
          - "The runtime image's own vLLM KV cache spec of one rank at this O(_input.tensor_parallel_size)
            (what the serve role reads with C(roles/serve/files/vllm_kv_spec.py), BF16):
            C(full_bytes_per_token), C(sliding) [{C(window), C(layers), C(bytes_per_token)}],
            C(chunked) [{C(chunk), C(layers), C(bytes_per_token)}], C(recurrent_state_bytes_per_sequence);
            optional C(tensor_parallel_size) (refused when it is not the plan's), C(vllm_version),
            C(image), C(image_id); C(other) (layer kinds the plan cannot count) must be empty."
          - Wins over O(_input.model_config) (whose reading is kept beside it, RV(_value.kv_config));
            a given O(_input.kv_bytes_per_token) wins over both.
        type: dict
      kv_cache_dtype:
        description: vLLM C(--kv-cache-dtype).
        type: str
        required: true
        choices: [auto, bf16, bfloat16, fp8, fp8_e4m3, fp8_e5m2]
      kv_mult:
        description: Factor on the BF16 KV baseline; wins over the dtype's (auto/bf16 1.0, fp8 0.58).
        type: float
      kv_target_gib:
        description: Desired KV pool, GiB (room for concurrency and prefix reuse).
        type: float
        required: true
      mem_total_gib:
        description: MemTotal as Linux reports it, GiB.
        type: float
        required: true
      host_reserve_gib:
        description: GiB kept for the OS, CPU processes, PLE page cache and driver free pages.
        type: float
        required: true
      max_num_seqs:
        description: vLLM C(--max-num-seqs).
        type: int
        required: true
      tensor_parallel_size:
        description: Nodes one model is split across; the plan is then per node.
        type: int
        default: 1
      docker_headroom_gib:
        description: The container memory cap is budget plus this, GiB.
        type: float
        default: 5
      tp_comm_reserve_gib:
        description: Per-node reserve for NCCL buffers, Ray and transfer staging, added to the
          fixed costs only when O(_input.tensor_parallel_size) > 1.
        type: float
        default: 2
      kv_split_across_tp:
        description: Whether a given O(_input.kv_bytes_per_token) splits across TP ranks
          (attention heads do; a DeepSeek-style MLA latent does not).
        type: bool
        default: true
      max_num_batched_tokens:
        description: Prefill chunk; echoed for the table, not used in the arithmetic.
        type: int
      mtp_num_speculative_tokens:
        description: MTP draft tokens; echoed for the table, not used in the arithmetic.
        type: int
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: The golden case of SPEC section 3 (gmu 0.786, kv_exp ~16.81 GiB, 4 full-length requests)
  ansible.builtin.set_fact:
    spark_memory_plan: "{{ plan_inputs | sparkops.appliance.memory_plan }}"
  vars:
    plan_inputs:
      weight_bytes: 101382703022
      ple_gib: 22.67
      mtp_enabled: true
      mtp_off_credit_gib: 1.2
      overhead_gib: 5.60
      mtp_gib: 1.49
      max_model_len: 262144
      kv_bytes_per_token: 29482
      kv_cache_dtype: fp8
      kv_target_gib: 20
      mem_total_gib: 121.69
      host_reserve_gib: 26
      max_num_seqs: 8

- name: Use it
  ansible.builtin.debug:
    msg: "--gpu-memory-utilization {{ spark_memory_plan.gmu }}"
"""

RETURN = r"""
_value:
  description: The plan, per node when tensor_parallel_size > 1. Figures are floats in GiB.
  type: dict
  contains:
    weights_gib: {description: w, GPU-resident weights on this node., type: float}
    weights_total_gib: {description: w before the TP split., type: float}
    ple_gib: {description: PLE GiB used., type: float}
    fixed_gib: {description: w + overhead (+ MTP reserve) (+ TP comm reserve)., type: float}
    comm_reserve_gib: {description: TP communication reserve included in fixed (0 at TP=1)., type: float}
    kv_bytes_per_token: {description: "BF16 KV bytes per token on this node: the given figure / TP, or from
        config.json the full-attention (and MLA latent) layers only.", type: float}
    kv_bytes_per_token_source: {description: "C(given), C(config.json) or C(vllm).", type: str}
    kv_source: {description: "Which KV reading the plan used: C(given) (kv_bytes_per_token), C(config)
        (model_config) or C(vllm) (kv_layout_measured).", type: str}
    kv_config: {description: "The config.json reading (when model_config was read): full_bytes_per_token,
        sliding, chunked, recurrent_state_bytes_per_sequence, kv_request_bytes and kv_need_gib (one
        max-length request by that reading); null otherwise.", type: dict}
    kv_config_error: {description: "Why config.json could not be read, when vLLM's figure was used
        instead; null otherwise.", type: str}
    kv_vllm: {description: "vLLM's reading (kv_layout_measured) in the same shape as kv_config, with
        vllm_version, image, image_id and tensor_parallel_size where given; null without it.", type: dict}
    kv_vllm_differs: {description: "Whether vLLM's reading counts other bytes than config.json's; null
        unless both are there.", type: bool}
    kv_mult: {description: Cache-dtype factor used., type: float}
    kv_need_gib: {description: "KV of ONE max-length request (not multiplied by max_num_seqs): kv_request_bytes
        / 2^30.", type: float}
    kv_full_bytes_per_token: {description: "BF16 bytes per token of the layers whose cache grows with every
        token (equal to kv_bytes_per_token).", type: float}
    kv_full_request_bytes: {description: "max_model_len x kv_full_bytes_per_token x kv_mult: the full-attention
        part of one max-length request.", type: float}
    kv_sliding:
      description: "Sliding-window layers by window (empty with a given kv_bytes_per_token): C(window),
        C(layers), C(bytes_per_token) (BF16, this node), C(request_bytes) =
        bytes_per_token x min(max_model_len, window) x kv_mult."
      type: list
      elements: dict
    kv_chunked:
      description: "Chunked-local attention layers (Llama 4) by chunk: C(chunk), C(layers),
        C(bytes_per_token), C(request_bytes) = bytes_per_token x min(max_model_len, chunk) x kv_mult."
      type: list
      elements: dict
    recurrent_state_bytes_per_sequence: {description: "Bytes of recurrent (Mamba-2, gated delta net) state one
        sequence holds on this node, in its own dtype, not scaled by kv_mult; 0 without such layers.", type: int}
    recurrent_kind: {description: "C(mamba2) or C(gated_delta_net); null without recurrent layers.", type: str}
    kv_request_bytes: {description: "Bytes of ONE max-length request: kv_full_request_bytes + the request_bytes
        of kv_sliding and kv_chunked + recurrent_state_bytes_per_sequence.", type: float}
    kv_target_gib: {description: The KV target., type: float}
    wish_gib: {description: fixed + max(kv_need, kv_target)., type: float}
    cap_gib: {description: mem_total - host_reserve., type: float}
    budget_gib: {description: gmu x mem_total (after rounding gmu down)., type: float}
    gmu: {description: "vLLM --gpu-memory-utilization, rounded DOWN to 3 decimals.", type: float}
    gmu_step_gib: {description: GiB of one 0.001 step of gmu on this host., type: float}
    kv_exp_gib: {description: budget - fixed, the expected KV room., type: float}
    full_length_fit: {description: "Whole max-length requests that fit in kv_exp at once (each with its
        recurrent state).", type: int}
    max_model_len_fit: {description: "Longest context whose single request fits in kv_exp (sliding windows
        and chunks capped); null when a request stops growing (no full-attention layer) and fits at any
        length.", type: int}
    squeezed: {description: The host cap cut the wish (wish > cap)., type: bool}
    docker_memory_gib: {description: "Docker --memory / --memory-swap: budget + headroom.", type: float}
    docker_memory_bytes: {description: docker_memory_gib in bytes (floored)., type: int}
    budget_bytes: {description: budget_gib in bytes (floored); what must be available before the server starts., type: int}
    kv_cache_memory_bytes: {description: "kv_exp in bytes (floored), for vLLM --kv-cache-memory-bytes.", type: int}
    warnings: {description: Human-readable warnings., type: list, elements: str}
    inputs: {description: The normalised inputs (defaults filled in; model_config left out)., type: dict}
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import (
    MemoryPlanError,
    compute_plan,
)


def memory_plan(inputs):
    """The plan dict for one host (see RETURN)."""
    try:
        return compute_plan(inputs)
    except MemoryPlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule(object):
    """sparkops.appliance.memory_plan"""

    def filters(self):
        return {'memory_plan': memory_plan}
