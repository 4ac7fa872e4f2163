"""meminfo_gib and memory_plan_table filters."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.meminfo_gib import meminfo_gib
from ansible_collections.sparkops.appliance.plugins.filter.memory_plan import memory_plan
from ansible_collections.sparkops.appliance.plugins.filter.memory_plan_table import (
    memory_plan_table,
)

MEMINFO = """MemTotal:       127601744 kB
MemFree:         1000000 kB
MemAvailable:   52428800 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""

INPUTS = {
    'weight_bytes': 101382703022, 'ple_gib': 22.67, 'mtp_enabled': True,
    'mtp_off_credit_gib': 1.2, 'overhead_gib': 5.60, 'mtp_gib': 1.49, 'max_model_len': 262144,
    'kv_bytes_per_token': 29482, 'kv_cache_dtype': 'fp8', 'kv_target_gib': 20,
    'mem_total_gib': 121.69, 'host_reserve_gib': 26, 'max_num_seqs': 8,
    'max_num_batched_tokens': 8192, 'mtp_num_speculative_tokens': 3,
}


def test_meminfo_in_gib():
    info = meminfo_gib(MEMINFO)
    assert info['MemTotal'] == 127601744 / 1048576
    assert info['MemAvailable'] == 50.0
    assert 'HugePages_Total' not in info
    assert info['MemTotal'] == pytest.approx(121.69, abs=0.01)


def test_meminfo_without_memtotal_is_refused():
    with pytest.raises(AnsibleFilterError, match='memory_plan_mem_total_gib'):
        meminfo_gib('MemFree: 1 kB\n')


def test_table_has_a_column_per_host_and_the_warnings():
    squeezed = memory_plan(INPUTS)
    roomy = memory_plan(dict(INPUTS, host_reserve_gib=10, max_num_seqs=1))
    lines = memory_plan_table({'spark-02': roomy, 'spark-01': squeezed},
                              sources={'spark-01': {'mem_total_gib': 'given'}})
    header = lines[0]
    assert header.index('spark-01') < header.index('spark-02')
    row = dict((line.split('|')[0].strip(), [c.strip() for c in line.split('|')[1:]])
               for line in lines[2:] if '|' in line)
    assert row['gmu'] == ['%.3f' % squeezed['gmu'], '%.3f' % roomy['gmu']]
    assert row['squeezed by host cap'] == ['yes', 'no']
    assert row['MTP'] == ['on, 3 draft tokens'] * 2
    assert row['KV dtype'][0] == 'fp8 (x0.58)'
    assert row['chunk (max_num_batched_tokens)'] == ['8192', '8192']
    assert row['MemTotal GiB'][0] == '121.69 (given)'
    assert row['full-length requests at once'][0] == '4'
    assert row['checkpoint'] == ['94.42 GiB', '94.42 GiB']
    assert row['checkpoint dir'] == ['-', '-']
    warnings = [line for line in lines if line.startswith('WARNING')]
    assert len(warnings) == 1 and warnings[0].startswith('WARNING spark-01: at most 4 of 8')


def test_table_of_one_plan():
    lines = memory_plan_table(memory_plan(INPUTS))
    assert any(line.startswith('gmu') and line.endswith('0.786') for line in lines)


def test_small_checkpoints_in_mib_and_the_measured_dir():
    plan = memory_plan(dict(INPUTS, weight_bytes=16 << 20, ple_gib=0, host_reserve_gib=100,
                            max_model_len=2048, kv_target_gib=0.25))
    lines = memory_plan_table(plan, sources={'checkpoint_dir': '/srv/m/tiny',
                                             'weight_bytes': 'measured'})
    assert any(line.startswith('checkpoint ') and line.endswith('16.0 MiB (measured)')
               for line in lines)
    assert any(line.startswith('checkpoint dir') and line.endswith('/srv/m/tiny')
               for line in lines)


def test_table_refuses_what_is_not_a_plan():
    with pytest.raises(AnsibleFilterError):
        memory_plan_table({})
    with pytest.raises(AnsibleFilterError):
        memory_plan_table({'spark-01': {'no': 'plan'}})
