"""The memory_host_plan filter (SPEC section 13): several models on one Spark, one plan for the host.

Golden figures (docs/memory-plan.md, "Several models on one Spark (SPEC §13)", gives the same
worked example): a chat model and an embedding model on MemTotal 121.69 GiB, host reserve 26 GiB,
one co-located image generator.
"""
import copy
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.memory_host_plan import (
    FilterModule,
    memory_host_plan,
)
from ansible_collections.sparkops.appliance.plugins.filter.memory_host_plan_problem import (
    memory_host_plan_problem,
)
from ansible_collections.sparkops.appliance.plugins.filter.memory_host_plan_table import (
    memory_host_plan_table,
)
from ansible_collections.sparkops.appliance.plugins.filter.memory_plan import memory_plan
from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import MODEL_DEFAULTS
from harness import ROOT

GIB = 2 ** 30

CHAT = {
    'name': 'chat', 'priority': 10, 'port': 8000,
    'weight_bytes': 40 * GIB,           # 40 GiB, no PLE, MTP off: w = 40
    'max_model_len': 131072,
    'kv_bytes_per_token': 65536,        # 131072 x 65536 B = 8 GiB in BF16; fp8 x 0.58 = 4.64 GiB
    'kv_cache_dtype': 'fp8',
    'kv_target_gib': 20,
}
EMBED = {
    'name': 'embed', 'priority': 5, 'port': 8001,
    'weight_bytes': 8 * GIB,
    'overhead_gib': 2.5,                # fixed = 8 + 2.5 = 10.5
    'max_model_len': 32768,
    'kv_bytes_per_token': 16384,        # 32768 x 16384 B = 0.5 GiB
    'kv_target_gib': 2,
    'max_num_seqs': 4,
    'extra_args': ['--task', 'embed'],  # not read by the plan
}
IMAGE_GEN = 12


def models(*changes):
    out = [copy.deepcopy(CHAT), copy.deepcopy(EMBED)]
    for i, change in changes:
        out[i].update(change)
    return out


def plan(entries=None, mem_total=121.69, reserve=26, gib=IMAGE_GEN, services=None):
    if services is None:
        services = [{'name': 'image-gen', 'gib': gib}]
    return memory_host_plan(models() if entries is None else entries, mem_total_gib=mem_total,
                            host_reserve_gib=reserve, colocated_services=services)


def refused(*args, **kwargs):
    with pytest.raises(AnsibleFilterError) as info:
        plan(*args, **kwargs)
    return str(info.value)


def by_name(result):
    return dict((m['name'], m) for m in result['models'])


def test_filters_are_registered_under_their_names():
    assert FilterModule().filters()['memory_host_plan'] is memory_host_plan


def test_golden_two_models_fit_with_headroom():
    result = plan()
    chat, embed = by_name(result)['chat'], by_name(result)['embed']
    # chat: fixed = 40 + 5.60 (default overhead; MTP off, so no MTP reserve) = 45.60
    assert chat['fixed_gib'] == 45.6
    assert chat['kv_need_gib'] == 4.64
    assert chat['kv_wish_gib'] == 20.0
    assert chat['wish_gib'] == 65.6
    assert chat['kv_budget_gib'] == 20.0
    assert chat['kv_cache_memory_bytes'] == 21474836480  # 20 x 2^30
    assert chat['budget_gib'] == 65.6
    assert chat['budget_bytes'] == 70437463654  # floor(65.60 x 2^30)
    assert chat['docker_memory_gib'] == 70.6
    assert chat['docker_memory_bytes'] == 75806172774  # floor(70.60 x 2^30)
    assert chat['gmu'] == 0.539
    assert chat['full_length_fit'] == 4
    assert chat['squeezed'] is False
    assert chat['port'] == 8000 and chat['priority'] == 10
    # embed: fixed = 8 + 2.5 = 10.5, kv_need 0.5 < target 2
    assert embed['fixed_gib'] == 10.5
    assert embed['kv_need_gib'] == 0.5
    assert embed['kv_budget_gib'] == 2.0
    assert embed['kv_cache_memory_bytes'] == 2147483648
    assert embed['budget_gib'] == 12.5
    assert embed['docker_memory_bytes'] == 18790481920  # 17.5 x 2^30
    assert embed['gmu'] == 0.102
    assert embed['full_length_fit'] == 4
    host = result['host']
    assert host['cap_gib'] == 83.69          # 121.69 - 26 - 12
    assert host['colocated'] == [{'name': 'image-gen', 'gib': 12.0}]
    assert host['colocated_gib'] == 12.0
    assert host['fixed_gib'] == 56.1
    assert host['kv_need_gib'] == 5.14
    assert host['least_gib'] == 61.24
    assert host['wish_gib'] == 78.1
    assert host['models_gib'] == 78.1
    assert host['headroom_gib'] == 5.59      # kept free, not handed out
    assert host['total_gib'] == 121.69       # 78.10 + 12 + 26 + 5.59
    assert host['squeezed'] is False
    # the single plan's warning, against the KV budget, naming this model's variables
    assert result['warnings'] == [
        'chat: at most 4 of 8 sequences can be at max length at once: 8 x kv_need 4.64 GiB > KV budget '
        '20.00 GiB (max_num_seqs bounds concurrency, not full-length concurrency; to make all fit lower '
        'spark_models[0].max_num_seqs or spark_models[0].max_model_len, or raise spark_models[0].kv_target_gib)']
    assert chat['warnings'] == [result['warnings'][0][len('chat: '):]]
    assert embed['warnings'] == []


def test_golden_wishes_do_not_fit_budgets_shrink_in_priority_order():
    # image-gen 20 GiB: cap 75.69; needs 61.24 fit, wishes 78.10 do not. Each model gets its
    # kv_need, the 14.45 GiB left go to the highest priority first (chat wants 15.36 more).
    result = plan(gib=20)
    chat, embed = by_name(result)['chat'], by_name(result)['embed']
    assert result['host']['cap_gib'] == 75.69
    assert result['host']['squeezed'] is True
    assert chat['kv_budget_gib'] == 19.09
    assert chat['kv_cache_memory_bytes'] == 20497731420  # floor(19.09 x 2^30)
    assert chat['squeezed'] is True
    assert embed['kv_budget_gib'] == 0.5
    assert embed['kv_cache_memory_bytes'] == 536870912
    assert embed['squeezed'] is True
    assert result['host']['headroom_gib'] == 0.0
    assert result['host']['total_gib'] == 121.69
    assert any(w.startswith('embed: at most 1 of 4 sequences') for w in result['warnings'])


def test_priority_decides_who_keeps_its_wish():
    result = plan(models((0, {'priority': 1}), (1, {'priority': 7})), gib=20)
    chat, embed = by_name(result)['chat'], by_name(result)['embed']
    assert embed['kv_budget_gib'] == 2.0 and embed['squeezed'] is False
    assert chat['kv_budget_gib'] == 17.59   # 75.69 - 56.10 - 2
    assert chat['kv_cache_memory_bytes'] == 18887118684


def test_golden_too_big_is_refused_naming_each_model_and_the_shortfall():
    message = refused(gib=40)   # cap 55.69 < 61.24
    assert message == (
        'memory_plan: the models of spark_models do not fit this Spark: they need at least 61.24 GiB (each '
        'its fixed cost and the KV of one max-length request), the shared cap is 55.69 GiB (mem_total_gib '
        '121.69 - host_reserve_gib 26.00 - co-located 40.00 GiB: image-gen 40.00), 5.55 GiB short. Each '
        'model: chat (priority 10): fixed 45.60, kv_need 4.64, wish 65.60 GiB; embed (priority 5): fixed '
        '10.50, kv_need 0.50, wish 12.50 GiB. To fit, free 5.55 GiB: lower memory_plan_host_reserve_gib or '
        "a spark_colocated_services[i].gib; lower a model's spark_models[i].max_model_len or "
        'spark_models[i].overhead_gib, use an fp8 spark_models[i].kv_cache_dtype, turn '
        'spark_models[i].mtp_enabled off; or leave a model out of spark_models (the lowest priority: embed).')
    assert memory_host_plan_problem(models(), mem_total_gib=121.69, host_reserve_gib=26,
                                    colocated_services=[{'name': 'image-gen', 'gib': 40}]) == message
    assert memory_host_plan_problem(models(), mem_total_gib=121.69, host_reserve_gib=26,
                                    colocated_services=[{'name': 'image-gen', 'gib': 12}]) == ''


def test_exactly_the_needs_fit():
    result = plan(gib=34.45)  # 121.69 - 26 - 61.24
    assert [m['kv_budget_gib'] for m in result['models']] == [4.64, 0.5]
    assert result['host']['headroom_gib'] == 0.0


SPEC_GOLDEN = {
    'weight_bytes': 101382703022, 'ple_gib': 22.67, 'mtp_enabled': True, 'mtp_off_credit_gib': 1.2,
    'overhead_gib': 5.60, 'mtp_gib': 1.49, 'max_model_len': 262144, 'kv_bytes_per_token': 29482,
    'kv_cache_dtype': 'fp8', 'kv_target_gib': 20, 'max_num_seqs': 8,
}


# floor of (121.69 - 26) x 2^30 - (101382703022 - (22.67 - 5.60 - 1.49) x 2^30) = 18092549734.48 bytes
KV_BYTES_SPEC = 18092549734


@pytest.mark.parametrize('reserve', [26, 10])
def test_one_model_has_the_single_plans_figures(reserve):
    single = memory_plan(dict(SPEC_GOLDEN, mem_total_gib=121.69, host_reserve_gib=reserve))
    result = plan([dict(SPEC_GOLDEN, name='spec', priority=1, port=8000)], reserve=reserve, services=[])
    model = result['models'][0]
    for key in ('weights_gib', 'ple_gib', 'fixed_gib', 'kv_bytes_per_token', 'kv_mult', 'kv_request_bytes',
                'kv_need_gib', 'kv_target_gib', 'wish_gib', 'kv_source'):
        assert model[key] == single[key], key
    assert result['host']['cap_gib'] == single['cap_gib']
    assert model['squeezed'] is single['squeezed']
    assert model['inputs'] == single['inputs']
    # The KV budget is what the single plan wished for, min(wish, cap) - fixed, before gmu's
    # round-down: the single plan's kv_exp is at most one gmu step below it.
    assert model['kv_budget_gib'] == pytest.approx(min(single['wish_gib'], single['cap_gib']) - single['fixed_gib'])
    assert 0 <= model['kv_budget_gib'] - single['kv_exp_gib'] < single['gmu_step_gib']
    assert model['gmu'] == single['gmu']
    if reserve == 26:
        # cap 95.69 - fixed 78.84 (the SPEC golden case, squeezed; its weight_bytes is 94.42 GiB to
        # the byte, so fixed is 78.84 to 1e-10)
        assert model['kv_budget_gib'] == pytest.approx(16.85, abs=1e-9)
        assert model['kv_cache_memory_bytes'] == KV_BYTES_SPEC


def test_model_defaults_are_the_roles():
    with open(os.path.join(ROOT, 'roles', 'memory_plan', 'defaults', 'main.yml')) as handle:
        defaults = yaml.safe_load(handle)
    for key, value in MODEL_DEFAULTS.items():
        assert defaults['memory_plan_' + key] == value, key


@pytest.mark.parametrize('entries, services, needle', [
    ([], None, 'spark_models is []: give a non-empty list'),
    ('chat', None, 'give a non-empty list'),
    (['chat'], None, "spark_models[0] is 'chat', not a mapping"),
    (models((1, {'name': 'Embed'})), None, "spark_models[1].name is 'Embed': give the model's name"),
    (models((1, {'name': '-x'})), None, "spark_models[1].name is '-x'"),
    (models((1, {'name': None})), None, 'spark_models[1].name is None'),
    (models((1, {'name': 'chat'})), None, "spark_models[1].name is 'chat', the name of spark_models[0] too"),
    (models((1, {'priority': 10})), None,
     'spark_models[1].priority is 10, the priority of spark_models[0] (chat).priority too'),
    (models((1, {'priority': True})), None, 'spark_models[1].priority is True, not a whole number'),
    (models((1, {'priority': 1.5})), None, 'spark_models[1].priority is 1.5, not a whole number'),
    (models((1, {'priority': None})), None, 'spark_models[1].priority is missing'),
    (models((1, {'port': 8000})), None, 'spark_models[1].port is 8000, the port of spark_models[0] (chat).port too'),
    (models((1, {'port': 70000})), None, 'spark_models[1].port is 70000: give a TCP port (1-65535)'),
    (models((1, {'port': 'http'})), None, "spark_models[1].port is 'http', not a whole number"),
    (models((1, {'max_model_len': 'abc'})), None,
     "spark_models[1] (embed): input 'max_model_len' (spark_models[1].max_model_len) is 'abc', not a number"),
    (models((1, {'weight_bytes': None})), None,
     "spark_models[1] (embed): input 'weight_bytes' (spark_models[1].weight_bytes) is missing"),
    (models((0, {'mtp_enabled': 'true'})), None, 'spark_models[0].mtp_enabled'),
    (models((0, {'kv_cache_dtype': 'int8'})), None,
     "spark_models[0] (chat): input 'kv_cache_dtype' (spark_models[0].kv_cache_dtype)"),
    (models((0, {'tensor_parallel_size': 2})), None,
     'spark_models[0] (chat): tensor_parallel_size is 2; several models on one Spark are planned at tensor '
     'parallel 1 only'),
    (models((0, {'host_reserve_gib': 10})), None,
     'spark_models[0] (chat): host_reserve_gib belong(s) to the host, not to a model: set '
     'memory_plan_host_reserve_gib instead'),
    (models((0, {'max_model_length': 4096})), None, 'spark_models[0] (chat): unknown key(s) max_model_length'),
    # the checkpoint role's host-wide settings (token, certificates, peer, ...) are not a model's
    (models((0, {'checkpoint_hf_token': 'x', 'checkpoint_source': 'huggingface'})), None,
     'spark_models[0] (chat): checkpoint_hf_token belong(s) to the host, not to a model: a model takes only '
     'checkpoint_source, checkpoint_revision, checkpoint_url, checkpoint_manifest, checkpoint_hf_repo, '
     'checkpoint_src_path (its checkpoint goes to spark_model_dir/chat)'),
    (models((1, {'checkpoint_dir': '/elsewhere'})), None,
     'spark_models[1] (embed): checkpoint_dir belong(s) to the host, not to a model'),
    (None, 'image-gen', 'spark_colocated_services is str, not a list'),
    (None, [{'name': 'image-gen', 'gib': -1}], 'spark_colocated_services[0].gib is -1: give the GiB'),
    (None, [{'name': 'image-gen', 'gib': 'lots'}], "spark_colocated_services[0].gib is 'lots'"),
    (None, [{'name': 'image-gen', 'gib': True}], 'spark_colocated_services[0].gib is True'),
    (None, [{'name': 'image-gen'}], 'spark_colocated_services[0].gib is None'),
    (None, [{'name': 'a', 'gib': 1}, {'name': 'a', 'gib': 1}],
     "spark_colocated_services[1].name is 'a', the name of spark_colocated_services[0] too"),
    (None, [{'name': 'Image Gen', 'gib': 1}], "spark_colocated_services[0].name is 'Image Gen'"),
    (None, [{'name': 'a', 'gib': 1, 'port': 7860}], 'spark_colocated_services[0] has unknown key(s) port'),
    (None, [{'name': 'a', 'gib': 100}], 'leave nothing of mem_total_gib 121.69 for the models'),
])
def test_refusals_name_the_variable(entries, services, needle):
    kwargs = {} if services is None else {'services': services}
    message = refused(entries, **kwargs)
    assert needle in message, message


def test_a_models_checkpoint_settings_are_accepted_and_not_read():
    """The checkpoint role's tasks_from models reads (and checks) them: the plan takes them as they are."""
    settings = {'checkpoint_source': 'huggingface', 'checkpoint_revision': '0' * 40, 'checkpoint_hf_repo': 'org/chat',
                'checkpoint_url': '', 'checkpoint_manifest': '', 'checkpoint_src_path': ''}
    path = {'checkpoint_source': 'path', 'checkpoint_src_path': '/srv/share/embed'}
    assert plan(models((0, settings), (1, path))) == plan()


def test_host_figures_are_checked_as_the_single_plans():
    assert "'mem_total_gib' (memory_plan_mem_total_gib) is missing" in refused(mem_total=None)
    assert "'host_reserve_gib' (memory_plan_host_reserve_gib) is negative" in refused(reserve=-1)


def test_numeric_strings_and_no_services():
    as_text = models((0, {'priority': '10', 'port': '8000', 'max_model_len': '131072'}))
    assert plan(as_text) == plan()
    assert plan(services=[])['host']['cap_gib'] == 95.69
    assert memory_host_plan(models(), mem_total_gib=121.69, host_reserve_gib=26)['host']['colocated'] == []


def test_table_has_a_row_per_model_and_the_total():
    lines = memory_host_plan_table({'spark-04': plan()})
    rows = [[c.strip() for c in line.split('|')] for line in lines[2:] if not line.startswith('WARNING')]
    assert [r[1] for r in rows] == ['chat', 'embed', 'co-located: image-gen', 'host reserve',
                                    'headroom (not planned)', 'total = MemTotal']
    assert rows[0][:10] == ['spark-04', 'chat', '10', '8000', '45.60', '4.640', '20.00', '20.00',
                            '21474836480', '65.60']
    assert rows[-1][9] == '121.69' and rows[-2][9] == '5.59'
    assert lines[-1].startswith('WARNING spark-04 chat: at most 4 of 8')
    with pytest.raises(AnsibleFilterError):
        memory_host_plan_table({})


def test_the_docs_worked_example_is_the_golden_case():
    with open(os.path.join(ROOT, 'docs', 'memory-plan.md'), encoding='utf-8') as handle:
        doc = handle.read()
    section = doc[doc.index('## Several models on one Spark (SPEC §13)'):doc.index('## KV bytes per token from the model')]
    fits, shrunk = plan(), plan(gib=20)
    chat, embed = fits['models']
    for figure in (chat['kv_cache_memory_bytes'], embed['kv_cache_memory_bytes'], chat['docker_memory_bytes'],
                   embed['docker_memory_bytes'], shrunk['models'][0]['kv_cache_memory_bytes'],
                   shrunk['models'][1]['kv_cache_memory_bytes']):
        assert str(figure) in section, figure
    for figure in ('%.2f' % chat['fixed_gib'], '%.2f' % chat['kv_need_gib'], '%.2f' % embed['fixed_gib'],
                   '%.2f' % fits['host']['cap_gib'], '%.2f' % fits['host']['headroom_gib'],
                   '%.2f' % shrunk['models'][0]['kv_budget_gib'], '%.3f' % chat['gmu'], '%.3f' % embed['gmu']):
        assert '**%s' % figure in section or figure in section, figure
    # the refusal quoted in the docs is the filter's, word for word (the docs wrap its lines)
    assert ' '.join(refused(gib=40).split()) in ' '.join(section.split())
