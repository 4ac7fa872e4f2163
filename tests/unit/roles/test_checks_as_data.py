# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sweep's "checks as data" cases (molecule/production/tests/test_bad_input_sweep.py) refused on
this machine the way site.yml's first play refuses them: preflight's check of every role's values,
then each role's validate entry point, on hosts with the example inventory's and the lab's values
(the serve scenario's --distributed-executor-backend uni and VLLM_ENABLE_V1_MULTIPROCESSING among
them) and one bad value each. The good host passes. One ansible-playbook start (a batch inventory)."""
import ast
import os

import pytest
import yaml

from harness import ROOT, batch_inventory, host_failure, host_results, play_json

SWEEP = os.path.join(ROOT, "molecule", "production", "tests", "test_bad_input_sweep.py")

CASES = [
    ("extra-args-max-model-len", {"serve_extra_args": ["--enforce-eager", "--max-model-len", "2048"]}, "serve_extra_args"),
    ("extra-args-gmu", {"serve_extra_args": ["--gpu-memory-utilization=0.9"]}, "serve_extra_args"),
    ("serve-env-api-key", {"serve_env": {"VLLM_API_KEY": "k"}}, "serve_env"),
    ("extra-args-swap-space", {"serve_extra_args": ["--swap-space", "16"]}, "serve_extra_args"),
    ("memwatch-interval-too-rare", {"memwatch_interval_s": 60}, "memwatch_interval_s"),
    ("extra-args-underscore", {"serve_extra_args": ["--max_model_len=2048"]}, "serve_extra_args"),
    ("health-delay-above-timeout", {"serve_health_delay_s": 100, "serve_health_timeout_s": 50}, "serve_health_delay_s"),
    ("memwatch-free-above-available", {"memwatch_available_and_free_free_lt_gib": 12}, "memwatch_available_and_free_free_lt_gib"),
    ("empty-api-key-wildcard-bind", {"serve_api_key": ""}, "serve_api_key"),
    ("empty-api-key-gateway-wildcard-bind", {"serve_api_key": "", "serve_behind_gateway": True}, "serve_bind_host"),
]
# Closed by default, and the two ways to run without a key that stay open: loopback only, or a
# gateway as the only way in with the server on the one address it reaches.
OPEN_WITHOUT_KEY = [
    ("empty-api-key-loopback", {"serve_api_key": "", "serve_bind_host": "127.0.0.1"}),
    ("empty-api-key-gateway-address", {"serve_api_key": "", "serve_behind_gateway": True, "serve_bind_host": "10.10.0.1"}),
]
PLAN = {"gmu": 0.5, "kv_cache_memory_bytes": 1, "docker_memory_gib": 1, "budget_bytes": 1,
        "inputs": {"tensor_parallel_size": 1, "max_model_len": 1024, "max_num_seqs": 4, "max_num_batched_tokens": 1024,
                   "mtp_enabled": False, "mtp_num_speculative_tokens": 0, "kv_cache_dtype": "auto"}}
PLAY = """
- name: First play
  hosts: sparks
  gather_facts: false
  tasks:
    - name: Every role's values
      ansible.builtin.include_role:
        name: sparkops.appliance.preflight
        tasks_from: inputs
    - name: Each role's checks
      ansible.builtin.include_role:
        name: "sparkops.appliance.{{ item }}"
        tasks_from: validate
      loop: [serve, memwatch]
"""


def _literal(path):
    with open(os.path.join(ROOT, path)) as handle:
        return {k: v for k, v in (yaml.safe_load(handle) or {}).items() if "{{" not in str(v)}


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checks-as-data")
    base = dict(_literal("inventories/example/group_vars/sparks/main.yml"),
                **_literal("inventories/lab/group_vars/sparks/lab_overrides.yml"))
    # the example's key comes from its vault (a template _literal leaves out); the lab's override
    # file sets vault_serve_api_key
    example_key = yaml.safe_load(open(os.path.join(ROOT, "inventories/example/group_vars/sparks/main.yml")))["serve_api_key"]
    assert example_key == "{{ vault_serve_api_key }}" and base["vault_serve_api_key"]
    base.update(spark_memory_plan=PLAN, ansible_facts={"architecture": "aarch64"}, serve_api_key=example_key)
    assert base["serve_extra_args"] == ["--enforce-eager", "--distributed-executor-backend", "uni"]
    hosts = {case_id: dict(base, **extra) for case_id, extra, _var in CASES}
    hosts["good"] = base
    hosts.update((case_id, dict(base, **extra)) for case_id, extra in OPEN_WITHOUT_KEY)
    (tmp / "play.yml").write_text(PLAY)
    return play_json(tmp / "play.yml", inventory=batch_inventory(tmp, hosts))


def test_the_lab_values_pass(doc):
    assert host_results(doc, "good") and host_failure(doc, "good") is None


@pytest.mark.parametrize("case_id", [c[0] for c in OPEN_WITHOUT_KEY])
def test_no_key_passes_on_loopback_or_behind_a_gateway(doc, case_id):
    assert host_results(doc, case_id) and host_failure(doc, case_id) is None


def test_the_sweep_holds_these_cases():
    """The first five are the sweep's own (read from its CASES: that module needs Molecule to import)."""
    with open(SWEEP) as handle:
        tree = ast.parse(handle.read())
    sweep = [ast.literal_eval(node.value) for node in tree.body
             if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CASES"][0]
    for case in CASES[:5]:
        assert case in sweep


@pytest.mark.parametrize("case_id, extra, variable", CASES, ids=[c[0] for c in CASES])
def test_each_case_is_refused_naming_its_variable(doc, case_id, extra, variable):
    failure = host_failure(doc, case_id)
    assert failure, case_id
    assert (variable + " = ") in failure["msg"] and "Fix: " in failure["msg"], failure["msg"]
