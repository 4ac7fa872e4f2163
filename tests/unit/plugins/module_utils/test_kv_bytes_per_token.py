"""KV bytes per token from a checkpoint's config.json (configs written by the tests)."""
import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.kv_bytes_per_token import (
    FilterModule,
    kv_bytes_per_token,
)
from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import (
    MemoryPlanError,
    full_attention_layers,
    kv_bytes_per_token_from_config,
    kv_bytes_per_token_from_file,
    kv_cache_layout,
    recurrent_state_bytes_per_sequence,
)

LLAMA = {  # Llama-3-8B shape: GQA, explicit head_dim
    'architectures': ['LlamaForCausalLM'], 'num_hidden_layers': 32, 'hidden_size': 4096,
    'num_attention_heads': 32, 'num_key_value_heads': 8, 'head_dim': 128,
}
QWEN3_NEXT = {  # hybrid: 3 linear-attention layers then one full-attention layer
    'num_hidden_layers': 48, 'hidden_size': 2048, 'num_attention_heads': 16,
    'num_key_value_heads': 2, 'head_dim': 256, 'full_attention_interval': 4,
}
DEEPSEEK_V3 = {  # latent attention
    'num_hidden_layers': 61, 'hidden_size': 7168, 'num_attention_heads': 128,
    'num_key_value_heads': 128, 'kv_lora_rank': 512, 'qk_rope_head_dim': 64,
    'qk_nope_head_dim': 128, 'v_head_dim': 128,
}


def write(tmp_path, config, name='model'):
    path = tmp_path / name
    path.mkdir()
    (path / 'config.json').write_text(json.dumps(config))
    return path


def test_standard_attention_from_a_file(tmp_path):
    model = write(tmp_path, LLAMA)
    assert kv_bytes_per_token_from_file(str(model)) == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token_from_file(str(model / 'config.json')) == 131072


def test_head_dim_from_hidden_size_and_mha_without_kv_heads(tmp_path):
    config = {'num_hidden_layers': 2, 'hidden_size': 128, 'num_attention_heads': 4}
    assert kv_bytes_per_token_from_file(str(write(tmp_path, config))) == 2 * 2 * 4 * 32 * 2


def test_hybrid_by_full_attention_interval(tmp_path):
    assert full_attention_layers(QWEN3_NEXT)[0] == 12
    assert kv_bytes_per_token_from_file(str(write(tmp_path, QWEN3_NEXT))) == 2 * 12 * 2 * 256 * 2


def test_hybrid_by_layer_types(tmp_path):
    types = ['linear_attention', 'linear_attention', 'full_attention'] * 4 + ['sliding_attention']
    config = dict(LLAMA, num_hidden_layers=13, layer_types=types)
    assert full_attention_layers(config) == (4, 'layer_types')
    assert kv_bytes_per_token_from_file(str(write(tmp_path, config))) == 2 * 4 * 8 * 128 * 2


def test_layer_types_win_over_the_interval():
    config = dict(QWEN3_NEXT, layer_types=['full_attention'] * 48)
    assert full_attention_layers(config)[0] == 48


def test_hybrid_by_attention_period_and_offset():
    config = dict(LLAMA, attn_layer_period=8, attn_layer_offset=4)
    assert full_attention_layers(config)[0] == 4  # layers 4, 12, 20, 28


def test_nested_text_config_and_kv_shared_layers(tmp_path):
    text = {'num_hidden_layers': 10, 'hidden_size': 256, 'num_attention_heads': 4,
            'num_key_value_heads': 2, 'head_dim': 64, 'num_kv_shared_layers': 4,
            'layer_types': ['sliding_attention'] * 4 + ['full_attention'] + ['sliding_attention']
            * 4 + ['full_attention']}
    config = {'architectures': ['Gemma3nForConditionalGeneration'], 'text_config': text,
              'vision_config': {'hidden_size': 2048}}
    # layers 6..9 reuse earlier caches: only layer 4 is a full-attention owner.
    assert full_attention_layers(config)[0] == 1
    assert kv_bytes_per_token_from_file(str(write(tmp_path, config))) == 2 * 1 * 2 * 64 * 2


def test_latent_attention(tmp_path):
    model = write(tmp_path, DEEPSEEK_V3)
    assert kv_bytes_per_token_from_file(str(model)) == 61 * (512 + 64) * 2 == 70272


@pytest.mark.parametrize('tp', [1, 2, 4, 8])
def test_tensor_parallel_splits_kv_heads(tp):
    assert kv_bytes_per_token_from_config(LLAMA, tp) * tp == 131072


def test_tensor_parallel_replicates_when_kv_heads_are_fewer_than_ranks():
    config = dict(LLAMA, num_key_value_heads=1)
    assert kv_bytes_per_token_from_config(config, 2) == kv_bytes_per_token_from_config(config)


def test_tensor_parallel_keeps_the_whole_latent_on_each_rank():
    assert kv_bytes_per_token_from_config(DEEPSEEK_V3, 2) == 70272


def test_uneven_head_split_is_refused():
    with pytest.raises(MemoryPlanError, match='split evenly'):
        kv_bytes_per_token_from_config(dict(LLAMA, num_key_value_heads=6), 4)


@pytest.mark.parametrize('config, needle', [
    ({'hidden_size': 128, 'num_attention_heads': 4}, 'num_hidden_layers'),
    ({'num_hidden_layers': 2, 'hidden_size': 128}, 'num_attention_heads'),
    ({'num_hidden_layers': 2, 'num_attention_heads': 4}, 'hidden_size'),
    ({'num_hidden_layers': 2, 'hidden_size': 130, 'num_attention_heads': 4}, 'multiple'),
    ({'num_hidden_layers': '2', 'hidden_size': 128, 'num_attention_heads': 4}, 'num_hidden_layers'),
    (dict(LLAMA, layer_types=['full_attention']), 'layer_types'),
    (dict(DEEPSEEK_V3, qk_rope_head_dim=None), 'qk_rope_head_dim'),
])
def test_incomplete_configs_are_refused_naming_the_key(config, needle):
    with pytest.raises(MemoryPlanError, match=needle):
        kv_bytes_per_token_from_config(config)


def test_unreadable_config_is_refused(tmp_path):
    with pytest.raises(MemoryPlanError, match='cannot read'):
        kv_bytes_per_token_from_file(str(tmp_path))
    (tmp_path / 'config.json').write_text('{not json')
    with pytest.raises(MemoryPlanError, match='cannot read'):
        kv_bytes_per_token_from_file(str(tmp_path))


def test_filter_wraps_errors_and_takes_tp():
    assert FilterModule().filters()['kv_bytes_per_token'] is kv_bytes_per_token
    assert kv_bytes_per_token(LLAMA, tensor_parallel_size=2) == 65536
    with pytest.raises(AnsibleFilterError, match='num_hidden_layers'):
        kv_bytes_per_token({})
    with pytest.raises(AnsibleFilterError, match='tensor_parallel_size'):
        kv_bytes_per_token(LLAMA, tensor_parallel_size=0)


# Configs that leave fields to the transformers class defaults (memory_plan.py cites the classes).
# Written for these tests with the fields such checkpoints give; not copies of upstream files
# (the real config.json fixtures are in kv_fixtures/, test_kv_fixtures.py).
GEMMA3_27B_SHAPED = {
    'architectures': ['Gemma3ForConditionalGeneration'], 'model_type': 'gemma3',
    'text_config': {'model_type': 'gemma3_text', 'head_dim': 128, 'hidden_size': 5376, 'num_attention_heads': 32,
                    'num_hidden_layers': 62, 'num_key_value_heads': 16, 'sliding_window': 1024},
    'vision_config': {'model_type': 'siglip_vision_model', 'hidden_size': 1152},
}


def test_gemma3_without_a_layer_pattern_uses_the_class_default_of_five_sliding_to_one_full():
    layout = kv_cache_layout(GEMMA3_27B_SHAPED)
    assert layout['full_layers'] == 10  # layers 5, 11, ..., 59 of 62
    assert layout['full_bytes_per_token'] == 10 * 16 * (128 + 128) * 2 == 81920
    assert layout['sliding'] == [{'window': 1024, 'layers': 52, 'bytes_per_token': 52 * 16 * 256 * 2}]
    assert full_attention_layers(GEMMA3_27B_SHAPED)[1].startswith('sliding_window_pattern 6')


def test_gemma3_sliding_window_pattern_is_read():
    config = {'model_type': 'gemma3_text', 'num_hidden_layers': 26, 'num_attention_heads': 4, 'num_key_value_heads': 1,
              'head_dim': 256, 'sliding_window': 512, 'sliding_window_pattern': 2}
    assert full_attention_layers(config)[0] == 13


def test_gemma3_text_config_without_head_counts_uses_the_class_defaults():
    # A 4B-style text_config: no num_attention_heads, num_key_value_heads, head_dim.
    config = {'architectures': ['Gemma3ForConditionalGeneration'], 'model_type': 'gemma3',
              'text_config': {'hidden_size': 2560, 'num_hidden_layers': 34, 'sliding_window': 1024,
                              'model_type': 'gemma3_text'}}
    # Gemma3TextConfig defaults: 4 KV heads of head_dim 256; 5 full layers of 34.
    assert kv_bytes_per_token_from_config(config) == 5 * 4 * 512 * 2 == 20480
    assert kv_bytes_per_token_from_config(config, 2) == 10240


def test_gemma2_without_layer_types_alternates():
    config = {'architectures': ['Gemma2ForCausalLM'], 'model_type': 'gemma2', 'num_hidden_layers': 42,
              'num_attention_heads': 16, 'num_key_value_heads': 8, 'head_dim': 256, 'sliding_window': 4096}
    layout = kv_cache_layout(config)
    assert (layout['full_layers'], layout['sliding'][0]['layers']) == (21, 21)


def test_gemma4_full_layers_use_global_head_dim_and_global_kv_heads_only_with_k_eq_v():
    text = {'model_type': 'gemma4_text', 'num_hidden_layers': 6, 'num_attention_heads': 8, 'num_key_value_heads': 4,
            'head_dim': 256, 'global_head_dim': 512, 'num_global_key_value_heads': 1, 'sliding_window': 512,
            'layer_types': ['sliding_attention'] * 5 + ['full_attention']}
    config = {'model_type': 'gemma4', 'text_config': text}
    assert kv_bytes_per_token_from_config(config) == 1 * 4 * 1024 * 2  # k_eq_v absent: 4 KV heads
    text['attention_k_eq_v'] = True
    assert kv_bytes_per_token_from_config(config) == 1 * 1 * 1024 * 2
    del text['global_head_dim']  # Gemma4TextConfig default 512
    assert kv_bytes_per_token_from_config(config) == 2048
    text['per_layer_config'] = {}  # a saved config's own per-layer overrides win (none here)
    assert kv_bytes_per_token_from_config(config) == 4 * 512 * 2


def test_gemma4_kv_shared_layers_hold_no_cache():
    text = {'model_type': 'gemma4_text', 'num_hidden_layers': 12, 'num_attention_heads': 8, 'num_key_value_heads': 1,
            'head_dim': 256, 'global_head_dim': 512, 'sliding_window': 512, 'num_kv_shared_layers': 6}
    layout = kv_cache_layout({'model_type': 'gemma4', 'text_config': text})
    # default pattern: layers 5 and 11 full; 6..11 shared: one full (layer 5), five sliding own a cache
    assert (layout['full_layers'], layout['sliding'][0]['layers'], layout['shared_layers']) == (1, 5, 6)
    assert layout['full_bytes_per_token'] == 1 * 1 * 1024 * 2


def test_llama4_no_rope_layers_and_chunk_size():
    text = {'model_type': 'llama4_text', 'num_hidden_layers': 8, 'num_attention_heads': 8, 'num_key_value_heads': 2,
            'head_dim': 64, 'no_rope_layers': [1, 1, 1, 0, 1, 1, 1, 0], 'attention_chunk_size': 4096}
    layout = kv_cache_layout({'model_type': 'llama4', 'text_config': text})
    assert layout['full_layers'] == 2
    assert layout['chunked'] == [{'chunk': 4096, 'layers': 6, 'bytes_per_token': 6 * 2 * 128 * 2}]
    del text['attention_chunk_size']  # absent: the class default 8192
    assert kv_cache_layout({'model_type': 'llama4', 'text_config': text})['chunked'][0]['chunk'] == 8192
    text['attention_chunk_size'] = None  # null: no chunking, every layer full
    assert kv_cache_layout({'model_type': 'llama4', 'text_config': text})['full_layers'] == 8


def test_jamba_mamba_state_is_refused_not_guessed():
    config = dict(LLAMA, attn_layer_period=8, attn_layer_offset=4)
    layout = kv_cache_layout(config)
    assert layout['recurrent_layers'] == 28 and layout['recurrent_state_bytes_per_sequence'] is None
    with pytest.raises(MemoryPlanError, match='memory_plan_kv_bytes_per_token'):
        recurrent_state_bytes_per_sequence(config)
    assert kv_bytes_per_token_from_config(config) == 2 * 4 * 8 * 128 * 2


def test_layers_block_type_with_mamba_and_mlp_layers():
    config = dict(LLAMA, num_hidden_layers=4, layers_block_type=['mamba', 'attention', 'mlp', 'moe'])
    layout = kv_cache_layout(config)
    assert (layout['full_layers'], layout['recurrent_layers'], layout['no_cache_layers']) == (1, 1, 2)
