# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.kv_bytes_per_token: BF16 KV bytes per token from a config.json."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: kv_bytes_per_token
short_description: BF16 KV-cache bytes per token of one rank, from a checkpoint's config.json
version_added: 0.1.0
description:
  - "The bytes per token, on one rank, of the layers whose cache grows with every token (full
    attention and MLA latent), BF16, read the way vLLM 0.32 builds the model's layers
    (plugins/module_utils/memory_plan.py C(kv_cache_layout); docs/memory-plan.md, KV bytes per
    token from the model, with the fixtures checked against vLLM's own KV cache spec)."
  - "Standard attention: 2 (K and V) x full-attention layers x KV heads x head_dim x 2 bytes;
    Gemma 4 full-attention layers use C(global_head_dim) and C(num_global_key_value_heads)."
  - "Sliding-window and chunked-local layers (C(layer_types), Gemma 3's class-default pattern,
    Llama 4's C(attention_chunk_size)), recurrent layers (C(hybrid_override_pattern),
    C(hybrid_layer_pattern), C(layers_block_type), DeciLM C(block_configs)) and KV-shared layers
    (C(num_kv_shared_layers)) are not counted here: their cost stops growing at the window or is
    per sequence."
  - "Latent attention (DeepSeek-style, C(kv_lora_rank) present):
    layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes."
  - A nested C(text_config) (multimodal checkpoints) is used when present; fields it leaves out
    take the transformers class defaults.
  - "An architecture or field it cannot read is refused, naming the field and
    C(memory_plan_kv_bytes_per_token), rather than given a wrong number."
  - "With O(tensor_parallel_size) N: KV heads split across ranks (at least one per rank); the
    MLA latent is replicated on every rank."
options:
  _input:
    description: The parsed config.json (C(slurp) + C(b64decode) + C(from_json)).
    type: dict
    required: true
  tensor_parallel_size:
    description: Ranks the model is split across.
    type: int
    default: 1
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Read the checkpoint's config.json
  ansible.builtin.slurp:
    src: /srv/sparkops/models/my-model/config.json
  register: __config

- name: KV bytes per token
  ansible.builtin.debug:
    msg: "{{ __config.content | b64decode | from_json | sparkops.appliance.kv_bytes_per_token }}"
"""

RETURN = r"""
_value:
  description: BF16 KV bytes per token on one rank.
  type: int
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import (
    MemoryPlanError,
    kv_bytes_per_token_from_config,
)


def kv_bytes_per_token(config, tensor_parallel_size=1):
    """BF16 KV bytes per token of one rank."""
    try:
        return kv_bytes_per_token_from_config(config, tensor_parallel_size)
    except MemoryPlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule(object):
    """sparkops.appliance.kv_bytes_per_token"""

    def filters(self):
        return {'kv_bytes_per_token': kv_bytes_per_token}
