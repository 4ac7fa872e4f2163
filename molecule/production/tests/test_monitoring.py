"""The monitoring role on the lab Spark, which is its own monitoring host (docs/monitoring.md): the
node exporter serves memwatch's, liveness' and the plan's textfiles; Prometheus scrapes the node
exporter and the server, every target up, read from its HTTP API; the alert rules are loaded."""
import json
import os
import re
import time

import testinfra.utils.ansible_runner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("all")

ALERTS = {"SparkHostDown", "SparkServerDown", "SparkServerRestartLoop", "SparkLivenessFailing", "SparkMemwatchFired",
          "SparkMemAvailableLow", "SparkKvCacheFull", "SparkMemoryGrowing", "SparkPairWorkerLost",
          "SparkKvPoolOffPlan", "SparkGatewayModelWithoutServer"}


def _get(host, url):
    script = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    return host.check_output("python3 -c %s %s" % (json.dumps(script), json.dumps(url)))


def _address(host):
    return host.ansible.get_variables()["monitoring_address"]


def test_the_node_exporter_serves_the_textfiles_on_the_management_address(host):
    text = _get(host, "http://%s:9100/metrics" % _address(host))
    # the systemd collector reads the serve unit (its value depends on what the tests before did to it)
    for name in ("memwatch_rule_threshold_bytes", "sparkops_plan_kv_cache_bytes", "sparkops_serve_liveness_state",
                 "sparkops_serve_kv_plan_bytes", "sparkops_serve_kv_pool_bytes",
                 'node_systemd_unit_state{name="sparkops-serve.service",state="active"',
                 'node_systemd_service_restart_total{name="sparkops-serve.service"}',
                 "node_textfile_scrape_error 0"):
        assert name in text, name
    assert not host.socket("tcp://0.0.0.0:9100").is_listening
    # the KV pool the real vLLM logged at its start, read by the serve unit's helper, within the
    # rollout gate's tolerance of the plan's (SparkKvPoolOffPlan quiet)
    values = dict(re.findall(r"^sparkops_serve_kv_(plan|pool)_bytes\{[^}]*\} (\S+)$", text, re.M))
    assert abs(float(values["pool"]) - float(values["plan"])) <= 0.10 * float(values["plan"]), values


def test_prometheus_scrapes_every_target_up(host):
    url = "http://%s:9090/api/v1/targets" % _address(host)
    deadline = time.time() + 180
    while True:
        targets = json.loads(_get(host, url))["data"]["activeTargets"]
        health = {(t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in targets}
        if health and set(health.values()) == {"up"} or time.time() > deadline:
            break
        time.sleep(5)
    name = host.backend.get_hostname()
    assert health == {("node", name): "up", ("vllm", name): "up"}, targets


def test_prometheus_loaded_every_alert_and_reads_the_plan(host):
    rules = json.loads(_get(host, "http://%s:9090/api/v1/rules" % _address(host)))["data"]["groups"]
    assert {r["name"] for g in rules for r in g["rules"] if r["type"] == "alerting"} == ALERTS
    deadline = time.time() + 60
    while True:
        result = json.loads(_get(host, "http://%s:9090/api/v1/query?query=sparkops_plan_kv_cache_bytes" % _address(host)))
        if result["data"]["result"] or time.time() > deadline:
            break
        time.sleep(5)
    assert float(result["data"]["result"][0]["value"][1]) > 0
