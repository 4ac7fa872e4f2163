"""The serve role's checks with spark_models (several models on one Spark, SPEC §13): a single Spark
with models passes them (each model gets its share of the host plan in tasks/models.yml, not the
single-model spark_memory_plan); a pair's node with models is refused before any change, naming the
variable and the fix."""
import pytest

from harness import batch_inventory, host_results, play_json, validate_batch

MODELS = [{"name": "chat", "priority": 10, "port": 8000}, {"name": "embed", "priority": 5, "port": 8001}]


@pytest.fixture(name="doc", scope="module")
def fixture_doc(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("serve-models")
    return validate_batch(tmp_path, "serve", {
        "two-models": {"spark_models": MODELS, "serve_api_key": "a-key"},   # closed by default: a key
        "pair-head": {"spark_models": MODELS, "cluster_role": "head", "cluster_name": "pair_a"},
        "one-model": {}})


def failures(doc, host):
    return [(task, r.get("msg", "")) for _p, task, r in host_results(doc, host) if r.get("failed")]


def test_a_single_spark_with_several_models_passes_the_checks(doc):
    assert failures(doc, "two-models") == []


def test_several_models_on_a_pairs_node_are_refused_naming_the_variable_and_the_fix(doc):
    ((task, msg),) = failures(doc, "pair-head")
    assert task.endswith("Refuse several models on a pair's node"), task
    assert "spark_models on pair-head names 2 model(s)" in msg and "head of the pair pair_a" in msg, msg
    assert "Fix: remove spark_models" in msg, msg


def test_one_model_is_not_refused_by_that_check(doc):
    assert not [t for t, _m in failures(doc, "one-model") if "several models" in t]


GATEWAY_FACTS = """\
- name: What a gateway reads of the servers
  hosts: sparks
  gather_facts: false
  roles:
    - role: sparkops.appliance.common
  tasks:
    - name: The serve role's gateway facts
      ansible.builtin.include_role:
        name: sparkops.appliance.serve
        tasks_from: gateway_facts
    - name: Show them
      ansible.builtin.debug:
        var: spark_serve_models
"""


def test_each_models_server_is_on_its_port_and_agent_port_for_the_gateway(tmp_path):
    """gateway_facts gives each model's server its own port and agent port: serve_agent_port plus its
    place in spark_models, the same figure the serve loop gives each model's agent (serve_instances)."""
    play = tmp_path / "facts.yml"
    play.write_text(GATEWAY_FACTS)
    hosts = {"two": {"spark_models": MODELS, "serve_api_key": "k", "serve_agent_port": 9100, "serve_agent_enabled": True},
             "off": {"spark_models": MODELS, "serve_api_key": "k", "serve_agent_enabled": False}}
    doc = play_json(str(play), inventory=batch_inventory(tmp_path, hosts), connection=None)
    shown = {host: [r for _p, t, r in host_results(doc, host) if t == "Show them"][0]["spark_serve_models"]
             for host in hosts}
    assert [(s["model"], s["gateway"]["port"], s["gateway"]["agent_port"]) for s in shown["two"]] == [
        ("chat", 8000, 9100), ("embed", 8001, 9101)]
    assert [s["gateway"]["agent_port"] for s in shown["off"]] == [0, 0]
