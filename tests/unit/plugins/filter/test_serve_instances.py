# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serve_instances: the names every role gives a host's servers (one source for serve and memwatch)."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.serve_instances import serve_instances

MODELS = [
    {"name": "chat", "priority": 10, "port": 8000, "weight_bytes": 1},
    {"name": "embed", "priority": 5, "port": 8001, "weight_bytes": 1},
    {"name": "rerank", "priority": 7, "port": 8002, "weight_bytes": 1},
]


def test_a_host_without_models_has_its_one_server_under_the_shared_names():
    assert serve_instances([], "sparkops-serve", "sparkops-vllm") == [
        {"name": "", "priority": 0, "port": None, "unit": "sparkops-serve", "container": "sparkops-vllm"}]
    assert serve_instances(None, "u", "c")[0]["unit"] == "u"


def test_each_model_gets_its_own_unit_and_container_in_the_given_order():
    got = serve_instances(MODELS, "sparkops-serve", "sparkops-vllm")
    assert [(i["name"], i["unit"], i["container"], i["port"]) for i in got] == [
        ("chat", "sparkops-serve-chat", "sparkops-vllm-chat", 8000),
        ("embed", "sparkops-serve-embed", "sparkops-vllm-embed", 8001),
        ("rerank", "sparkops-serve-rerank", "sparkops-vllm-rerank", 8002)]


def test_stop_order_is_lowest_priority_first():
    got = serve_instances(MODELS, "s", "v", order="stop")
    assert [i["name"] for i in got] == ["embed", "rerank", "chat"]


@pytest.mark.parametrize("models, unit, container, order, needle", [
    ([{"name": "Chat", "priority": 1}], "s", "v", "start", "spark_models[0].name"),
    ([{"name": "a", "priority": 1}, {"name": "a", "priority": 2}], "s", "v", "start", "spark_models[1].name"),
    ([{"name": "a", "priority": "1"}], "s", "v", "start", "spark_models[0].priority"),
    ([{"name": "a", "priority": 1}], "bad name", "v", "start", "spark_serve_unit_name"),
    ([{"name": "a", "priority": 1}], "s", "", "start", "spark_serve_container_name"),
    ([{"name": "a", "priority": 1}], "s", "v", "last", "order"),
    ({"name": "a"}, "s", "v", "start", "spark_models is"),
])
def test_bad_input_is_refused_naming_what_to_fix(models, unit, container, order, needle):
    with pytest.raises(AnsibleFilterError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        serve_instances(models, unit, container, order=order)
