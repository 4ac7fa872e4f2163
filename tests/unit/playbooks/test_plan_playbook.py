"""playbooks/plan.yml end to end: ansible-playbook in a subprocess.

- the example inventory (unreachable addresses, every value given): the table for every host,
  the JSON on the controller, no connection attempted, check mode too;
- a local host with a checkpoint, a PLE pack and config.json written by the test: every input
  measured, the host left as it was (check mode and real run);
- refusals reach the user naming the variable to change.
"""
import json
import os

import pytest
import yaml

from ansible_collections.sparkops.appliance.plugins.filter.memory_plan import memory_plan
from harness import ROOT, ansible_env, batch_inventory, host_failure, play_json, run_playbook

GIB = 2 ** 30
PLAN = os.path.join(ROOT, 'playbooks', 'plan.yml')


def run_plan(inventory, out, *args):
    """plan.yml under the repo's ansible.cfg (its default stdout callback: the table as users see it)."""
    proc = run_playbook(PLAN, inventory=inventory, extra_vars=None, connection=None,
                        args=['-e', 'plan_json_path=%s' % out] + list(args),
                        env=ansible_env(stdout_callback=None))
    return proc.returncode, proc.stdout + proc.stderr


def example_inputs(host_vars):
    """The filter's inputs from the example inventory's group_vars (what the role passes)."""
    keys = ['weight_bytes', 'ple_gib', 'mtp_enabled', 'mtp_num_speculative_tokens',
            'mtp_off_credit_gib', 'overhead_gib', 'mtp_gib', 'max_model_len', 'kv_bytes_per_token',
            'kv_cache_dtype', 'kv_target_gib', 'mem_total_gib', 'host_reserve_gib', 'max_num_seqs',
            'max_num_batched_tokens', 'tensor_parallel_size', 'tp_comm_reserve_gib',
            'docker_headroom_gib']
    inputs = dict((k, host_vars['memory_plan_' + k]) for k in keys)
    inputs['kv_split_across_tp'] = True
    return inputs


@pytest.fixture(scope='module')
def example_vars():
    base = os.path.join(ROOT, 'inventories', 'example', 'group_vars')
    with open(os.path.join(base, 'sparks', 'main.yml')) as handle:
        sparks = yaml.safe_load(handle)
    with open(os.path.join(base, 'pair_a.yml')) as handle:
        pair = yaml.safe_load(handle)
    return sparks, dict(sparks, **pair)


@pytest.mark.parametrize('check', [False, True])
def test_example_inventory_plans_every_host_without_connecting(tmp_path, example_vars, check):
    out = tmp_path / 'plan.json'
    rc, log = run_plan(os.path.join(ROOT, 'inventories', 'example'), out,
                       *(['--check', '--diff'] if check else []))
    assert rc == 0, log
    assert 'UNREACHABLE' not in log and 'unreachable=1' not in log
    report = json.loads(out.read_text())
    assert sorted(report) == ['spark-01', 'spark-02', 'spark-03', 'spark-04', 'spark-pa-head', 'spark-pa-worker']
    single, pair = example_vars
    # the example's two-model Spark (host_vars/spark-04.yml): the worked example's host plan, its rows
    two = report['spark-04']['host_plan']
    assert [(m['name'], m['kv_cache_memory_bytes'], m['docker_memory_bytes']) for m in two['models']] == [
        ('chat', 21474836480, 75806172774), ('embed', 2147483648, 18790481920)]
    assert two['host']['total_gib'] == 121.69
    assert 'spark-04 | chat' in log and 'spark-04 | embed' in log
    assert report['spark-01']['plan'] == memory_plan(example_inputs(single))
    assert report['spark-pa-head']['plan'] == memory_plan(example_inputs(pair))
    assert report['spark-01']['plan']['gmu'] == 0.786
    assert report['spark-pa-head']['plan']['inputs']['tensor_parallel_size'] == 2
    assert set(report['spark-01']['sources'].values()) == {'given', ''}
    assert report['spark-01']['sources']['checkpoint_dir'] == ''
    # PLE_GIB is outside the GPU budget because the runtime's PLE plugin serves it from the pack.
    assert report['spark-01']['ple_runtime'].startswith('served from the packed file through mmap')
    assert 'PLE served from the packed file' in log
    # The table: a column per host, the squeeze, the warning.
    table = log[log.index('TASK [Print the memory plan]'):]
    for host in report:
        if host != 'spark-04':          # its own table, a row per model
            assert host in table.splitlines()[3]
    assert 'squeezed by host cap' in table and 'WARNING spark-01: at most 4 of 8' in table


def tree(path):
    """Everything about a directory tree that a change would touch."""
    out = {}
    for root, dirs, files in os.walk(str(path)):
        for name in sorted(dirs + files):
            full = os.path.join(root, name)
            st = os.lstat(full)
            out[full] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def make_model(models, tmp_path):
    ckpt = models / 'tiny'
    (ckpt / '.cache').mkdir(parents=True)
    config = {'num_hidden_layers': 2, 'hidden_size': 128, 'num_attention_heads': 4,
              'num_key_value_heads': 4, 'head_dim': 32}
    (ckpt / 'config.json').write_text(json.dumps(config))
    (ckpt / 'model.safetensors').write_bytes(b'\0' * (3 << 20))
    (ckpt / '.cache' / 'meta').write_bytes(b'x' * (1 << 20))  # hidden: not counted
    blobs = tmp_path / 'blobs'
    blobs.mkdir()
    (blobs / 'shard').write_bytes(b'\1' * (2 << 20))
    os.symlink(str(blobs / 'shard'), str(ckpt / 'linked.safetensors'))  # followed
    (models / 'tiny.ple').write_bytes(b'\2' * (1 << 20))
    counted = (ckpt / 'config.json', ckpt / 'model.safetensors', blobs / 'shard')
    files = sum(os.stat(str(p)).st_size for p in counted)
    return models, ckpt, files, config


def local_vars(models, **extra):
    values = {
        'spark_model_dir': str(models), 'spark_model_name': 'tiny',
        'memory_plan_gather': 'always', 'memory_plan_max_model_len': 2048,
        'memory_plan_kv_target_gib': 0.5, 'memory_plan_host_reserve_gib': 2,
        'memory_plan_overhead_gib': 0.5, 'memory_plan_max_num_seqs': 4,
    }
    values.update(extra)
    return values


class Case(object):
    """One local host's case: its model, its host vars; after the run its stats, its entry of the
    report, its first failed result."""


def local_cases(tmp):
    """host -> Case, for the run without --check (one host per case) and the one with it."""
    cases = {False: {}, True: {}}
    for check in (False, True):
        case = cases[check]['reachable-%s' % ('check' if check else 'real')] = Case()
        base = tmp / ('reachable-%s' % check)
        case.models, case.ckpt, case.files, case.config = make_model(base / 'models', base)
        case.vars = local_vars(case.models)
        case.watched = (base / 'blobs', case.models)
    # /home/me/.cache/models/x: the hidden directory is above the checkpoint
    case = cases[False]['hidden'] = Case()
    base = tmp / 'hidden'
    case.models, case.ckpt, case.files, _pack = make_model(base / 'home' / '.cache' / 'models', base)
    case.vars = local_vars(case.models)
    case = cases[False]['kv-given'] = Case()
    base = tmp / 'kv-given'
    case.models = make_model(base / 'models', base)[0]
    case.vars = local_vars(case.models, memory_plan_kv_bytes_per_token=4096, memory_plan_mem_total_gib=16)
    case = cases[False]['never-gather'] = Case()
    case.vars = {'memory_plan_gather': 'never', 'memory_plan_max_model_len': 2048,
                 'memory_plan_weight_bytes': GIB, 'memory_plan_kv_bytes_per_token': 4096}
    return cases


@pytest.fixture(scope='module')
def local_runs(tmp_path_factory):
    """Every local-host case in one ansible-playbook start per mode: each case a host of a batch
    inventory (this machine, local connection, its own model and variables as host vars, as the
    one-host inventory gave them); the plan JSON holds every host that was planned, keyed by host.
    A case that fails (never-gather) drops out of the later play alone."""
    tmp = tmp_path_factory.mktemp('plan-local')
    cases = local_cases(tmp)
    for check, hosts in cases.items():
        for case in hosts.values():
            case.before = {}
            for path in getattr(case, 'watched', ()):
                case.before.update(tree(path))
        run_dir = tmp / ('run-check' if check else 'run')
        run_dir.mkdir()
        out = run_dir / 'out' / 'plan.json'
        inventory = batch_inventory(run_dir, {h: c.vars for h, c in hosts.items()}, group='sparks')
        doc = play_json(PLAN, inventory=inventory, connection=None,
                        args=['-e', 'plan_json_path=%s' % out] + (['--check'] if check else []))
        report = json.loads(out.read_text()) if out.exists() else {}
        for host, case in hosts.items():
            case.out = out
            case.stats = doc['stats'][host]
            case.failure = host_failure(doc, host)
            case.entry = report.get(host)
    return cases


def assert_ran_clean(case):
    """The host's own run succeeded (what rc == 0 said when it ran alone)."""
    assert case.failure is None and case.stats['failures'] == 0 and case.stats['unreachable'] == 0, case.failure


@pytest.mark.parametrize('check', [True, False])
def test_a_reachable_host_is_measured_and_left_unchanged(local_runs, check):
    case = local_runs[check]['reachable-%s' % ('check' if check else 'real')]
    models, ckpt, files, config = case.models, case.ckpt, case.files, case.config
    assert_ran_clean(case)
    after = {}
    for path in case.watched:
        after.update(tree(path))
    after.pop(str(case.out), None)
    assert after == case.before
    entry = case.entry
    plan, sources = entry['plan'], entry['sources']
    assert sources == {'mem_total_gib': '/proc/meminfo', 'weight_bytes': 'measured',
                       'ple_gib': 'measured', 'kv_bytes_per_token': 'config.json',
                       'checkpoint_dir': str(ckpt)}
    assert plan['inputs']['weight_bytes'] == files
    assert plan['ple_gib'] == (1 << 20) / GIB
    assert plan['kv_bytes_per_token'] == 2 * 2 * 4 * 32 * 2
    with open('/proc/meminfo') as handle:
        kib = int(handle.readline().split()[1])
    assert plan['inputs']['mem_total_gib'] == pytest.approx(kib / 1048576.0, abs=0.01)


def test_a_checkpoint_under_a_hidden_directory_is_measured(local_runs):
    """/home/me/.cache/models/x: only hidden entries inside the checkpoint are skipped (du's
    --exclude='.*' matched the whole path and measured nothing)."""
    case = local_runs[False]['hidden']
    files = case.files
    assert_ran_clean(case)
    entry = case.entry
    assert entry['sources']['weight_bytes'] == 'measured'
    assert entry['plan']['inputs']['weight_bytes'] == files


def test_given_kv_bytes_win_over_config_json(local_runs):
    case = local_runs[False]['kv-given']
    assert_ran_clean(case)
    entry = case.entry
    assert entry['plan']['kv_bytes_per_token'] == 4096
    assert entry['sources']['kv_bytes_per_token'] == 'given'
    assert entry['sources']['mem_total_gib'] == 'given'
    assert entry['plan']['inputs']['mem_total_gib'] == 16


@pytest.mark.parametrize('extra, needles', [
    (['-e', 'memory_plan_max_model_len=100000000'],
     ['short of kv_need', 'memory_plan_max_model_len']),
    (['-e', 'memory_plan_mtp_enabled=true'], ['boolean-as-string', 'memory_plan_mtp_enabled']),
    (['-e', 'memory_plan_kv_cache_dtype=int8'], ['memory_plan_kv_cache_dtype']),
])
def test_refusals_name_the_variable(tmp_path, extra, needles):
    out = tmp_path / 'plan.json'
    rc, log = run_plan(os.path.join(ROOT, 'inventories', 'example'), out,
                       '--limit', 'spark-01', *extra)
    assert rc != 0
    for needle in needles:
        assert needle in log, log
    # the plan's own message, not a templating error around it
    assert 'Finalization of task args' not in log and 'Error while resolving' not in log, log
    assert not out.exists()


def test_never_gather_with_a_missing_value_names_it(local_runs):
    case = local_runs[False]['never-gather']
    # the host's own run failed (what rc != 0 said when it ran alone), saying why in its result
    assert case.failure is not None and case.stats['failures'] != 0 and case.entry is None
    log = case.failure.get('msg', '')
    assert "'mem_total_gib' (memory_plan_mem_total_gib) is missing" in log, case.failure


# Several models on one Spark (SPEC §13): the golden set of test_memory_host_plan.py.
TWO_MODELS = [
    {'name': 'chat', 'priority': 10, 'port': 8000, 'weight_bytes': 40 * GIB, 'max_model_len': 131072,
     'kv_bytes_per_token': 65536, 'kv_cache_dtype': 'fp8', 'kv_target_gib': 20},
    {'name': 'embed', 'priority': 5, 'port': 8001, 'weight_bytes': 8 * GIB, 'overhead_gib': 2.5,
     'max_model_len': 32768, 'kv_bytes_per_token': 16384, 'kv_target_gib': 2, 'max_num_seqs': 4},
]


def host_plan_inventory(tmp_path, hosts):
    """The example inventory's group vars (every value given) and these hosts at unreachable
    addresses (TEST-NET-1): a connection attempt would fail the run."""
    with open(os.path.join(ROOT, 'inventories', 'example', 'group_vars', 'sparks', 'main.yml')) as handle:
        group_vars = yaml.safe_load(handle)
    members = dict((name, dict(ansible_host='192.0.2.%d' % (i + 10), **extra))
                   for i, (name, extra) in enumerate(sorted(hosts.items())))
    path = tmp_path / 'inventory.yml'
    path.write_text(yaml.safe_dump({'all': {'children': {'sparks': {'hosts': members, 'vars': group_vars}}}}))
    return str(path), group_vars


def test_plan_shows_a_row_per_model_of_a_two_model_spark_without_connecting(tmp_path):
    inventory, group_vars = host_plan_inventory(tmp_path, {
        'spark-single': {},
        'spark-two': {'spark_models': TWO_MODELS,
                      'spark_colocated_services': [{'name': 'image-gen', 'gib': 12}]},
    })
    out = tmp_path / 'plan.json'
    rc, log = run_plan(inventory, out, '--check')
    assert rc == 0, log
    assert 'UNREACHABLE' not in log and 'unreachable=1' not in log
    report = json.loads(out.read_text())
    # the single Spark: exactly today's plan and report
    assert report['spark-single']['plan'] == memory_plan(example_inputs(group_vars))
    assert sorted(report['spark-single']) == ['plan', 'ple_runtime', 'sources']
    # the two-model Spark: one plan for the host, the golden figures
    entry = report['spark-two']
    assert sorted(entry) == ['host_plan', 'sources'] and entry['sources'] == {'mem_total_gib': 'given'}
    host_plan = entry['host_plan']
    assert [(m['name'], m['kv_cache_memory_bytes'], m['docker_memory_bytes']) for m in host_plan['models']] == [
        ('chat', 21474836480, 75806172774), ('embed', 2147483648, 18790481920)]
    assert host_plan['host']['cap_gib'] == 83.69 and host_plan['host']['headroom_gib'] == 5.59
    assert host_plan['host']['total_gib'] == 121.69
    # both tables: the single Spark's column, and a row per model with the host's total
    table = log[log.index('TASK [Print the memory plan]'):log.index('TASK [Print the host plans')]
    assert 'spark-single' in table and 'spark-two' not in table
    rows = log[log.index('TASK [Print the host plans'):]
    for needle in ('spark-two | chat', '21474836480', 'spark-two | embed', '2147483648',
                   'co-located: image-gen', 'total = MemTotal', '121.69'):
        assert needle in rows, rows


def test_plan_refuses_a_set_too_big_naming_each_model(tmp_path):
    inventory, _group_vars = host_plan_inventory(tmp_path, {
        'spark-two': {'spark_models': TWO_MODELS,
                      'spark_colocated_services': [{'name': 'image-gen', 'gib': 40}]},
    })
    out = tmp_path / 'plan.json'
    rc, log = run_plan(inventory, out, '--check')
    assert rc != 0
    for needle in ('do not fit this Spark', 'chat (priority 10): fixed 45.60, kv_need 4.64, wish 65.60 GiB',
                   'embed (priority 5): fixed 10.50, kv_need 0.50, wish 12.50 GiB', '5.55 GiB short',
                   'memory_plan_host_reserve_gib', 'spark_colocated_services[i].gib'):
        assert needle in log, log
    assert 'UNREACHABLE' not in log
    assert 'Finalization of task args' not in log and 'Error while resolving' not in log, log
    assert not out.exists()


def test_a_two_model_spark_reads_only_memtotal_from_the_host(tmp_path):
    """MemTotal not given: read from /proc/meminfo (this machine, local connection); the models'
    figures are given, so nothing else is read."""
    small = [dict(m, weight_bytes=GIB // 16, overhead_gib=0.25, kv_target_gib=0.25, max_model_len=2048)
             for m in TWO_MODELS]
    inventory = batch_inventory(tmp_path, {'local-two': {'spark_models': small, 'memory_plan_host_reserve_gib': 1}})
    out = tmp_path / 'plan.json'
    doc = play_json(PLAN, inventory=inventory, connection=None, args=['-e', 'plan_json_path=%s' % out, '--check'])
    assert host_failure(doc, 'local-two') is None, host_failure(doc, 'local-two')
    entry = json.loads(out.read_text())['local-two']
    assert entry['sources'] == {'mem_total_gib': '/proc/meminfo'}
    with open('/proc/meminfo') as handle:
        kib = int(handle.readline().split()[1])
    assert entry['host_plan']['host']['mem_total_gib'] == pytest.approx(kib / 1048576.0, abs=0.01)
    assert [m['name'] for m in entry['host_plan']['models']] == ['chat', 'embed']
