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
  - "Standard attention: 2 (K and V) x layers x KV heads x head_dim x 2 bytes; head_dim is
    C(head_dim) or C(hidden_size / num_attention_heads); KV heads default to the attention heads."
  - "Hybrid models count only the full-attention layers: C(layer_types) (or C(layers_block_type))
    entries C(full_attention)/C(attention), else every C(full_attention_interval)-th layer, else
    C(attn_layer_period)/C(attn_layer_offset). Layers listed in C(num_kv_shared_layers) reuse
    earlier caches and are not counted."
  - "Latent attention (DeepSeek-style, C(kv_lora_rank) present):
    layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes."
  - A nested C(text_config) (multimodal checkpoints) is used when present.
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
