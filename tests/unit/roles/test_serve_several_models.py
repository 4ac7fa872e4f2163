"""The serve role's checks with spark_models (several models on one Spark, SPEC §13): a single Spark
with models passes them (each model gets its share of the host plan in tasks/models.yml, not the
single-model spark_memory_plan); a pair's node with models is refused before any change, naming the
variable and the fix."""
import pytest

from harness import host_results, validate_batch

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
