# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.gateway_backends: one backend per served model from the serving hosts'
spark_serve facts; a pair's worker is no server; what the gateway cannot hold is a problem that
names the variable and the fix."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.gateway_backends import gateway_backend_name, gateway_backends


def serve(model="tiny-llama", key="k1", host="10.0.0.1", port=8000, agent=8090):
    return {"spark_serve": {"model": model, "api_key": key, "gateway": {"host": host, "port": port, "agent_port": agent}}}


def test_one_backend_per_model_in_inventory_order_and_no_worker():
    hostvars = {"a": serve(host="10.0.0.1"), "b": serve(host="10.0.0.2", agent=0), "c": serve(model="org/m2", key="k2"),
                "w": dict(serve(), cluster_role="worker"), "head": dict(serve(host="10.0.0.9"), cluster_role="head")}
    out = gateway_backends(["a", "w", "b", "c", "head"], hostvars)
    assert out["problems"] == [] and out["skipped"] == []
    assert [(b["name"], b["model"], b["api_key"]) for b in out["backends"]] == [
        ("model_tiny-llama", "tiny-llama", "k1"), ("model_org_m2", "org/m2", "k2")]
    assert out["backends"][0]["servers"] == [
        {"name": "a", "host": "10.0.0.1", "port": 8000, "agent_port": 8090},
        {"name": "b", "host": "10.0.0.2", "port": 8000, "agent_port": 0},
        {"name": "head", "host": "10.0.0.9", "port": 8000, "agent_port": 8090}]


def test_a_host_without_its_facts_is_skipped_with_why():
    out = gateway_backends(["a", "b"], {"a": serve(), "b": {}})
    assert [b["name"] for b in out["backends"]] == ["model_tiny-llama"]
    assert out["skipped"] == ["b: no spark_serve fact (the serve role's facts did not run there)"]


@pytest.mark.parametrize("hostvars, needle", [
    ({"a": serve(key="k1"), "b": serve(key="k2")}, "serve_api_key differs between a and b"),
    ({"a": serve(model="m/x"), "b": serve(model="m_x")}, "give the same gateway backend model_m_x"),
    ({"a": serve(model="two words")}, "serve_served_model_name = 'two words' on a"),
    ({"a": serve(host="bad host")}, "serve_gateway_host = 'bad host' on a"),
    ({"a": serve(key='k"1')}, "serve_api_key on a"),
    ({"a b": serve()}, "'a b': the gateway names its servers by inventory name"),
])
def test_what_the_gateway_cannot_hold_is_a_problem_naming_the_variable(hostvars, needle):
    out = gateway_backends(list(hostvars), hostvars)
    assert any(needle in p for p in out["problems"]), out["problems"]
    assert all("Fix:" in p for p in out["problems"])


def test_backend_names():
    assert gateway_backend_name("Qwen/Qwen3-30B-A3B:fp8") == "model_Qwen_Qwen3-30B-A3B:fp8"
    with pytest.raises(AnsibleFilterError):
        gateway_backend_name("")


def test_a_spark_with_several_models_is_a_server_in_each_models_backend():
    models = [{"name": "chat", "priority": 2, "port": 8000}, {"name": "embed", "priority": 1, "port": 8001}]
    two = {"spark_models": models, "spark_serve": serve(model="base")["spark_serve"],   # the shared names' export: not served
           "spark_serve_models": [serve(model="chat", port=8000, agent=8090)["spark_serve"],
                                  serve(model="embed", port=8001, agent=8091)["spark_serve"]]}
    out = gateway_backends(["a", "two"], {"a": serve(model="chat", host="10.0.0.2"), "two": two})
    assert out["problems"] == [] and out["skipped"] == []
    assert {b["model"]: [(s["name"], s["port"], s["agent_port"]) for s in b["servers"]] for b in out["backends"]} == {
        "chat": [("a", 8000, 8090), ("two", 8000, 8090)], "embed": [("two", 8001, 8091)]}
    # its facts not noted: skipped, never served under the shared names
    out = gateway_backends(["two"], {"two": dict(two, spark_serve_models=[])})
    assert out["backends"] == [] and out["skipped"] == ["two: no spark_serve fact (the serve role's facts did not run there)"]
