# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checks beyond type (roles/<role>/meta/checks.yml) read by the input_problems lookup: each
kind passes and fails, each failure is one message naming the variable, the value and the fix."""
import json
import os
import re

import pytest
import yaml

from ansible_collections.sparkops.appliance.plugins.plugin_utils._role_inputs import (
    CHECK_KEYS,
    COLLECTION_ROOT,
    PATTERNS,
    UNKNOWN,
    check_problems,
    input_problems,
    load_role_checks,
    load_role_options,
    role_meta_files,
)

OPTIONS = load_role_options()
CHECKS = load_role_checks()
MESSAGE = re.compile(r'^(?P<var>[a-z_]+) = (?P<value>.+?): (?P<what>.+)\. Fix: (?P<fix>.+)\.$', re.S)


def problems(name, value, checks, **others):
    """check_problems with the other options' values given as keywords (UNKNOWN when not given)."""
    return check_problems(name, value, checks, {}, lambda other: others.get(other, UNKNOWN))


def one(name, value, checks, **others):
    found = problems(name, value, checks, **others)
    assert len(found) == 1, found
    parts = MESSAGE.match(found[0])
    assert parts and parts.group('var') == name, found[0]
    return found[0]


@pytest.mark.parametrize('checks, good, bad, words', [
    ([{'min': 1, 'max': 65535}], [1, 65535, '8000'], [0, 70000, '0'], ['from 1 to 65535']),
    ([{'above': 0}], [0.5, 1], [0, -1.5], ['not above 0']),
    ([{'below': 10}], [9.9], [10], ['not below 10']),
    ([{'power_of_two': True}], [4096, 2 ** 30], [5000, 0], ['power of two']),
    ([{'one_of': [True, False, 'auto']}], [True, 'auto'], [1, 'yes'], ['not one of true, false, "auto"']),
    ([{'min_length': 1}], [['a'], 'x'], [[], ''], ['empty']),
    ([{'pattern': 'unit_name'}], ['sparkops-serve', 'a@b'], ['bad name', '-x', 'a:b', ''], ['systemd unit name']),
    ([{'pattern': 'unit_name', 'empty_ok': True}], [''], ['a b'], ['(or "" for none)']),
    ([{'pattern': 'shm_pattern'}], [['psm_*']], [['a/b'], ['ok', '']], ['element [']),
    ([{'pattern': 'not_empty'}], [['embed'], 'x'], [['ok', ''], ''], ['not a non-empty string']),
    ([{'pattern': 'systemd_unit'}], ['docker.service', 'sparkops-serve'], ['docker service', '-x'], ['systemd unit name such as docker.service']),
    ([{'key_pattern': 'env_name'}], [{'A_1': 'x'}], [{'1A': 'x'}], ['the key "1A"']),
    ([{'value_pattern': 'port'}], [{'a_port': 1}, {'a_port': 65535}, {'a_port': '6380'}, {'a_port': 9999}, {'a_port': 59999}],
     [{'a_port': 0}, {'a_port': 65536}, {'a_port': 70000}, {'a_port': True}, {'a_port': '06380'}, {'a_port': -1}],
     ['not a port number from 1 to 65535']),
    ([{'values': 'scalar'}], [{'A': 1, 'B': True}], [{'A': {'b': 1}}, {'A': [1]}], ['not one plain value']),
    ([{'values': 'string_or_number'}], [{'A': 1}], [{'A': True}], ['a string or a number']),
    ([{'value_pattern': 'sysctl_value'}], [{'vm.x': 268435456}], [{'vm.x': '1;2'}, {'vm.x': ' '}], ['not a number or words']),
    ([{'regex': True}], [['embed_tokens', 'a.*b']], [['(']], ['not a Python regular expression']),
    ([{'fields': {'name': {'required': True, 'pattern': 'apt_source_name'}, 'line': {'pattern': 'apt_line'}}, 'only_fields': True}],
     [[{'name': 'm', 'line': 'deb x ./'}], [{'name': 'm'}]],
     [[{'line': 'deb x'}], [{'name': 'M'}], [{'name': 'm', 'other': 1}], ['x']], ['the entry']),
])
def test_each_kind_passes_and_fails(checks, good, bad, words):
    for value in good:
        assert problems('some_var', value, checks) == [], value
    for value in bad:
        message = one('some_var', value, checks)
        assert message.startswith('some_var = %s: ' % __import__('json').dumps(value, sort_keys=True)), message
        for word in words:
            assert word in message, message


@pytest.mark.parametrize('key, good, bad', [
    ('greater_than', 31, 30), ('at_least', 30, 29), ('less_than', 29, 30), ('at_most', 30, 31),
])
def test_relations_name_the_other_option_and_its_value(key, good, bad):
    checks = [{key: 'other_s'}]
    assert problems('mine_s', good, checks, other_s=30) == []
    message = one('mine_s', bad, checks, other_s=30)
    assert 'other_s (30)' in message and 'Fix: give mine_s a value' in message
    # the other option not known yet (not templated): nothing said
    assert problems('mine_s', bad, checks) == []


def test_equal_and_differ():
    assert problems('a', '/m', [{'equal_to': 'b'}], b='/m') == []
    assert 'not equal to b ("/x")' in one('a', '/m', [{'equal_to': 'b'}], b='/x')
    assert problems('a', '/src', [{'differs_from': 'b'}], b='/dst') == []
    assert 'the same as b' in one('a', '/dst/', [{'differs_from': 'b'}], b='/dst')


def test_not_directly_in_another_directory():
    shard = [{'not_directly_in': 'ckpt', 'file_pattern': 'safetensors_file'}]
    for good in ('/m/ckpt.ple', '/m/ckpt/sub/x.safetensors', '/m/ckpt/ple.pack', '/m/ckpt.safetensors'):
        assert problems('pack', good, shard, ckpt='/m/ckpt') == [], good
    assert problems('pack', '/m/ckpt/x.safetensors', shard) == []            # the directory not known yet
    for bad, ckpt in (('/m/ckpt/x.safetensors', '/m/ckpt'), ('/m/ckpt/x.safetensors', '/m/ckpt/'), ('/m//ckpt/x.safetensors', '/m/ckpt'),
                      ('/x.safetensors', '/')):
        message = one('pack', bad, shard, ckpt=ckpt)
        assert 'a *.safetensors file (read as a checkpoint shard) directly in ckpt (%s)' % json.dumps(ckpt) in message, message
        assert message.endswith('Fix: give it a path outside ckpt.')
    # without file_pattern, any file directly in it
    assert 'a file directly in ckpt' in one('pack', '/m/ckpt/ple.pack', [{'not_directly_in': 'ckpt'}], ckpt='/m/ckpt')
    assert problems('pack', '/m/other/ple.pack', [{'not_directly_in': 'ckpt'}], ckpt='/m/ckpt') == []


def test_when_and_unless():
    checks = [{'min': 1, 'when': {'flag_on': True}, 'reason': 'flag_on is true'}]
    assert problems('n', 0, checks, flag_on=False) == []
    assert problems('n', 0, checks, flag_on='true') == []   # a string is not true: the type check says so
    assert problems('n', 0, checks) == []                   # unknown: left to the role
    assert 'flag_on is true' in one('n', 0, checks, flag_on=True)
    checks = [{'min_length': 1, 'unless': {'source': 'none'}}]
    assert problems('p', '', checks, source='none') == []
    assert problems('p', '', checks) == []
    one('p', '', checks, source='http')
    checks = [{'min_length': 1, 'when': {'source': ['http', 'peer']}}]
    one('p', '', checks, source='peer')
    assert problems('p', '', checks, source='path') == []


REFUSE = [{'refuse_flags': [
    {'flag': '--max-model-len', 'owner': 'serve_max_model_len', 'reason': 'the plan sizes it'},
    {'flag': ['--tensor-parallel-size', '-tp'], 'owner': 'memory_plan_tensor_parallel_size'},
    {'flag': '--distributed-executor-backend', 'fix': 'remove it on a pair', 'when': {'cluster_role': ['head', 'worker']}},
]}]


@pytest.mark.parametrize('args', [
    ['--max-model-len', '8'], ['--max-model-len=8'], ['--max_model_len', '8'], ['--max_model_len=8'], [' --max-model-len 8'],
])
def test_a_refused_flag_in_every_spelling(args):
    message = one('serve_extra_args', ['--enforce-eager'] + args, REFUSE)
    assert '--max-model-len' in message and 'the plan sizes it' in message
    assert message.endswith('Fix: remove --max-model-len; set serve_max_model_len instead.')


def test_refused_flags_short_spelling_condition_and_values_that_look_alike():
    assert 'set memory_plan_tensor_parallel_size' in one('serve_extra_args', ['-tp', '2'], REFUSE)
    # a value is not a flag; a longer flag with the same start is another flag
    assert problems('serve_extra_args', ['--served', '--max-model-len-x', 'max-model-len', '--enforce-eager'], REFUSE) == []
    single = ['--enforce-eager', '--distributed-executor-backend', 'uni']
    assert problems('serve_extra_args', single, REFUSE, cluster_role='') == []
    assert 'remove it on a pair' in one('serve_extra_args', single, REFUSE, cluster_role='head')
    # two refused flags: two messages
    assert len(problems('serve_extra_args', ['--max-model-len=8', '-tp', '2'], REFUSE)) == 2


def test_refused_keys():
    checks = [{'refuse_keys': [{'key': 'VLLM_API_KEY', 'owner': 'serve_api_key', 'reason': 'the role writes it'}]}]
    assert problems('serve_env', {'VLLM_ENABLE_V1_MULTIPROCESSING': '0'}, checks) == []
    message = one('serve_env', {'VLLM_API_KEY': 'k'}, checks)
    assert 'the key VLLM_API_KEY is refused here: the role writes it' in message
    assert message.endswith('Fix: remove VLLM_API_KEY; set serve_api_key instead.')


def test_a_secret_is_hidden_in_check_messages_too():
    found = check_problems('serve_api_key', 'Hunter 2', [{'pattern': 'word'}], {'no_log': True})
    assert len(found) == 1 and 'Hunter 2' not in found[0] and '<hidden: no_log>' in found[0]


def test_checks_run_only_on_a_value_of_the_right_type_and_each_bad_value_has_its_own_message():
    found = input_problems({'serve_port': 'http', 'serve_max_num_seqs': 0, 'serve_health_delay_s': 0}, OPTIONS, CHECKS)
    assert [p.split(' ')[0] for p in found] == ['serve_health_delay_s', 'serve_max_num_seqs', 'serve_port']
    assert 'not a number' in found[2] or 'not a whole number' in found[2]
    # a string where a list of patterns belongs: the type message alone, not the pattern's as well
    found = input_problems({'serve_shm_patterns': 'a/b'}, OPTIONS, CHECKS)
    assert len(found) == 1 and 'not a list' in found[0], found


def test_relations_read_the_other_option_from_the_values_or_its_literal_default():
    assert input_problems({'serve_stop_timeout_s': 20}, OPTIONS, CHECKS)[0].startswith(
        'serve_stop_timeout_s = 20: not above serve_stop_grace_s (30)')
    assert input_problems({'serve_stop_timeout_s': 20, 'serve_stop_grace_s': 10}, OPTIONS, CHECKS) == []


def test_the_data_files_use_known_keys_and_patterns_and_name_declared_options():
    for role, path, data in role_meta_files('checks.yml'):
        assert set(data) == {'checks'}, path
        declared = load_role_options(roles=[role])
        # a role whose lookup asks for 'common' too (cluster: a pair's spark_* names) may check those
        validate = os.path.join(COLLECTION_ROOT, 'roles', role, 'tasks', 'validate.yml')
        if os.path.isfile(validate):
            with open(validate) as handle:
                if "'%s', 'common')" % role in handle.read():
                    declared.update(load_role_options(roles=['common']))
        for name, entries in data['checks'].items():
            assert name in declared, '%s: %s is not an option of %s (nor of common, where its lookup reads common)' % (path, name, role)
            for entry in entries:
                assert set(entry) <= CHECK_KEYS, (path, name)
                for key in ('greater_than', 'at_least', 'less_than', 'at_most', 'equal_to', 'differs_from', 'not_directly_in'):
                    if key in entry:
                        assert entry[key] in OPTIONS, (path, name, entry[key])
                for key in ('when', 'unless'):
                    conditions = entry.get(key) or {}
                    for condition in (conditions if isinstance(conditions, list) else [conditions]):
                        for other in condition:
                            assert other in OPTIONS, (path, name, other)
    assert 'unit_name' in PATTERNS and PATTERNS['unit_file_name'][0].startswith(PATTERNS['unit_name'][0])


def test_an_unknown_key_or_pattern_in_the_data_is_an_error(tmp_path):
    from ansible.errors import AnsibleError
    (tmp_path / 'r' / 'meta').mkdir(parents=True)
    (tmp_path / 'r' / 'meta' / 'checks.yml').write_text('checks:\n  x:\n    - {minimum: 1}\n')
    with pytest.raises(AnsibleError, match='minimum'):
        load_role_checks(roles_dir=str(tmp_path))
    (tmp_path / 'r' / 'meta' / 'checks.yml').write_text('checks:\n  x:\n    - {pattern: nope}\n')
    with pytest.raises(AnsibleError, match='pattern nope'):
        load_role_checks(roles_dir=str(tmp_path))
    (tmp_path / 'r' / 'meta' / 'checks.yml').write_text('checks:\n  x:\n    - {not_directly_in: y, file_pattern: nope}\n')
    with pytest.raises(AnsibleError, match='pattern nope'):
        load_role_checks(roles_dir=str(tmp_path))


def _literal_values(path, everything=False):
    """The values in path that are no template; only role options unless everything."""
    with open(os.path.join(COLLECTION_ROOT, path)) as handle:
        return {name: value for name, value in (yaml.safe_load(handle) or {}).items()
                if '{{' not in str(value) and (everything or name in OPTIONS)}


def test_the_literal_defaults_the_example_and_the_lab_pass_their_checks_but_the_missing_key():
    """What the lab and the serve scenario set is never refused (the lab's --distributed-executor-backend
    uni on a single Spark, VLLM_ENABLE_V1_MULTIPROCESSING); the roles' defaults and the example
    inventory only for want of an API key."""
    defaults = {}
    for role in sorted(os.listdir(os.path.join(COLLECTION_ROOT, 'roles'))):
        if os.path.isfile(os.path.join(COLLECTION_ROOT, 'roles', role, 'defaults', 'main.yml')):
            defaults.update(_literal_values(os.path.join('roles', role, 'defaults', 'main.yml')))
    # closed by default: the roles' defaults and the example as shipped (its vault.yml's key empty)
    # are refused for the one reason, the API key on a wildcard bind, and the fix names the vault
    # (and the gateway's client keys: it is closed by default too)
    closed = input_problems(defaults, OPTIONS, CHECKS)
    assert len(closed) == 2, closed
    assert closed[0].startswith("gateway_client_api_keys = <hidden: no_log>: empty") and "vault_gateway_client_api_keys" in closed[0]
    assert closed[1].startswith("serve_api_key = <hidden: no_log>: empty") and "vault_serve_api_key" in closed[1]
    example = dict(defaults, **_literal_values('inventories/example/group_vars/sparks/main.yml'))
    example.update(_literal_values('inventories/example/group_vars/gateways/main.yml'))
    vault = _literal_values('inventories/example/group_vars/sparks/vault.yml', everything=True)
    assert vault == {'vault_serve_api_key': ''}
    gateway_vault = _literal_values('inventories/example/group_vars/gateways/vault.yml', everything=True)
    assert gateway_vault == {'vault_gateway_client_api_keys': []}
    example['serve_api_key'] = vault['vault_serve_api_key']
    example['gateway_client_api_keys'] = gateway_vault['vault_gateway_client_api_keys']
    assert input_problems(example, OPTIONS, CHECKS) == closed
    overrides = _literal_values('inventories/lab/group_vars/sparks/lab_overrides.yml', everything=True)
    lab = dict(example, **_literal_values('inventories/lab/group_vars/sparks/lab_overrides.yml'))
    lab['serve_api_key'] = overrides['vault_serve_api_key']
    lab['gateway_client_api_keys'] = _literal_values('inventories/lab/group_vars/gateways/lab_overrides.yml',
                                                     everything=True)['vault_gateway_client_api_keys']
    assert lab['serve_extra_args'] == ['--enforce-eager', '--distributed-executor-backend', 'uni']
    assert input_problems(lab, OPTIONS, CHECKS) == []
    with open(os.path.join(COLLECTION_ROOT, 'molecule', 'serve', 'molecule.yml')) as handle:
        scenario = yaml.safe_load(handle)
    for group in scenario['provisioner']['inventory'].get('group_vars', {}).values():
        values = dict(lab, **{k: v for k, v in group.items() if k in OPTIONS and '{{' not in str(v) and '${' not in str(v)})
        assert input_problems(values, OPTIONS, CHECKS) == []
    for group in scenario['provisioner']['inventory'].get('host_vars', {}).values():
        values = dict(lab, **{k: v for k, v in group.items() if k in OPTIONS and '{{' not in str(v) and '${' not in str(v)})
        assert input_problems(values, OPTIONS, CHECKS) == []
