"""Property tests of the memory plan (hypothesis), against an exact Fraction oracle.

Floats enter the plan through their shortest repr (121.69 means the decimal 121.69); the
oracle below does the SPEC section 3 arithmetic in exact rationals from the same reprs.
"""
import math
from decimal import Decimal
from fractions import Fraction

import pytest
from ansible.errors import AnsibleFilterError
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ansible_collections.sparkops.appliance.plugins.filter.memory_plan import memory_plan

GIB = 2 ** 30
MULT = {'auto': Fraction(1), 'bf16': Fraction(1), 'fp8': Fraction('0.58'),
        'fp8_e4m3': Fraction('0.58'), 'fp8_e5m2': Fraction('0.58')}

SETTINGS = settings(max_examples=200, deadline=None)


def dec2(low, high):
    """A float with at most 2 decimals in [low, high] (its repr is that decimal)."""
    return st.integers(round(low * 100), round(high * 100)).map(lambda n: n / 100)


def exact(x):
    return Fraction(repr(x)) if isinstance(x, float) else Fraction(x)


@st.composite
def plan_inputs(draw):
    mem = draw(dec2(8, 256))
    weights_gib = draw(dec2(0, mem))
    return {
        'mem_total_gib': mem,
        'host_reserve_gib': draw(dec2(0, mem * 0.6)),
        'weight_bytes': int(weights_gib * GIB) + draw(st.integers(0, 4096)),
        'ple_gib': draw(dec2(0, weights_gib / 2)),
        'mtp_enabled': draw(st.booleans()),
        'mtp_off_credit_gib': draw(dec2(0, 5)),
        'overhead_gib': draw(dec2(0, 10)),
        'mtp_gib': draw(dec2(0, 3)),
        'max_model_len': draw(st.integers(1, 1 << 20)),
        'kv_bytes_per_token': draw(st.integers(1, 200000)),
        'kv_cache_dtype': draw(st.sampled_from(sorted(MULT))),
        'kv_target_gib': draw(dec2(0, 64)),
        'max_num_seqs': draw(st.integers(1, 256)),
        'tensor_parallel_size': draw(st.integers(1, 4)),
    }


def oracle(i):
    """SPEC section 3 in exact rationals (per node for TP > 1)."""
    tp = i.get('tensor_parallel_size', 1)
    w = Fraction(i['weight_bytes'], GIB) - exact(i['ple_gib'])
    if w < 0:
        return None
    if not i['mtp_enabled']:
        w -= min(exact(i['mtp_off_credit_gib']), max(w, 0))
    w /= tp
    fixed = w + exact(i['overhead_gib']) + (exact(i['mtp_gib']) if i['mtp_enabled'] else 0)
    if tp > 1:
        fixed += 2
    kv_need = Fraction(i['max_model_len']) * Fraction(i['kv_bytes_per_token'], tp) \
        * MULT[i['kv_cache_dtype']] / GIB
    wish = fixed + max(kv_need, exact(i['kv_target_gib']))
    mem = exact(i['mem_total_gib'])
    cap = mem - exact(i['host_reserve_gib'])
    gmu = Fraction(math.floor(min(wish, cap) / mem * 1000), 1000)
    budget = gmu * mem
    kv_exp = budget - fixed
    return {'fixed': fixed, 'kv_need': kv_need, 'wish': wish, 'cap': cap, 'gmu': gmu,
            'budget': budget, 'kv_exp': kv_exp, 'refused': kv_exp < kv_need}


def plan_or_none(inputs):
    try:
        return memory_plan(inputs)
    except AnsibleFilterError:
        return None


@SETTINGS
@given(plan_inputs())
def test_the_plan_is_the_spec_arithmetic(inputs):
    want = oracle(inputs)
    plan = plan_or_none(inputs)
    if want is None or want['refused']:
        assert plan is None
        return
    assert plan is not None
    assert plan['gmu'] == float(want['gmu'])
    assert plan['squeezed'] == (want['wish'] > want['cap'])
    assert plan['full_length_fit'] == math.floor(want['kv_exp'] / want['kv_need'])
    for key, name in (('fixed', 'fixed_gib'), ('kv_need', 'kv_need_gib'), ('wish', 'wish_gib'),
                      ('cap', 'cap_gib'), ('budget', 'budget_gib'), ('kv_exp', 'kv_exp_gib')):
        assert plan[name] == pytest.approx(float(want[key]), rel=1e-12, abs=1e-12)


def _valid_plan(inputs):
    plan = plan_or_none(inputs)
    assume(plan is not None)
    return plan


@SETTINGS
@given(plan_inputs())
def test_gmu_has_at_most_three_decimals(inputs):
    plan = _valid_plan(inputs)
    assert Decimal(repr(plan['gmu'])).as_tuple().exponent >= -3
    assert 0 < plan['gmu'] <= 1


@SETTINGS
@given(plan_inputs())
def test_gmu_times_memtotal_stays_under_the_cap(inputs):
    plan = _valid_plan(inputs)
    gmu, cap = Fraction(repr(plan['gmu'])), Fraction(repr(plan['cap_gib']))
    mem = exact(inputs['mem_total_gib'])
    assert gmu * mem <= cap  # exact: gmu, MemTotal and cap are short decimals
    assert plan['budget_gib'] <= plan['cap_gib']
    assert plan['budget_gib'] <= plan['wish_gib']
    # Rounded DOWN, but by less than one step: the next step would exceed min(wish, cap).
    assert (gmu + Fraction(1, 1000)) * mem > min(exact(plan['wish_gib']), cap)


@SETTINGS
@given(plan_inputs())
def test_kv_exp_is_budget_minus_fixed(inputs):
    plan = _valid_plan(inputs)
    assert plan['kv_exp_gib'] == pytest.approx(plan['budget_gib'] - plan['fixed_gib'],
                                               rel=1e-12, abs=1e-9)
    assert plan['kv_exp_gib'] >= plan['kv_need_gib']
    assert 0 <= plan['kv_exp_gib'] * GIB - plan['kv_cache_memory_bytes'] < 1 + 1e-3


@SETTINGS
@given(plan_inputs())
def test_full_length_fit_and_the_concurrency_warning(inputs):
    plan = _valid_plan(inputs)
    fit, need, room = plan['full_length_fit'], plan['kv_need_gib'], plan['kv_exp_gib']
    assert fit >= 1
    assert fit * need <= room * (1 + 1e-12)
    assert (fit + 1) * need > room * (1 - 1e-12)
    warned = [w for w in plan['warnings'] if 'sequences can be at max length' in w]
    assert bool(warned) == (inputs['max_num_seqs'] > fit)
    if warned:
        assert 'at most %d of %d' % (fit, inputs['max_num_seqs']) in warned[0]


@SETTINGS
@given(plan_inputs(), st.data())
def test_a_larger_reserve_never_raises_gmu(inputs, data):
    mem = inputs['mem_total_gib']
    low = inputs['host_reserve_gib']
    high = data.draw(dec2(low, mem - 0.01))
    small = plan_or_none(inputs)
    large = plan_or_none(dict(inputs, host_reserve_gib=high))
    if small is None:
        assert large is None  # refused with less reserve: refused with more
    elif large is not None:
        assert large['gmu'] <= small['gmu']
        assert large['kv_exp_gib'] <= small['kv_exp_gib']


@SETTINGS
@given(st.integers(800, 25600), st.integers(1, 999))
def test_an_exact_thousandth_ratio_is_kept(mem_centi, k):
    # cap / MemTotal == k / 1000 exactly (as decimals): gmu must be k/1000, not one step less.
    mem = Decimal(mem_centi) / 100
    reserve = mem * (1000 - k) / 1000
    assume(Decimal(repr(float(reserve))) == reserve)
    inputs = {
        'weight_bytes': 0, 'ple_gib': 0, 'mtp_enabled': True, 'mtp_off_credit_gib': 0,
        'overhead_gib': 0, 'mtp_gib': 0, 'max_model_len': 1, 'kv_bytes_per_token': 1,
        'kv_cache_dtype': 'auto', 'kv_target_gib': float(mem), 'mem_total_gib': float(mem),
        'host_reserve_gib': float(reserve), 'max_num_seqs': 1,
    }
    plan = memory_plan(inputs)
    assert plan['squeezed'] is True
    assert plan['gmu'] == k / 1000


@SETTINGS
@given(plan_inputs())
def test_numbers_as_strings_plan_the_same(inputs):
    plan = plan_or_none(inputs)
    as_text = dict((k, repr(v) if isinstance(v, float) else v) for k, v in inputs.items())
    assert plan_or_none(as_text) == plan
