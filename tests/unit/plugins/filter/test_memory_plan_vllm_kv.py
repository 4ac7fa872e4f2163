"""The memory plan given vLLM's own KV cache spec (kv_layout_measured, what the serve role reads from
the runtime image with roles/serve/files/vllm_kv_spec.py): it wins over the config.json reading, the
plan says which it used (kv_source) and keeps both, the table shows both; a given
kv_bytes_per_token still wins over both (the SPEC section 3 golden case is unchanged)."""
import copy
import json
import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.memory_plan import memory_plan
from ansible_collections.sparkops.appliance.plugins.filter.memory_plan_table import memory_plan_table

GIB = 2 ** 30
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'module_utils', 'kv_fixtures')
with open(os.path.join(FIXTURES, 'vllm_kv_spec.json')) as _handle:
    VLLM = json.load(_handle)
with open(os.path.join(FIXTURES, 'gemma-4-26B-A4B', 'config.json')) as _handle:
    GEMMA4 = json.load(_handle)

# The SPEC section 3 golden case's knobs (tests/unit/plugins/filter/test_memory_plan.py), with the KV
# read from a config.json: Llama 3.1 8B (32 layers, 8 KV heads of 128: 131072 B/token BF16).
LLAMA = {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'num_hidden_layers': 32,
         'hidden_size': 4096, 'num_attention_heads': 32, 'num_key_value_heads': 8, 'head_dim': 128}
INPUTS = {'weight_bytes': 101382703022, 'ple_gib': 22.67, 'mtp_enabled': True, 'mtp_off_credit_gib': 1.2,
          'overhead_gib': 5.60, 'mtp_gib': 1.49, 'max_model_len': 32768, 'kv_cache_dtype': 'fp8',
          'kv_target_gib': 20, 'mem_total_gib': 121.69, 'host_reserve_gib': 26, 'max_num_seqs': 8,
          'model_config': LLAMA}


def vllm_spec(name, tp, **extra):
    """An entry of the fixtures' table of vLLM's figures, as vllm_kv_spec.py prints one spec."""
    spec = {k: v for k, v in VLLM[name]['tp%d' % tp].items() if k != 'layers'}
    spec.update(tensor_parallel_size=tp, vllm_version='0.32.0', image='sparkops/vllm:test', **extra)
    return spec


def inputs(**changes):
    out = copy.deepcopy(INPUTS)
    out.update(changes)
    return out


def rows(lines):
    return dict((line.split('|')[0].strip(), [c.strip() for c in line.split('|')[1:]])
                for line in lines[2:] if '|' in line)


def test_vllms_figure_that_differs_is_the_one_the_plan_uses_and_both_are_shown():
    by_config = memory_plan(inputs())
    half = dict(vllm_spec('llama-3.1-8b', 1), full_bytes_per_token=65536.0)
    plan = memory_plan(inputs(kv_layout_measured=half))
    assert by_config['kv_source'] == 'config' and by_config['kv_vllm'] is None
    assert plan['kv_source'] == 'vllm' and plan['kv_bytes_per_token_source'] == 'vllm'
    assert plan['kv_vllm_differs'] is True
    # the plan's KV figures are vLLM's: half the bytes per token, half the request
    assert plan['kv_bytes_per_token'] == 65536.0 and by_config['kv_bytes_per_token'] == 131072.0
    assert plan['kv_need_gib'] == pytest.approx(by_config['kv_need_gib'] / 2, rel=1e-12)
    assert plan['kv_need_gib'] == pytest.approx(32768 * 65536 * 0.58 / GIB, rel=1e-12)
    assert plan['full_length_fit'] > by_config['full_length_fit']
    # both readings are kept, each with the request it gives
    assert plan['kv_config']['full_bytes_per_token'] == 131072.0
    assert plan['kv_config']['kv_need_gib'] == pytest.approx(by_config['kv_need_gib'], rel=1e-12)
    assert plan['kv_vllm']['full_bytes_per_token'] == 65536.0
    assert plan['kv_vllm']['image'] == 'sparkops/vllm:test' and plan['kv_vllm']['vllm_version'] == '0.32.0'
    assert 'kv_layout_measured' not in plan['inputs'] and 'model_config' not in plan['inputs']
    table = rows(memory_plan_table({'spark-01': plan, 'spark-02': by_config}))
    assert table['KV figure used'] == ['vllm (config.json differs)', 'config']
    assert table['by config.json'][0] == '131072.0 B/token, kv_need %.3f GiB' % by_config['kv_need_gib']
    assert table["by the image's vLLM"] == ['65536.0 B/token, kv_need %.3f GiB (vLLM 0.32.0)' % plan['kv_need_gib'], '-']
    assert table['KV bytes/token (node, bf16)'][0] == '65536.0 (vllm)'


def test_vllms_figure_that_agrees_changes_nothing_but_the_source():
    by_config = memory_plan(inputs())
    plan = memory_plan(inputs(kv_layout_measured=vllm_spec('llama-3.1-8b', 1)))
    assert plan['kv_source'] == 'vllm' and plan['kv_vllm_differs'] is False
    for key in ('gmu', 'kv_need_gib', 'kv_exp_gib', 'kv_cache_memory_bytes', 'docker_memory_bytes', 'budget_bytes'):
        assert plan[key] == by_config[key], key
    assert rows(memory_plan_table(plan))['KV figure used'] == ['vllm (config.json agrees)']
    # a plan without vLLM's figure has no such rows
    assert not any(line.startswith('KV figure used') for line in memory_plan_table(by_config))


def test_sliding_windows_and_tp_come_from_vllms_spec_per_rank():
    """Gemma 4 26B at TP 2: vLLM's per-rank figures (25 sliding layers of window 1024, 5 full) are the
    plan's per node, as config.json's reading at the same TP gives them."""
    tp2 = inputs(model_config=GEMMA4, tensor_parallel_size=2, max_model_len=131072)
    by_config = memory_plan(tp2)
    plan = memory_plan(dict(tp2, kv_layout_measured=vllm_spec('gemma-4-26B-A4B', 2)))
    assert plan['kv_vllm_differs'] is False and plan['kv_need_gib'] == by_config['kv_need_gib']
    assert plan['kv_full_bytes_per_token'] == 10240.0
    assert plan['kv_sliding'] == [{'window': 1024, 'layers': 25, 'bytes_per_token': 102400.0,
                                   'request_bytes': 60817408.0}]  # 102400 x 1024 x 0.58, exact
    # the TP-1 spec is not the plan's per-node figure at TP 2
    message = refused(dict(tp2, kv_layout_measured=vllm_spec('gemma-4-26B-A4B', 1)))
    assert 'measured at tensor_parallel_size 1, the plan is for 2' in message
    assert 'memory_plan_kv_bytes_per_token' in message


def test_a_given_kv_bytes_per_token_wins_over_vllms_figure_the_golden_case_unchanged():
    golden = inputs(kv_bytes_per_token=29482, max_model_len=262144)
    del golden['model_config']
    plan = memory_plan(golden)
    beside = memory_plan(dict(golden, kv_layout_measured=vllm_spec('llama-3.1-8b', 1)))
    assert beside == plan
    assert plan['gmu'] == 0.786 and plan['kv_source'] == 'given' and plan['kv_vllm'] is None


def test_a_config_the_reading_refuses_does_not_stop_a_plan_vllm_measured():
    unread = dict(LLAMA, index_topk=2048)
    with pytest.raises(AnsibleFilterError, match='index_topk'):
        memory_plan(inputs(model_config=unread))
    plan = memory_plan(inputs(model_config=unread, kv_layout_measured=vllm_spec('llama-3.1-8b', 1)))
    assert plan['kv_source'] == 'vllm' and plan['kv_config'] is None
    assert 'index_topk' in plan['kv_config_error'] and plan['kv_vllm_differs'] is None
    assert rows(memory_plan_table(plan))['by config.json'] == ['refused']


def refused(raw):
    with pytest.raises(AnsibleFilterError) as info:
        memory_plan(raw)
    return str(info.value)


@pytest.mark.parametrize('spec, words', [
    ({'sliding': []}, "has no 'full_bytes_per_token'"),
    ({'full_bytes_per_token': 'lots'}, "full_bytes_per_token is 'lots', not a number"),
    ({'full_bytes_per_token': -1}, 'full_bytes_per_token is -1, expected >= 0'),
    ({'full_bytes_per_token': 1, 'sliding': [{'window': 1024, 'layers': 2}]}, 'sliding[0] is'),
    ({'full_bytes_per_token': 1, 'chunked': [{'chunk': 0.5, 'layers': 1, 'bytes_per_token': 1}]},
     'chunked[0].chunk is 0.5, not a whole number'),
    ({'full_bytes_per_token': 1, 'other': ['CrossAttentionSpec']}, 'kinds the plan does not count (CrossAttentionSpec)'),
    ('{"full_bytes_per_token": 1}', "not a mapping"),
])
def test_a_measured_layout_the_plan_cannot_use_is_refused_naming_the_bypass(spec, words):
    message = refused(inputs(kv_layout_measured=spec))
    assert words in message, message
    assert "input 'kv_layout_measured'" in message and 'memory_plan_kv_bytes_per_token' in message
