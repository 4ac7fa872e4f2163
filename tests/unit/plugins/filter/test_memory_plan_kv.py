# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan counts what vLLM allocates for one request read from config.json (SPEC sections 2-3):
full attention x context, sliding windows and attention chunks up to their span, the recurrent
state once per sequence; a given kv_bytes_per_token keeps the SPEC section 3 arithmetic.

Every expected figure is worked out here by hand in Decimal (the SPEC section 3 steps written out
for these inputs), not by calling the plan.
"""
import copy
import math
from decimal import Decimal, ROUND_FLOOR, localcontext
from fractions import Fraction

import pytest
from ansible.errors import AnsibleFilterError
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ansible_collections.sparkops.appliance.plugins.filter.memory_plan import memory_plan
from ansible_collections.sparkops.appliance.plugins.filter.memory_plan_table import memory_plan_table

GIB = Decimal(2 ** 30)
FP8 = Decimal('0.58')

# 40 GiB of weights, 4 GiB overhead, MTP off: fixed = 44 GiB. With kv_need < kv_target 20:
# wish = 64, cap = 121.69 - 26 = 95.69, gmu = floor(64 / 121.69 * 1000) / 1000 = 0.525
# (64 / 121.69 = 0.52592...), budget = 0.525 x 121.69 = 63.88725, kv_exp = 19.88725 GiB.
BASE = {
    'weight_bytes': 40 * 2 ** 30, 'ple_gib': 0, 'mtp_enabled': False, 'mtp_off_credit_gib': 0,
    'overhead_gib': 4, 'mtp_gib': 0, 'kv_cache_dtype': 'fp8', 'kv_target_gib': 20,
    'mem_total_gib': 121.69, 'host_reserve_gib': 26, 'max_num_seqs': 8,
}
KV_EXP = Decimal('19.88725')

# Gemma-3-27B-like (transformers Gemma3TextConfig pattern: every 6th layer full): 62 layers,
# 16 KV heads x head_dim 128, window 1024. Layers 6, 12, ..., 60 are full: 10 full, 52 sliding.
# One layer: 16 x (128 + 128) x 2 bytes = 8192 per token.
GEMMA3 = {'model_type': 'gemma3_text', 'num_hidden_layers': 62, 'num_attention_heads': 32,
          'num_key_value_heads': 16, 'head_dim': 128, 'hidden_size': 5376, 'sliding_window': 1024}
GEMMA3_FULL = 10 * 8192
GEMMA3_SLIDING = 52 * 8192
GEMMA3_WINDOW = 1024

# Llama-4-Scout-like: 48 layers, every 4th NoPE (full), the 36 others chunked (chunk 8192);
# 8 KV heads x 128: 4096 bytes per layer and token.
LLAMA4 = {'model_type': 'llama4_text', 'num_hidden_layers': 48, 'num_attention_heads': 40,
          'num_key_value_heads': 8, 'head_dim': 128, 'hidden_size': 5120, 'attention_chunk_size': 8192}
LLAMA4_FULL = 12 * 4096
LLAMA4_CHUNKED = 36 * 4096
LLAMA4_CHUNK = 8192

# Qwen3-Next-like: every 4th layer full (12, 2 KV heads x 256: 2048 bytes per layer and token),
# 36 gated-delta-net layers. One GDN layer's state, BF16 (no mamba_ssm_dtype):
# conv (4 - 1) x (128 x 16 x 2 + 128 x 32) x 2 = 49152, SSM 32 x 128 x 128 x 2 = 1048576.
QWEN3_NEXT = {'model_type': 'qwen3_next', 'num_hidden_layers': 48, 'full_attention_interval': 4,
              'num_attention_heads': 16, 'num_key_value_heads': 2, 'head_dim': 256, 'hidden_size': 2048,
              'linear_num_key_heads': 16, 'linear_num_value_heads': 32, 'linear_key_head_dim': 128,
              'linear_value_head_dim': 128, 'linear_conv_kernel_dim': 4}
QWEN3_NEXT_FULL = 12 * 2048
QWEN3_NEXT_STATE = 36 * (3 * (128 * 16 * 2 + 128 * 32) * 2 + 32 * 128 * 128 * 2)


def from_config(model_config, **changes):
    inputs = copy.deepcopy(BASE)
    inputs.update(changes)
    inputs['model_config'] = copy.deepcopy(model_config)
    return inputs


def floor(value):
    with localcontext() as ctx:
        ctx.prec = 60
        return int(value.to_integral_value(rounding=ROUND_FLOOR))


def div(num, den):
    with localcontext() as ctx:
        ctx.prec = 60
        return num / den


def refused(inputs):
    with pytest.raises(AnsibleFilterError) as info:
        memory_plan(inputs)
    return str(info.value)


# ---- sliding window (Gemma 3) -------------------------------------------------------------

def test_gemma3_like_above_the_window_counts_the_window_once():
    plan = memory_plan(from_config(GEMMA3, max_model_len=131072))
    # (81920 x 131072 + 425984 x 1024) x 0.58 = 11173625856 x 0.58 = 6480702996.48 bytes
    request = (Decimal(GEMMA3_FULL) * 131072 + Decimal(GEMMA3_SLIDING) * GEMMA3_WINDOW) * FP8
    assert request == Decimal('6480702996.48')
    assert plan['kv_request_bytes'] == float(request)
    assert plan['kv_need_gib'] == float(div(request, GIB)) == 6.035625  # 10.40625 GiB x 0.58
    assert plan['kv_bytes_per_token'] == plan['kv_full_bytes_per_token'] == 81920
    assert plan['kv_full_request_bytes'] == float(Decimal(81920) * 131072 * FP8)
    assert plan['kv_sliding'] == [{'window': 1024, 'layers': 52, 'bytes_per_token': 425984.0,
                                   'request_bytes': float(Decimal(425984 * 1024) * FP8)}]
    assert plan['kv_chunked'] == [] and plan['recurrent_state_bytes_per_sequence'] == 0
    assert plan['gmu'] == 0.525 and plan['kv_exp_gib'] == float(KV_EXP)
    assert plan['full_length_fit'] == floor(div(KV_EXP, Decimal('6.035625'))) == 3
    # Longest request: past the window only the full layers grow.
    fit = floor(div(KV_EXP * GIB - Decimal(425984 * 1024) * FP8, Decimal(81920) * FP8))
    assert fit > GEMMA3_WINDOW
    assert plan['max_model_len_fit'] == fit == 444099  # (21353772089.344 - 252800417.28) / 47513.6
    assert plan['warnings'][0].startswith('at most 3 of 8 sequences')


def test_gemma3_like_below_the_window_counts_every_token_of_every_layer():
    plan = memory_plan(from_config(GEMMA3, max_model_len=512, kv_cache_dtype='auto'))
    # (81920 + 425984) x 512 = 260046848 bytes = 0.2421875 GiB
    request = Decimal(GEMMA3_FULL + GEMMA3_SLIDING) * 512
    assert plan['kv_request_bytes'] == float(request) == 260046848
    assert plan['kv_need_gib'] == 0.2421875
    assert plan['kv_sliding'][0]['request_bytes'] == 425984 * 512
    assert plan['full_length_fit'] == floor(div(KV_EXP, Decimal('0.2421875'))) == 82
    assert plan['max_model_len_fit'] == floor(div(KV_EXP * GIB - Decimal(425984 * 1024), Decimal(81920))) == 255341
    assert plan['warnings'] == []


def test_the_longest_request_inside_the_window_grows_with_every_layer():
    # kv_target 0.4: wish 44.4 fits under the cap, gmu = floor(44.4 / 121.69 * 1000) / 1000
    # = 0.364 (0.36486...), kv_exp = 0.364 x 121.69 - 44 = 0.29516 GiB: less than the 1024
    # tokens of the window need (507904 x 1024 bytes = 0.484 GiB), so every layer grows.
    plan = memory_plan(from_config(GEMMA3, max_model_len=512, kv_cache_dtype='auto', kv_target_gib=0.4))
    assert plan['gmu'] == 0.364 and plan['kv_exp_gib'] == pytest.approx(0.29516, abs=1e-12)
    fit = floor(div(Decimal('0.29516') * GIB, Decimal(GEMMA3_FULL + GEMMA3_SLIDING)))
    assert 512 <= fit < GEMMA3_WINDOW
    assert plan['max_model_len_fit'] == fit == 623


def test_a_refused_length_offers_the_longest_that_fits_with_the_window():
    # 1M tokens BF16: (81920 x 1048576 + 425984 x 1024) bytes = 80.40625 GiB; wish 124.4 > cap,
    # (kv_target 60 keeps the cap binding at the offered length too)
    # gmu = floor(95.69 / 121.69 * 1000) / 1000 = 0.786, kv_exp = 0.786 x 121.69 - 44 = 51.64834.
    message = refused(from_config(GEMMA3, max_model_len=1048576, kv_cache_dtype='auto', kv_target_gib=60))
    assert 'kv_need 80.406 GiB' in message and 'kv_exp 51.648 GiB' in message
    fit = floor(div(Decimal('51.64834') * GIB - Decimal(425984 * 1024), Decimal(81920)))
    assert 'memory_plan_max_model_len) to at most %d;' % fit in message
    plan = memory_plan(from_config(GEMMA3, max_model_len=fit, kv_cache_dtype='auto', kv_target_gib=60, max_num_seqs=1))
    assert plan['full_length_fit'] == 1 and plan['max_model_len_fit'] == fit
    assert 'short of kv_need' in refused(from_config(GEMMA3, max_model_len=fit + 1, kv_cache_dtype='auto', kv_target_gib=60))


@pytest.mark.parametrize('model_config', [
    {'num_hidden_layers': 4, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'head_dim': 64,
     'hidden_size': 512, 'layer_types': ['sliding_attention', 'full_attention'] * 2},
    dict(GEMMA3, sliding_window=None),
], ids=['layer_types-without-window', 'gemma3-window-null'])
def test_a_sliding_layer_without_a_window_is_refused_naming_the_field_and_the_variable(model_config):
    message = refused(from_config(model_config, max_model_len=4096))
    assert "'sliding_window' is not in it" in message and 'memory_plan_kv_bytes_per_token' in message


# ---- chunked local attention (Llama 4) ----------------------------------------------------

def test_llama4_like_counts_one_chunk_of_the_chunked_layers():
    plan = memory_plan(from_config(LLAMA4, max_model_len=131072))
    # (49152 x 131072 + 147456 x 8192) x 0.58 = 7650410496 x 0.58 bytes = 7.125 x 0.58 GiB
    request = (Decimal(LLAMA4_FULL) * 131072 + Decimal(LLAMA4_CHUNKED) * LLAMA4_CHUNK) * FP8
    assert plan['kv_request_bytes'] == float(request)
    assert plan['kv_need_gib'] == float(Decimal('7.125') * FP8) == 4.1325
    assert plan['kv_chunked'] == [{'chunk': 8192, 'layers': 36, 'bytes_per_token': 147456.0,
                                   'request_bytes': float(Decimal(147456 * 8192) * FP8)}]
    assert plan['kv_sliding'] == []
    assert plan['full_length_fit'] == floor(div(KV_EXP, Decimal('4.1325'))) == 4
    assert plan['max_model_len_fit'] == floor(div(KV_EXP * GIB - Decimal(147456 * 8192) * FP8,
                                                  Decimal(49152) * FP8))
    assert plan['warnings'][0].startswith('at most 4 of 8 sequences')


def test_llama4_like_below_the_chunk():
    plan = memory_plan(from_config(LLAMA4, max_model_len=4096, kv_cache_dtype='auto'))
    assert plan['kv_request_bytes'] == (49152 + 147456) * 4096 == 805306368
    assert plan['kv_need_gib'] == 0.75
    assert plan['full_length_fit'] == floor(div(KV_EXP, Decimal('0.75'))) == 26


# ---- recurrent state (Qwen3-Next gated delta net) -----------------------------------------

def test_qwen3_next_like_counts_the_state_once_per_sequence_outside_kv_mult():
    assert QWEN3_NEXT_STATE == 39518208
    plan = memory_plan(from_config(QWEN3_NEXT, max_model_len=32768, max_num_seqs=64))
    # 24576 x 32768 x 0.58 (0.435 GiB) + 39518208 (the state, BF16, not x 0.58)
    request = Decimal(QWEN3_NEXT_FULL) * 32768 * FP8 + QWEN3_NEXT_STATE
    assert plan['kv_request_bytes'] == float(request)
    need = div(request, GIB)
    assert plan['kv_need_gib'] == float(need)
    assert plan['recurrent_state_bytes_per_sequence'] == QWEN3_NEXT_STATE
    assert plan['recurrent_kind'] == 'gated_delta_net'
    # Concurrency: 42 full-length requests with their state (45 without it).
    assert plan['full_length_fit'] == floor(div(KV_EXP, need)) == 42
    assert floor(div(KV_EXP, Decimal('0.435'))) == 45
    assert plan['warnings'][0].startswith('at most 42 of 64 sequences')
    assert 'recurrent state of 0.037 GiB' in plan['warnings'][0]
    assert len(plan['warnings']) == 1
    assert plan['max_model_len_fit'] == floor(div(KV_EXP * GIB - QWEN3_NEXT_STATE, Decimal(QWEN3_NEXT_FULL) * FP8))


def test_more_sequences_than_states_fit_is_a_warning():
    # 1024 x 39518208 bytes = 37.7 GiB of state > kv_exp 19.88725 GiB: floor(19.88725 GiB / state) run.
    plan = memory_plan(from_config(QWEN3_NEXT, max_model_len=32768, max_num_seqs=1024))
    alone = floor(div(KV_EXP * GIB, Decimal(QWEN3_NEXT_STATE)))
    assert alone == 540
    assert any(w.startswith('the recurrent state alone does not fit max_num_seqs sequences') and
               'at most 540 sequences of any length' in w for w in plan['warnings'])


def test_a_recurrent_state_that_is_not_derived_is_refused():
    cfg = dict(QWEN3_NEXT)
    del cfg['linear_conv_kernel_dim']
    message = refused(from_config(cfg, max_model_len=4096))
    assert 'linear_conv_kernel_dim' in message and 'memory_plan_kv_bytes_per_token' in message
    jamba = {'num_hidden_layers': 8, 'attn_layer_period': 4, 'attn_layer_offset': 2, 'num_attention_heads': 8,
             'num_key_value_heads': 2, 'hidden_size': 1024}
    message = refused(from_config(jamba, max_model_len=4096))
    assert 'recurrent state per sequence of its 6 mamba layers' in message
    assert 'memory_plan_kv_bytes_per_token' in message


def test_no_length_helps_when_one_state_alone_exceeds_the_room():
    # overhead 4.03: fixed 44.03; reserve 77.6: cap 44.09, gmu = floor(44.09 / 121.69 * 1000) / 1000
    # = 0.362 (0.36231...), kv_exp = 0.362 x 121.69 - 44.03 = 0.02178 GiB < one state (0.0368 GiB).
    message = refused(from_config(QWEN3_NEXT, max_model_len=1024, overhead_gib=4.03, host_reserve_gib=77.6))
    assert 'kv_exp 0.022 GiB' in message and 'cap binds' in message
    assert 'no length helps: the recurrent state of one sequence (0.037 GiB) alone exceeds kv_exp' in message
    assert 'memory_plan_host_reserve_gib' in message


def test_a_config_without_any_cache_is_refused():
    cfg = {'num_hidden_layers': 2, 'num_attention_heads': 4, 'hidden_size': 256, 'layer_types': ['mlp', 'moe']}
    message = refused(from_config(cfg, max_model_len=4096))
    assert 'no layer that holds a KV cache' in message and 'memory_plan_kv_bytes_per_token' in message


def test_a_model_without_full_attention_fits_any_length():
    # Every layer sliding: a request stops growing at the window.
    cfg = {'num_hidden_layers': 2, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 64,
           'hidden_size': 256, 'sliding_window': 4096, 'layer_types': ['sliding_attention'] * 2}
    plan = memory_plan(from_config(cfg, max_model_len=131072, kv_cache_dtype='auto'))
    assert plan['kv_request_bytes'] == 2 * 2 * 128 * 2 * 4096
    assert plan['max_model_len_fit'] is None


# ---- the given figure: SPEC section 3 unchanged -------------------------------------------

GOLDEN = {
    'weight_bytes': 101382703022, 'ple_gib': 22.67, 'mtp_enabled': True, 'mtp_off_credit_gib': 1.2,
    'overhead_gib': 5.60, 'mtp_gib': 1.49, 'max_model_len': 262144, 'kv_bytes_per_token': 29482,
    'kv_cache_dtype': 'fp8', 'kv_target_gib': 20, 'mem_total_gib': 121.69, 'host_reserve_gib': 26,
    'max_num_seqs': 8,
}


def test_the_spec_golden_case_is_unchanged_and_a_config_beside_it_is_not_read():
    plan = memory_plan(dict(GOLDEN))
    beside = memory_plan(dict(GOLDEN, model_config=QWEN3_NEXT))
    assert beside == plan
    request = Decimal(262144 * 29482) * FP8  # 4482547056.64 bytes, ~4.17 GiB
    assert plan['kv_request_bytes'] == plan['kv_full_request_bytes'] == float(request)
    assert plan['kv_need_gib'] == float(div(request, GIB))
    assert plan['kv_sliding'] == [] and plan['kv_chunked'] == []
    assert plan['recurrent_state_bytes_per_sequence'] == 0 and plan['recurrent_kind'] is None
    # SPEC section 3: fixed 78.84, wish 98.84, cap 95.69, gmu 0.786, budget 0.786 x 121.69 = 95.64834,
    # kv_exp = 95.64834 - 78.84 = 16.80834, 4 full-length requests, the longest 16.80834 GiB / 17099.56 B.
    assert plan['gmu'] == 0.786 and plan['fixed_gib'] == pytest.approx(78.84, abs=1e-9)
    assert plan['kv_exp_gib'] == pytest.approx(16.80834, abs=1e-9)
    assert plan['full_length_fit'] == 4 and plan['squeezed'] is True
    assert plan['max_model_len_fit'] == floor(div(Decimal('16.80834') * GIB, Decimal(29482) * FP8))
    assert len(plan['warnings']) == 1 and plan['warnings'][0].startswith('at most 4 of 8 sequences')
    assert 'recurrent' not in plan['warnings'][0]


# ---- the table ----------------------------------------------------------------------------

def rows(lines):
    return dict((line.split('|')[0].strip(), [c.strip() for c in line.split('|')[1:]])
                for line in lines[2:] if '|' in line)


def test_the_table_breaks_a_request_down_when_it_is_not_just_full_attention():
    gemma = memory_plan(from_config(GEMMA3, max_model_len=131072))
    qwen = memory_plan(from_config(QWEN3_NEXT, max_model_len=32768, max_num_seqs=64))
    golden = memory_plan(dict(GOLDEN))
    table = rows(memory_plan_table({'a-gemma': gemma, 'b-golden': golden, 'c-qwen': qwen}))
    assert table['of which full attention GiB'] == [
        '%.3f' % (81920 * 131072 * 0.58 / 2 ** 30), '%.3f' % (262144 * 29482 * 0.58 / 2 ** 30),
        '%.3f' % (24576 * 32768 * 0.58 / 2 ** 30)]
    sliding = '%.3f (52 x window 1024)' % (425984 * 1024 * 0.58 / 2 ** 30)
    assert table['of which sliding window GiB'] == [sliding, '-', '-']
    assert table['of which chunked local GiB'] == ['-', '-', '-']
    assert table['of which recurrent GiB/seq'] == ['-', '-', '%.3f (gated_delta_net)' % (39518208 / 2 ** 30)]
    labels = list(table)
    assert labels.index('kv_need GiB (1 max-len req)') + 1 == labels.index('of which full attention GiB')
    # Full attention alone: no breakdown rows.
    assert not any('of which' in line for line in memory_plan_table(golden))


# ---- the longest request, against an exact oracle -----------------------------------------

GDN = {'linear_num_key_heads': 2, 'linear_num_value_heads': 4, 'linear_key_head_dim': 32,
       'linear_value_head_dim': 32, 'linear_conv_kernel_dim': 4}
GDN_STATE = 3 * (32 * 2 * 2 + 32 * 4) * 2 + 4 * 32 * 32 * 2  # conv + SSM of one layer, BF16
MULT = {'auto': Fraction(1), 'fp8': Fraction('0.58')}


@st.composite
def layered(draw):
    kinds = draw(st.lists(st.sampled_from(['full_attention', 'sliding_attention', 'chunked_attention',
                                           'linear_attention']), min_size=1, max_size=8))
    heads, head = draw(st.integers(1, 8)), draw(st.sampled_from([32, 64, 128]))
    cfg = dict(GDN, num_hidden_layers=len(kinds), layer_types=kinds, num_attention_heads=heads,
               num_key_value_heads=heads, head_dim=head, hidden_size=heads * head,
               sliding_window=draw(st.integers(1, 5000)), attention_chunk_size=draw(st.integers(1, 9000)))
    inputs = {'weight_bytes': 0, 'ple_gib': 0, 'mtp_enabled': False, 'mtp_off_credit_gib': 0, 'mtp_gib': 0,
              'overhead_gib': draw(st.integers(0, 200)) / 100, 'kv_cache_dtype': draw(st.sampled_from(sorted(MULT))),
              'kv_target_gib': draw(st.integers(0, 300)) / 100, 'mem_total_gib': 16,
              'host_reserve_gib': draw(st.integers(0, 1500)) / 100, 'max_num_seqs': draw(st.integers(1, 64)),
              'max_model_len': draw(st.integers(1, 300000)), 'model_config': cfg}
    return inputs


def oracle_request(inputs, length):
    """Bytes of one request of ``length`` tokens, layer by layer, in exact rationals."""
    cfg, mult = inputs['model_config'], MULT[inputs['kv_cache_dtype']]
    per_layer = cfg['num_key_value_heads'] * 2 * cfg['head_dim'] * 2
    span = {'full_attention': length, 'sliding_attention': min(length, cfg['sliding_window']),
            'chunked_attention': min(length, cfg['attention_chunk_size'])}
    total = Fraction(0)
    for kind in cfg['layer_types']:
        total += GDN_STATE if kind == 'linear_attention' else per_layer * span[kind] * mult
    return total


@settings(max_examples=150, deadline=None)
@given(layered())
def test_the_longest_request_and_the_concurrency_are_exact(inputs):
    try:
        plan = memory_plan(inputs)
    except AnsibleFilterError as exc:
        assume('short of kv_need' not in str(exc))
        raise
    room = (Fraction(repr(plan['gmu'])) * 16 - Fraction(repr(inputs['overhead_gib']))) * 2 ** 30
    need = oracle_request(inputs, inputs['max_model_len'])
    assert plan['kv_request_bytes'] == float(need)
    assert plan['full_length_fit'] == math.floor(room / need)
    fit = plan['max_model_len_fit']
    if fit is None:
        assert 'full_attention' not in inputs['model_config']['layer_types']
        assert oracle_request(inputs, 10 ** 9) <= room
    else:
        assert oracle_request(inputs, fit) <= room < oracle_request(inputs, fit + 1)
