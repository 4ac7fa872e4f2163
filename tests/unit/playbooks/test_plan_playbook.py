"""playbooks/plan.yml end to end: ansible-playbook in a subprocess.

- the example inventory (unreachable addresses, every value given): the table for every host,
  the JSON on the controller, no connection attempted, check mode too;
- a local host with a checkpoint, a PLE pack and config.json written by the test: every input
  measured, the host left as it was (check mode and real run);
- refusals reach the user naming the variable to change.
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.sparkops.appliance.plugins.filter.memory_plan import memory_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GIB = 2 ** 30


def run_plan(inventory, out, *args):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_FORCE_COLOR='0')
    cmd = ['ansible-playbook', os.path.join(ROOT, 'playbooks', 'plan.yml'), '-i', str(inventory),
           '-e', 'plan_json_path=%s' % out] + list(args)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
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
    with open(os.path.join(base, 'sparks.yml')) as handle:
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
    assert sorted(report) == ['spark-01', 'spark-02', 'spark-03', 'spark-pa-head', 'spark-pa-worker']
    single, pair = example_vars
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
        assert host in table.splitlines()[3]
    assert 'squeezed by host cap' in table and 'WARNING spark-01: at most 4 of 8' in table


def write_inventory(tmp_path, **host_vars):
    inventory = tmp_path / 'inventory.yml'
    host = dict({'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable},
                **host_vars)
    inventory.write_text(yaml.safe_dump(
        {'all': {'children': {'sparks': {'hosts': {'spark-local': host}}}}}))
    return inventory


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


@pytest.fixture
def local_model(tmp_path):
    return make_model(tmp_path / 'models', tmp_path)


def local_vars(models, **extra):
    values = {
        'spark_model_dir': str(models), 'spark_model_name': 'tiny',
        'memory_plan_gather': 'always', 'memory_plan_max_model_len': 2048,
        'memory_plan_kv_target_gib': 0.5, 'memory_plan_host_reserve_gib': 2,
        'memory_plan_overhead_gib': 0.5, 'memory_plan_max_num_seqs': 4,
    }
    values.update(extra)
    return values


@pytest.mark.parametrize('check', [True, False])
def test_a_reachable_host_is_measured_and_left_unchanged(tmp_path, local_model, check):
    models, ckpt, files, config = local_model
    inventory = write_inventory(tmp_path, **local_vars(models))
    before = tree(tmp_path / 'blobs')
    before.update(tree(models))
    out = tmp_path / 'out' / 'plan.json'
    rc, log = run_plan(inventory, out, *(['--check'] if check else []))
    assert rc == 0, log
    after = tree(tmp_path / 'blobs')
    after.update(tree(models))
    after.pop(str(out), None)
    assert after == before
    entry = json.loads(out.read_text())['spark-local']
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


def test_a_checkpoint_under_a_hidden_directory_is_measured(tmp_path):
    """/home/me/.cache/models/x: only hidden entries inside the checkpoint are skipped (du's
    --exclude='.*' matched the whole path and measured nothing)."""
    models, ckpt, files, _pack = make_model(tmp_path / 'home' / '.cache' / 'models', tmp_path)
    inventory = write_inventory(tmp_path, **local_vars(models))
    out = tmp_path / 'plan.json'
    rc, log = run_plan(inventory, out)
    assert rc == 0, log
    entry = json.loads(out.read_text())['spark-local']
    assert entry['sources']['weight_bytes'] == 'measured'
    assert entry['plan']['inputs']['weight_bytes'] == files


def test_given_kv_bytes_win_over_config_json(tmp_path, local_model):
    models = local_model[0]
    inventory = write_inventory(tmp_path, **local_vars(models, memory_plan_kv_bytes_per_token=4096,
                                                       memory_plan_mem_total_gib=16))
    out = tmp_path / 'plan.json'
    rc, log = run_plan(inventory, out)
    assert rc == 0, log
    entry = json.loads(out.read_text())['spark-local']
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


def test_never_gather_with_a_missing_value_names_it(tmp_path):
    inventory = write_inventory(tmp_path, memory_plan_gather='never', memory_plan_max_model_len=2048,
                                memory_plan_weight_bytes=GIB, memory_plan_kv_bytes_per_token=4096)
    rc, log = run_plan(inventory, tmp_path / 'plan.json')
    assert rc != 0
    assert "'mem_total_gib' (memory_plan_mem_total_gib) is missing" in log, log
