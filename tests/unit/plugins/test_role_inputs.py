# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The strict type checks derived from the roles' argument specs (module_utils/_role_inputs)."""
import os

import pytest
import yaml

from ansible_collections.sparkops.appliance.plugins.plugin_utils._role_inputs import (
    COLLECTION_ROOT,
    input_problems,
    load_role_options,
    names_by_type,
    option_problems,
    path_problem,
)

OPTIONS = load_role_options()


def test_every_role_spec_is_read_and_the_bools_come_from_the_specs():
    bools = names_by_type(OPTIONS, 'bool')
    # the ones a hand-written list missed are found because the specs declare them
    for name in ('runtime_image_install_jemalloc', 'runtime_image_pull_base', 'serve_jemalloc',
                 'serve_enable_prefix_caching', 'memwatch_service_enabled', 'checkpoint_validate_certs',
                 'ple_verify', 'spark_expect_gpu', 'host_tuning_min_free_kbytes_force'):
        assert name in bools
    assert 'serve_port' in names_by_type(OPTIONS, 'int')
    assert 'serve_extra_args' in names_by_type(OPTIONS, 'list')
    assert OPTIONS['serve_port']['role'] == 'serve'
    roles = {spec['role'] for spec in OPTIONS.values()}
    assert {'common', 'preflight', 'host_tuning', 'checkpoint', 'ple', 'memory_plan', 'runtime_image', 'serve', 'memwatch'} <= roles


def test_only_the_named_roles_are_read():
    assert set(spec['role'] for spec in load_role_options(roles=['memwatch']).values()) == {'memwatch'}


def _literal_defaults():
    for role in sorted(os.listdir(os.path.join(COLLECTION_ROOT, 'roles'))):
        path = os.path.join(COLLECTION_ROOT, 'roles', role, 'defaults', 'main.yml')
        if not os.path.isfile(path):
            continue
        with open(path) as handle:
            for name, value in (yaml.safe_load(handle) or {}).items():
                if '{{' not in str(value) and name in OPTIONS:
                    yield name, value


@pytest.mark.parametrize('name, value', list(_literal_defaults()))
def test_every_literal_role_default_passes_its_own_spec(name, value):
    assert option_problems(name, value, OPTIONS[name]) == []


@pytest.mark.parametrize('name, value, words', [
    ('runtime_image_install_jemalloc', 'false', ['runtime_image_install_jemalloc = "false"', 'not a YAML boolean', 'without quotes']),
    ('ple_verify', 'yes', ['ple_verify', 'not a YAML boolean']),
    ('serve_jemalloc', 0, ['serve_jemalloc = 0', 'not a YAML boolean']),
    ('serve_extra_args', '--enforce-eager', ['serve_extra_args = "--enforce-eager"', 'not a list', '["--enforce-eager"]']),
    ('spark_model_name', ['tiny-llama'], ['spark_model_name = ["tiny-llama"]', 'a list, not a string']),
    ('preflight_expected_arch', 'x86_64', ['preflight_expected_arch = "x86_64"', 'not a list']),
    ('serve_port', True, ['serve_port = true', 'a boolean, not a whole number']),
    ('serve_port', 'http', ['serve_port = "http"', 'not a whole number']),
    ('serve_port', 80.5, ['serve_port', 'not a whole number']),
    ('memwatch_available_lt_gib', 'six', ['memwatch_available_lt_gib = "six"', 'not a number']),
    ('memwatch_interval_s', float('nan'), ['memwatch_interval_s', 'not a finite number']),
    ('serve_env', ['A=1'], ['serve_env', 'not a mapping']),
    ('serve_env', {1: 'x'}, ['serve_env', 'key 1']),
    ('serve_kv_sizing', 'both', ['serve_kv_sizing = "both"', 'not one of "gmu", "bytes"']),
    ('host_tuning_sysctl_extra', {'vm.swappiness': '10\nkernel.panic = 1'},
     ['host_tuning_sysctl_extra["vm.swappiness"] holds a newline', '10\\nkernel.panic = 1']),
    ('serve_env', {'A\nSPARKOPS_INJECTED': '1'}, ['serve_env key "A\\nSPARKOPS_INJECTED" holds a newline']),
    ('serve_extra_args', ['/x\nExecStartPost=/bin/true'], ['serve_extra_args[0] holds a newline']),
    ('runtime_image_base', 'img\tx', ['runtime_image_base', 'holds a tab']),
    ('memwatch_bin_path', '/usr/local/bin/mem watch', ['memwatch_bin_path = "/usr/local/bin/mem watch"', 'whitespace']),
    ('host_tuning_sysctl_file', '/etc/sysctl.d/../x.conf', ['host_tuning_sysctl_file', 'not a normalised path', '"/etc/x.conf"']),
    ('memwatch_state_dir', 'var/lib/memwatch', ['memwatch_state_dir', 'not an absolute path']),
    ('memwatch_log_dir', '/var/log/memwatch/', ['memwatch_log_dir', 'not a normalised path']),
    ('memwatch_config_path', '', ['memwatch_config_path = ""', 'empty']),
    ('spark_model_dir', '//srv/models', ['spark_model_dir', 'not a normalised path']),
    ('spark_model_dir', None, ['spark_model_dir = null']),
])
def test_a_wrong_value_is_refused_naming_variable_value_and_fix(name, value, words):
    problems = option_problems(name, value, OPTIONS[name])
    assert len(problems) == 1, problems
    for word in words:
        assert word in problems[0], problems[0]
    assert 'Fix: ' in problems[0]


def test_a_secret_is_never_shown():
    spec = dict(OPTIONS['serve_api_key'])
    assert spec.get('no_log') is True
    problems = option_problems('serve_api_key', 12345, spec)
    assert problems and '12345' not in problems[0] and '<hidden' in problems[0]
    assert 'secret\n' not in option_problems('serve_api_key', 'secret\nX=1', spec)[0]


@pytest.mark.parametrize('name, value', [
    ('serve_port', 8000), ('serve_port', '8000'), ('memwatch_available_lt_gib', 5.5), ('memwatch_available_lt_gib', '5.5'),
    ('memwatch_available_lt_gib', 6), ('memwatch_metrics_file', ''), ('serve_ple_file', ''), ('checkpoint_src_path', ''),
    ('memory_plan_mem_total_gib', None), ('serve_extra_args', ['--enforce-eager']), ('spark_model_dir', '/'),
    ('host_tuning_sysctl_extra', {'vm.dirty_background_bytes': 268435456}), ('serve_env', {'A': 'x y'}),
])
def test_a_right_value_passes(name, value):
    assert option_problems(name, value, OPTIONS[name]) == []


def test_unknown_names_are_not_checked_and_each_problem_is_listed():
    problems = input_problems({'not_ours': 'x\n', 'serve_port': 'x', 'ple_verify': 'no'}, OPTIONS)
    assert [p.split(' ')[0] for p in problems] == ['ple_verify', 'serve_port']


def test_path_rules():
    assert path_problem('/a/b') is None
    assert path_problem('/a/./b')[0].startswith('not a normalised')
    assert path_problem('', empty_ok=True) is None


def test_both_lookups_through_ansible():
    """role_options and input_problems as a play calls them (their shared base in _role_inputs):
    terms name the roles, a value that cannot be templated yet is left to the role."""
    import subprocess
    from ansible_json import stdout_json
    from harness import ROOT, ansible_env
    env = ansible_env(ANSIBLE_COLLECTIONS_PATH=os.path.join(COLLECTION_ROOT, '.collections'))
    expr = ("{{ [query('sparkops.appliance.role_options', 'ple', type='bool'), "
            "query('sparkops.appliance.input_problems', 'ple')] }}")
    proc = subprocess.run(['ansible', 'localhost', '-i', 'localhost,', '-c', 'local', '-m', 'ansible.builtin.debug',
                           '-a', 'msg=' + expr, '-e', 'ple_verify=yes', '-e', '{"ple_alignment": "{{ not_known_yet }}"}'],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=True)
    bools, problems = stdout_json(proc)['plays'][0]['tasks'][0]['hosts']['localhost']['msg']
    assert bools == names_by_type(load_role_options(roles=['ple']), 'bool') and 'ple_verify' in bools
    assert len(problems) == 1 and problems[0].startswith('ple_verify = "yes": a string, not a YAML boolean')
