"""The memory_plan filter: SPEC section 3 golden case, refusals, warning, TP."""
import copy
import math

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.memory_plan import (
    FilterModule,
    memory_plan,
)

GIB = 2 ** 30

# SPEC section 3, the golden case (inventories/example/group_vars/sparks/main.yml carries it too).
GOLDEN = {
    'weight_bytes': 101382703022,  # (71.75 + 22.67) GiB
    'ple_gib': 22.67,
    'mtp_enabled': True,
    'mtp_off_credit_gib': 1.2,
    'overhead_gib': 5.60,
    'mtp_gib': 1.49,
    'max_model_len': 262144,
    'kv_bytes_per_token': 29482,
    'kv_cache_dtype': 'fp8',
    'kv_target_gib': 20,
    'mem_total_gib': 121.69,
    'host_reserve_gib': 26,
    'max_num_seqs': 8,
}


def golden(**changes):
    inputs = copy.deepcopy(GOLDEN)
    inputs.update(changes)
    return inputs


def refused(inputs):
    with pytest.raises(AnsibleFilterError) as info:
        memory_plan(inputs)
    return str(info.value)


def test_filter_is_registered_under_its_name():
    assert FilterModule().filters()['memory_plan'] is memory_plan


def test_golden_case_of_the_spec():
    plan = memory_plan(golden())
    assert plan['gmu'] == 0.786
    assert plan['weights_gib'] == pytest.approx(71.75, abs=1e-6)
    assert plan['fixed_gib'] == pytest.approx(78.84, abs=1e-6)
    assert plan['kv_need_gib'] == pytest.approx(4.17, abs=0.005)
    assert plan['wish_gib'] == pytest.approx(98.84, abs=1e-6)
    assert plan['cap_gib'] == pytest.approx(95.69, abs=1e-9)
    assert plan['budget_gib'] == pytest.approx(95.65, abs=0.005)
    assert plan['kv_exp_gib'] == pytest.approx(16.81, abs=0.005)
    assert plan['full_length_fit'] == 4
    assert plan['squeezed'] is True
    assert plan['docker_memory_gib'] == pytest.approx(100.65, abs=0.005)
    assert plan['kv_cache_memory_bytes'] == math.floor(plan['kv_exp_gib'] * GIB)
    assert plan['gmu_step_gib'] * 1024 == pytest.approx(124.6, abs=0.05)  # ~124.6 MiB a step
    assert plan['warnings'] == [w for w in plan['warnings'] if 'at most 4 of 8 sequences' in w]
    assert len(plan['warnings']) == 1


def test_golden_case_budget_is_recomputed_from_the_rounded_gmu():
    plan = memory_plan(golden())
    assert plan['budget_gib'] == pytest.approx(0.786 * 121.69, abs=1e-9)
    assert plan['budget_gib'] < plan['cap_gib']
    assert plan['kv_exp_gib'] == pytest.approx(plan['budget_gib'] - plan['fixed_gib'], abs=1e-9)


def test_mtp_off_takes_the_credit_and_drops_the_reserve():
    on = memory_plan(golden())
    off = memory_plan(golden(mtp_enabled=False))
    assert off['weights_gib'] == pytest.approx(on['weights_gib'] - 1.2, abs=1e-9)
    assert off['fixed_gib'] == pytest.approx(on['fixed_gib'] - 1.2 - 1.49, abs=1e-9)


def test_mtp_off_credit_never_exceeds_the_weights():
    plan = memory_plan(golden(mtp_enabled=False, weight_bytes=int(23.67 * GIB),
                              mtp_off_credit_gib=5, max_model_len=1024))
    assert plan['weights_gib'] == 0


def test_kv_cache_dtype_factors_and_explicit_mult():
    bf16 = memory_plan(golden(kv_cache_dtype='bf16', max_num_seqs=1))
    auto = memory_plan(golden(kv_cache_dtype='auto', max_num_seqs=1))
    fp8 = memory_plan(golden(kv_cache_dtype='fp8_e5m2'))
    mult = memory_plan(golden(kv_cache_dtype='bf16', kv_mult=0.5, max_num_seqs=1))
    assert bf16['kv_need_gib'] == auto['kv_need_gib'] == pytest.approx(262144 * 29482 / GIB)
    assert fp8['kv_need_gib'] == pytest.approx(bf16['kv_need_gib'] * 0.58)
    assert mult['kv_need_gib'] == pytest.approx(bf16['kv_need_gib'] * 0.5)
    assert mult['kv_mult'] == 0.5


def test_no_warning_when_every_sequence_fits_at_max_length():
    plan = memory_plan(golden(max_num_seqs=4))
    assert plan['full_length_fit'] == 4
    assert plan['warnings'] == []


def test_not_squeezed_when_the_wish_fits_under_the_cap():
    plan = memory_plan(golden(host_reserve_gib=10))
    assert plan['squeezed'] is False
    assert plan['budget_gib'] <= plan['wish_gib']
    assert plan['wish_gib'] - plan['budget_gib'] < plan['gmu_step_gib']


def test_numeric_strings_are_numbers():
    as_text = golden(mem_total_gib='121.69', max_model_len='262144', weight_bytes='101382703022')
    assert memory_plan(as_text) == memory_plan(golden())


def test_the_exact_ratio_is_not_floored_by_float_error():
    # cap / MemTotal is exactly 0.786; the binary-float formula gives 0.785.
    inputs = golden(mem_total_gib=100, host_reserve_gib=21.4, weight_bytes=60 * GIB,
                    ple_gib=0)
    naive = math.floor((100 - 21.4) / 100 * 1000) / 1000
    assert naive == 0.785  # the trap this test is about
    assert memory_plan(inputs)['gmu'] == 0.786


def test_ple_bytes_instead_of_ple_gib():
    inputs = golden(ple_bytes=int(22.67 * GIB))
    del inputs['ple_gib']
    assert memory_plan(inputs)['gmu'] == 0.786
    assert memory_plan(inputs)['ple_gib'] == pytest.approx(22.67, abs=1e-9)
    assert 'only one' in refused(golden(ple_bytes=1))


# ---- refusals ---------------------------------------------------------------------------

REQUIRED = sorted(k for k in GOLDEN)


@pytest.mark.parametrize('name', REQUIRED)
def test_missing_input_is_refused_naming_it_and_its_variable(name):
    inputs = golden()
    del inputs[name]
    message = refused(inputs)
    assert "'%s'" % name in message and 'memory_plan_' + name in message and 'missing' in message


@pytest.mark.parametrize('name', REQUIRED)
def test_null_counts_as_missing(name):
    assert 'missing' in refused(golden(**{name: None}))


NUMERIC = [k for k in REQUIRED if k not in ('mtp_enabled', 'kv_cache_dtype')]


@pytest.mark.parametrize('name', NUMERIC)
def test_negative_input_is_refused(name):
    message = refused(golden(**{name: -1}))
    assert 'memory_plan_' + name in message and 'negative' in message


@pytest.mark.parametrize('name', NUMERIC)
@pytest.mark.parametrize('value', ['abc', 'true', [1], float('nan'), float('inf'), True])
def test_non_numeric_input_is_refused(name, value):
    message = refused(golden(**{name: value}))
    assert 'memory_plan_' + name in message


@pytest.mark.parametrize('name', ['max_model_len', 'max_num_seqs', 'weight_bytes'])
def test_fractional_count_is_refused(name):
    assert 'whole number' in refused(golden(**{name: 2.5}))


@pytest.mark.parametrize('value', ['true', 'yes', 'False', 'on', 1, 'x'])
def test_boolean_as_string_is_refused(value):
    message = refused(golden(mtp_enabled=value))
    assert 'memory_plan_mtp_enabled' in message


def test_boolean_as_string_names_the_cause():
    assert 'boolean-as-string' in refused(golden(mtp_enabled='true'))


@pytest.mark.parametrize('dtype', ['int8', 'fp16', '', 8])
def test_unknown_cache_dtype_is_refused(dtype):
    message = refused(golden(kv_cache_dtype=dtype))
    assert 'memory_plan_kv_cache_dtype' in message and 'fp8' in message


def test_unknown_input_name_is_refused():
    assert 'kv_multt' in refused(golden(kv_multt=0.5))


def test_input_must_be_a_mapping():
    assert 'mapping' in refused([1, 2])


@pytest.mark.parametrize('reserve', [121.69, 130])
def test_host_reserve_at_or_above_memtotal_is_refused(reserve):
    message = refused(golden(host_reserve_gib=reserve))
    assert 'memory_plan_host_reserve_gib' in message and 'MemTotal' in message


def test_ple_larger_than_the_checkpoint_is_refused():
    assert 'memory_plan_ple_gib' in refused(golden(ple_gib=200))


def test_not_even_one_max_length_request_fits_when_the_cap_binds():
    # bf16 at 1M tokens: kv_need ~28.8 GiB > the ~16.8 GiB the cap leaves.
    inputs = golden(max_model_len=1048576, kv_cache_dtype='bf16')
    message = refused(inputs)
    assert 'short of kv_need' in message and 'refuse to start' in message
    assert 'memory_plan_max_model_len' in message and 'memory_plan_host_reserve_gib' in message
    # The length the message offers does fit.
    offered = int(message.split('to at most ')[1].split(';')[0].split()[0])
    plan = memory_plan(golden(max_model_len=offered, kv_cache_dtype='bf16', max_num_seqs=1))
    assert plan['full_length_fit'] == 1
    assert plan['max_model_len_fit'] >= offered
    assert 'short' in refused(golden(max_model_len=offered + 1, kv_cache_dtype='bf16'))


def test_fixed_costs_above_the_cap_are_refused():
    message = refused(golden(host_reserve_gib=60))
    assert 'nothing is left for KV' in message


def test_rounding_down_below_one_request_names_the_kv_target():
    # Target 0: wish = fixed + kv_need fits under the cap, the round-down eats the KV.
    message = refused(golden(kv_target_gib=0, host_reserve_gib=10))
    assert 'memory_plan_kv_target_gib' in message and 'did not bind' in message
    offered = float(message.split('to at least ')[1].split()[0])
    plan = memory_plan(golden(kv_target_gib=offered, host_reserve_gib=10, max_num_seqs=1))
    assert plan['full_length_fit'] >= 1


# ---- tensor parallel --------------------------------------------------------------------

def test_tensor_parallel_splits_weights_and_kv_and_adds_a_comm_reserve():
    one = memory_plan(golden(host_reserve_gib=10))
    two = memory_plan(golden(host_reserve_gib=10, tensor_parallel_size=2))
    assert two['weights_gib'] == pytest.approx(one['weights_gib'] / 2, abs=1e-9)
    assert two['comm_reserve_gib'] == 2.0 and one['comm_reserve_gib'] == 0.0
    assert two['fixed_gib'] == pytest.approx(one['weights_gib'] / 2 + 5.6 + 1.49 + 2.0, abs=1e-9)
    assert two['kv_need_gib'] == pytest.approx(one['kv_need_gib'] / 2, abs=1e-9)
    assert two['gmu'] < one['gmu']


def test_tensor_parallel_comm_reserve_and_unsplit_kv_are_knobs():
    two = memory_plan(golden(tensor_parallel_size=2, tp_comm_reserve_gib=0.5,
                             kv_split_across_tp=False))
    assert two['comm_reserve_gib'] == 0.5
    assert two['kv_need_gib'] == pytest.approx(memory_plan(golden())['kv_need_gib'], abs=1e-9)


def test_kv_from_the_model_config_when_not_given():
    config = {'num_hidden_layers': 2, 'hidden_size': 128, 'num_attention_heads': 4,
              'num_key_value_heads': 4, 'head_dim': 32}
    inputs = golden(model_config=config)
    del inputs['kv_bytes_per_token']
    plan = memory_plan(inputs)
    assert plan['kv_bytes_per_token'] == 2 * 2 * 4 * 32 * 2
    assert plan['kv_bytes_per_token_source'] == 'config.json'
    assert 'model_config' not in plan['inputs']
    # A given number wins over the config.
    assert memory_plan(golden(model_config=config))['kv_bytes_per_token'] == 29482


def test_a_bad_model_config_names_the_fallback_variable():
    inputs = golden(model_config={'hidden_size': 128})
    del inputs['kv_bytes_per_token']
    message = refused(inputs)
    assert 'num_hidden_layers' in message and 'memory_plan_kv_bytes_per_token' in message


def test_inputs_are_echoed_with_defaults():
    plan = memory_plan(golden(max_num_batched_tokens=8192))
    assert plan['inputs']['tensor_parallel_size'] == 1
    assert plan['inputs']['docker_headroom_gib'] == 5.0
    assert plan['inputs']['max_num_batched_tokens'] == 8192
    assert plan['docker_memory_gib'] == pytest.approx(plan['budget_gib'] + 5, abs=1e-9)
