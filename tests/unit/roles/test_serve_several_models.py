"""The serve role's checks refuse spark_models (several models on one Spark: planned by plan.yml,
SPEC §13, not served yet) before any change, naming the variable and the fix; a host without it
is not refused by that check."""
import pytest

from harness import host_results, validate_batch

MODELS = [{"name": "chat", "priority": 10, "port": 8000}, {"name": "embed", "priority": 5, "port": 8001}]


@pytest.fixture(name="doc", scope="module")
def fixture_doc(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("serve-models")
    return validate_batch(tmp_path, "serve", {"two-models": {"spark_models": MODELS}, "one-model": {}})


def failures(doc, host):
    return [(task, r.get("msg", "")) for _p, task, r in host_results(doc, host) if r.get("failed")]


def test_several_models_are_refused_naming_the_variable_and_the_fix(doc):
    ((task, msg),) = failures(doc, "two-models")
    assert task.endswith("Refuse several models on one Spark (planned by plan.yml, not served yet)"), task
    assert "spark_models on two-models names 2 model(s)" in msg and "Fix: remove spark_models" in msg, msg


def test_one_model_is_not_refused_by_that_check(doc):
    assert not [t for t, _m in failures(doc, "one-model") if "several models" in t]
