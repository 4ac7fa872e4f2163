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


def test_each_server_gets_the_agent_port_plus_its_place_in_the_list_in_either_order():
    assert [i["agent_port"] for i in serve_instances([], "s", "v", agent_port="8090")] == [8090]
    assert [(i["name"], i["agent_port"]) for i in serve_instances(MODELS, "s", "v", agent_port=8090)] == [
        ("chat", 8090), ("embed", 8091), ("rerank", 8092)]
    assert [(i["name"], i["agent_port"]) for i in serve_instances(MODELS, "s", "v", order="stop", agent_port=8090)] == [
        ("embed", 8091), ("rerank", 8092), ("chat", 8090)]
    assert "agent_port" not in serve_instances(MODELS, "s", "v")[0]
    with pytest.raises(AnsibleFilterError, match="serve_agent_port"):
        serve_instances(MODELS, "s", "v", agent_port="x")


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


# --- the names preflight checks: each model's server claims its own ---------------------------

from ansible_collections.sparkops.appliance.plugins.filter.name_clashes import name_clashes  # noqa: E402
from ansible_collections.sparkops.appliance.plugins.filter.serve_instances import serve_claims, serve_stale_instances  # noqa: E402

CLAIM_ARGS = ("/etc/sparkops", "/var/lib/sparkops/serve/plan-vs-actual.json", "/var/cache/sparkops/vllm")


def test_each_model_claims_its_own_unit_container_env_report_and_cache_and_they_do_not_clash():
    claims = serve_claims(serve_instances(MODELS, "sparkops-serve", "sparkops-vllm"), *CLAIM_ARGS)
    names = {(c["kind"], c["name"]) for c in claims}
    for model in ("chat", "embed", "rerank"):
        assert ("unit", "sparkops-serve-%s.service" % model) in names
        assert ("unit", "sparkops-serve-%s-recycle.timer" % model) in names
        assert ("container", "sparkops-vllm-%s" % model) in names
        assert ("file", "/etc/sparkops/sparkops-serve-%s.env" % model) in names
        assert ("file", "/var/lib/sparkops/serve/sparkops-serve-%s-plan-vs-actual.json" % model) in names
        assert ("directory", "/var/cache/sparkops/vllm/%s" % model) in names
    assert ("unit", "sparkops-serve.service") not in names      # the one server's name is not taken
    assert name_clashes(claims) == []


def test_a_model_whose_unit_is_another_models_recycle_unit_is_refused_by_name():
    models = [{"name": "x", "priority": 1, "port": 8000}, {"name": "x-recycle", "priority": 2, "port": 8001}]
    problems = name_clashes(serve_claims(serve_instances(models, "sparkops-serve", "sparkops-vllm"), *CLAIM_ARGS))
    assert problems and "spark_models = x" in problems[0] and "sparkops-serve-x-recycle.service" in problems[0], problems
    assert "rename one of the two models" in problems[0]


# --- what an earlier run left: servers of models no longer named -------------------------------

DIRS = {"config": "/etc/sparkops", "state": "/run/sparkops/serve", "liveness": "/var/lib/sparkops/serve",
        "textfile": "/var/lib/prometheus/node-exporter", "report": "/var/lib/sparkops/serve",
        "cache": "/var/cache/sparkops/vllm"}


def record(*units):
    paths = []
    for unit in units:
        paths += ["/etc/systemd/system/%s.service" % unit, "/etc/sparkops/%s.env" % unit,
                  "/etc/systemd/system/%s-recycle.service" % unit, "/etc/systemd/system/%s-agent.socket" % unit]
    return paths + ["/etc/sparkops/memwatch.json", "/etc/systemd/system/memwatch.service"]


def test_a_removed_model_and_the_one_server_before_it_are_stale_with_their_files():
    now = serve_instances(MODELS[:1], "sparkops-serve", "sparkops-vllm")
    stale = serve_stale_instances(record("sparkops-serve", "sparkops-serve-chat", "sparkops-serve-embed"),
                                  now, "sparkops-serve", "sparkops-vllm", DIRS)
    assert [(s["unit"], s["container"], s["name"]) for s in stale] == [
        ("sparkops-serve-embed", "sparkops-vllm-embed", "embed"), ("sparkops-serve", "sparkops-vllm", "")]
    embed = stale[0]
    assert "/etc/sparkops/sparkops-serve-embed.env" in embed["files"]
    assert "/etc/systemd/system/sparkops-serve-embed-recycle.timer" in embed["files"]
    assert "/var/lib/sparkops/serve/sparkops-serve-embed-plan-vs-actual.json" in embed["files"]
    assert "/var/lib/prometheus/node-exporter/sparkops-serve-embed-liveness.prom" in embed["files"]
    assert embed["dirs"] == ["/var/lib/sparkops/serve/sparkops-serve-embed-liveness", "/var/cache/sparkops/vllm/embed"]
    # the one server's shared report and cache are not its own to remove
    assert "/var/lib/sparkops/serve/plan-vs-actual.json" not in stale[1]["files"]
    assert stale[1]["dirs"] == ["/var/lib/sparkops/serve/sparkops-serve-liveness"]


def test_servers_still_named_and_units_the_collection_did_not_write_are_never_stale():
    now = serve_instances(MODELS, "sparkops-serve", "sparkops-vllm")
    assert serve_stale_instances(record("sparkops-serve-chat", "sparkops-serve-embed"), now, "sparkops-serve",
                                 "sparkops-vllm", DIRS) == []
    # a unit of that shape in the record without its environment file (a recycle unit), or not in the record
    paths = ["/etc/systemd/system/sparkops-serve-old.service", "/etc/systemd/system/sparkops-servex.service"]
    assert serve_stale_instances(paths, now, "sparkops-serve", "sparkops-vllm", DIRS) == []
    # back to one server: every model's is stale, the one server's is not
    one = serve_instances([], "sparkops-serve", "sparkops-vllm")
    stale = serve_stale_instances(record("sparkops-serve", "sparkops-serve-chat"), one, "sparkops-serve", "sparkops-vllm", DIRS)
    assert [s["unit"] for s in stale] == ["sparkops-serve-chat"]


def test_dirs_must_name_every_folder():
    with pytest.raises(AnsibleFilterError, match="dirs"):
        serve_stale_instances([], [], "s", "v", dict(DIRS, cache="relative"))
