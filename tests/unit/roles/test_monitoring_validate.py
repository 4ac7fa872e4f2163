"""The monitoring role's input checks (tasks_from=validate, as site.yml's first play runs them): every bad
value is refused with a message naming the variable, on the controller, before any host change.

One ansible-playbook start checks every case (harness.validate_batch: one local host per case)."""
import os

import pytest

from harness import ROOT, batch_inventory, host_results, play_json, validate_batch

BAD = [
    ({"monitoring_prometheus_retention": "15 days"}, 'monitoring_prometheus_retention = "15 days": not a Prometheus duration'),
    ({"monitoring_prometheus_retention": 15}, "monitoring_prometheus_retention = 15: a whole number, not a string"),
    ({"monitoring_address": "0.0.0.0 --web.x"}, 'monitoring_address = "0.0.0.0 --web.x": not a host name'),
    ({"monitoring_node_exporter_port": 0}, "monitoring_node_exporter_port = 0: below 1"),
    ({"monitoring_prometheus_port": 70000}, "monitoring_prometheus_port = 70000: above 65535"),
    ({"monitoring_alertmanager_webhook_url": "hooks.example/x"}, 'monitoring_alertmanager_webhook_url = "hooks.example/x": not an http(s):// URL'),
    ({"monitoring_alertmanager_webhook_url": "https://h/x", "monitoring_alertmanager_port": 9090},
     "monitoring_prometheus_port and monitoring_alertmanager_port are both 9090"),
    ({"monitoring_kv_cache_usage_pct": 0}, "monitoring_kv_cache_usage_pct = 0: not above 0"),
    ({"monitoring_kv_cache_usage_pct": 120}, "monitoring_kv_cache_usage_pct = 120: above 100"),
    ({"monitoring_mem_available_margin_gib": -1}, "monitoring_mem_available_margin_gib = -1: below 0"),
    ({"monitoring_memory_band_gib": 0}, "monitoring_memory_band_gib = 0: not above 0"),
    ({"monitoring_kv_pool_tolerance_pct": 0}, "monitoring_kv_pool_tolerance_pct = 0: not above 0"),
    ({"monitoring_restart_loop_count": 0}, "monitoring_restart_loop_count = 0: below 1"),
    ({"monitoring_memory_growth_window_h": 0}, "monitoring_memory_growth_window_h = 0: below 1"),
    ({"monitoring_plan_metrics_file": "/var/lib/x/plan.txt"}, 'monitoring_plan_metrics_file = "/var/lib/x/plan.txt": not an absolute path to a *.prom file'),
    ({"monitoring_monitor_group": "mon-itors"}, 'monitoring_monitor_group = "mon-itors": not an inventory group name'),
    ({"spark_textfile_dir": "var/lib/x"}, 'spark_textfile_dir = "var/lib/x": not an absolute path'),
]
GOOD = {"ansible_host": "192.0.2.11", "monitoring_alertmanager_webhook_url": "https://hooks.example/alert",
        "monitoring_prometheus_retention": "30d"}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("monitoring-validate")
    cases = {"bad-%d" % i: extra for i, (extra, _m) in enumerate(BAD)}
    cases["good"] = GOOD
    cases["defaults"] = {}
    return validate_batch(tmp_path, "monitoring", cases)


def validate(doc, host):
    results = [r for _p, _t, r in host_results(doc, host)]
    assert results, "%s ran no task" % host
    messages = [r.get("msg", "") for r in results if r.get("failed")]
    return doc["stats"][host]["failures"] > 0, " | ".join(messages)


@pytest.mark.parametrize("extra, message", BAD, ids=[list(e)[-1] + "-%d" % i for i, (e, _m) in enumerate(BAD)])
def test_bad_value_is_refused_naming_it(batch, extra, message):
    failed, messages = validate(batch, "bad-%d" % BAD.index((extra, message)))
    assert failed
    assert message in messages


@pytest.mark.parametrize("host", ["good", "defaults"])
def test_defaults_and_good_values_pass(batch, host):
    assert validate(batch, host) == (False, "")


@pytest.mark.parametrize("extra, message", [
    ({"monitoring_prometheus_retention": "forever"}, 'monitoring_prometheus_retention = "forever": not a Prometheus duration'),
    ({"monitoring_alertmanager_webhook_url": "https://hooks.example/x", "monitoring_alertmanager_port": 9090},
     "monitoring_prometheus_port and monitoring_alertmanager_port are both 9090"),
])
def test_site_refuses_a_bad_setting_in_its_first_play_before_any_connection(extra, message):
    """The example inventory (its monitors group: spark-01) with one bad monitoring setting: every host
    fails in the first play, on the controller, before facts are gathered."""
    doc = play_json(os.path.join(ROOT, "playbooks", "site.yml"), inventory=os.path.join(ROOT, "inventories", "example"),
                    extra_vars=dict(extra, vault_serve_api_key="not-a-secret"), connection=None)
    assert set(doc["stats"]) == {"spark-01", "spark-02", "spark-03", "spark-04", "spark-pa-head", "spark-pa-worker"}
    for host, stats in doc["stats"].items():
        assert stats["failures"] == 1 and stats["unreachable"] == 0 and stats["changed"] == 0, (host, stats)
    tasks = [task for _play, task, _r in host_results(doc, "spark-01")]
    assert "Gather facts" not in tasks
    messages = [r.get("msg", "") for _p, _t, r in host_results(doc, "spark-01") if r.get("failed")]
    assert any(message in m for m in messages), messages


def test_site_yml_refuses_a_bad_setting_of_a_monitoring_host_that_is_not_a_spark_before_any_change(tmp_path):
    """site.yml's check play for the monitors outside the sparks group (the Sparks' are checked in its
    first play): a bad value ends the run there, and no play that changes a host starts."""
    inventory = batch_inventory(tmp_path, {"mon": {"ansible_host": "192.0.2.50", "monitoring_prometheus_port": 70000}},
                                group="monitors")
    doc = play_json(os.path.join(ROOT, "playbooks", "site.yml"), inventory=inventory)
    results = host_results(doc, "mon")
    failed = [(play, task, r.get("msg", "")) for play, task, r in results if r.get("failed")]
    assert len(failed) == 1 and failed[0][0] == "Preflight - check each monitoring host's inputs", failed
    assert "monitoring_prometheus_port = 70000: above 65535" in failed[0][2], failed
    assert {play for play, _t, _r in results} == {"Preflight - check each monitoring host's inputs"}
    assert not any(r.get("changed") for _p, _t, r in results)
