"""The monitoring role's alert and recording rules (roles/monitoring/templates/rules.yml.j2), rendered
with the role's defaults by Ansible's own templating and run by the real promtool: every alert is
seen firing and not firing (promtool test rules), and every alert's test is seen failing once with
the rule broken (a mutation: the rule never fires, or always fires). docs/monitoring.md lists the alerts.

promtool comes with Debian's prometheus package (make deps installs it); without it these tests skip.
"""
import copy
import os
import shutil
import subprocess

import pytest
import yaml

from harness import ROOT, trusted

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian's prometheus package; make deps)")

GIB = 1024 ** 3
ROLE = os.path.join(ROOT, "roles", "monitoring")


def _collection_filters():
    """The collection's own filters these templates use (serve_instances names the servers' units), by
    their FQCNs. The Templar here has no collection loader (tests/conftest.py imports the collection as
    a plain package, which Ansible's plugin loader cannot read), so they are given to it directly."""
    from ansible_collections.sparkops.appliance.plugins.filter.serve_instances import FilterModule

    return dict(("sparkops.appliance." + name, func) for name, func in FilterModule().filters().items())


def render(template, **overrides):
    """The template rendered by Ansible with common's and the role's defaults (and vars), as text."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = {}
    for path in (os.path.join(ROOT, "roles", "common", "defaults", "main.yml"), os.path.join(ROLE, "defaults", "main.yml"),
                 os.path.join(ROLE, "vars", "main.yml")):
        variables.update(yaml.safe_load(open(path)) or {})
    variables.update(ansible_managed="Ansible managed", inventory_hostname="mon", groups={"sparks": []}, cluster_role="")
    variables.update(overrides)
    text = open(os.path.join(ROLE, "templates", template)).read()
    templar = Templar(loader=DataLoader(), variables=trusted(variables))
    # (Templar.environment is deprecated in ansible-core 2.19, to go in 2.23: no other way to add a filter)
    templar.environment.filters.update(_collection_filters())
    return templar.template(trust_as_template(text))


def rules(**overrides):
    return yaml.safe_load(render("rules.yml.j2", **overrides))


def alerts(doc):
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def promtool(tmp_path, doc, tests, name="t"):
    """promtool test rules of `tests` against the rules `doc` (annotations dropped: the tests compare labels).
    Returns the CompletedProcess."""
    doc = copy.deepcopy(doc)
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / (name + "-rules.yml")).write_text(yaml.safe_dump(doc))
    (tmp_path / (name + "-test.yml")).write_text(yaml.safe_dump(
        {"rule_files": [name + "-rules.yml"], "evaluation_interval": "15s", "tests": tests}))
    return subprocess.run([PROMTOOL, "test", "rules", name + "-test.yml"], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)


NODE = 'job="node",instance="spark-01",kind="single"'
VLLM = 'job="vllm",instance="spark-01",kind="single"'
WORKER = 'job="node",instance="spark-pa-worker",kind="worker",cluster="pair_a"'
GATEWAY = 'job="gateway",instance="gateway-01",kind="gateway"'
LABELS = {"job": "node", "instance": "spark-01", "kind": "single"}   # an empty label (cluster="") is no label


def case(series, at, fires, labels=None, interval="15s"):
    """One promtool test: input series, the alert evaluated at `at`, firing with `labels` or not."""
    return {"interval": interval, "input_series": [{"series": s, "values": v} for s, v in series],
            "at": at, "fires": fires, "labels": labels}


def memwatch_threshold(gib):
    return ('memwatch_rule_threshold_bytes{%s,rule="available",field="MemAvailable"}' % NODE, "%dx40" % (gib * GIB))


# Each alert: cases that fire and cases that do not (defaults: margin 2 GiB, KV 90 %, 3 restarts in
# 30 min, growth 0.5 GiB over 12 h, serve unit sparkops-serve, Ray unit sparkops-ray).
CASES = {
    "SparkHostDown": [
        case([("up{%s}" % NODE, "0x20")], "3m", True, dict(LABELS)),
        case([("up{%s}" % NODE, "1x20")], "3m", False),
        case([("up{%s}" % NODE, "1x8 0x4")], "3m", False),     # down for 1 minute only
        # the package's default target, scraped before the collection's configuration was installed
        case([('up{job="node",instance="localhost:9100"}', "0x20")], "3m", False),
    ],
    "SparkServerDown": [
        case([("up{%s}" % VLLM, "0x20")], "3m", True, dict(LABELS, job="vllm")),
        case([("up{%s}" % VLLM, "1x20")], "3m", False),
        case([("up{%s}" % NODE, "0x20")], "3m", False),        # the node exporter is another alert
    ],
    "SparkServerRestartLoop": [
        case([('node_systemd_service_restart_total{%s,name="sparkops-serve.service"}' % NODE, "0 0 1 1 2 2 3 3")],
             "105s", True, dict(LABELS, name="sparkops-serve.service")),
        case([('node_systemd_service_restart_total{%s,name="sparkops-serve.service"}' % NODE, "0 0 1 1 2 2 2 2")],
             "105s", False),
        case([('node_systemd_service_restart_total{%s,name="memwatch.service"}' % NODE, "0 0 1 1 2 2 3 3")],
             "105s", False),                                     # another unit
        # a model's server on a Spark with several models (its unit <unit>-<model>)
        case([('node_systemd_service_restart_total{%s,name="sparkops-serve-chat.service"}' % NODE, "0 0 1 1 2 2 3 3")],
             "105s", True, dict(LABELS, name="sparkops-serve-chat.service")),
        case([('node_systemd_service_restart_total{%s,name="sparkops-server.service"}' % NODE, "0 0 1 1 2 2 3 3")],
             "105s", False),                                     # not the unit nor one of its models
        # three restarts, but spread over two hours: not a loop
        case([('node_systemd_service_restart_total{%s,name="sparkops-serve.service"}' % NODE, "0 1 2 3 3 3 3 3")],
             "105m", False, interval="15m"),
    ],
    "SparkLivenessFailing": [
        case([('sparkops_serve_liveness_state{%s,unit="sparkops-serve",state="stalled"}' % NODE, "1x8")],
             "90s", True, dict(LABELS, unit="sparkops-serve", state="stalled")),
        case([('sparkops_serve_liveness_state{%s,unit="sparkops-serve",state="given_up"}' % NODE, "1x8")],
             "90s", True, dict(LABELS, unit="sparkops-serve", state="given_up")),
        case([('sparkops_serve_liveness_state{%s,unit="sparkops-serve",state="stalled"}' % NODE, "0x8"),
              ('sparkops_serve_liveness_state{%s,unit="sparkops-serve",state="live"}' % NODE, "1x8")], "90s", False),
        case([('sparkops_serve_liveness_state{%s,unit="sparkops-serve",state="stalled"}' % NODE, "0x4 1 0x4")],
             "90s", False),                                      # one stalled probe, then live again
    ],
    "SparkMemwatchFired": [
        case([('memwatch_rule_fires_total{%s,rule="available"}' % NODE, "0x4 1x8")], "2m", True,
             dict(LABELS, rule="available")),
        case([('memwatch_rule_fires_total{%s,rule="available"}' % NODE, "1x80")], "20m", False),   # an old firing
        case([('memwatch_rule_fires_total{%s,rule="available"}' % NODE, "0x20")], "3m", False),
    ],
    "SparkMemAvailableLow": [
        case([("node_memory_MemAvailable_bytes{%s}" % NODE, "%dx40" % (7 * GIB)), memwatch_threshold(6)], "2m", True,
             dict(LABELS)),
        case([("node_memory_MemAvailable_bytes{%s}" % NODE, "%dx40" % (9 * GIB)), memwatch_threshold(6)], "2m", False),
        # memwatch's threshold is the host's own: 9 GiB is within 2 GiB of a 8 GiB threshold
        case([("node_memory_MemAvailable_bytes{%s}" % NODE, "%dx40" % (9 * GIB)), memwatch_threshold(8)], "2m", True,
             dict(LABELS)),
        case([("node_memory_MemAvailable_bytes{%s}" % NODE, "%dx2 %dx40" % (9 * GIB, 7 * GIB)), memwatch_threshold(6)],
             "45s", False),                                      # not yet for 1 minute
    ],
    "SparkKvCacheFull": [
        case([('vllm:kv_cache_usage_perc{%s,model_name="m",engine="0"}' % VLLM, "0.95x40")], "6m", True,
             {"instance": "spark-01"}),
        case([('vllm:gpu_cache_usage_perc{%s,model_name="m"}' % VLLM, "0.95x40")], "6m", True, {"instance": "spark-01"}),
        case([('vllm:kv_cache_usage_perc{%s,model_name="m",engine="0"}' % VLLM, "0.85x40")], "6m", False),
        case([('vllm:kv_cache_usage_perc{%s,model_name="m",engine="0"}' % VLLM, "0.3x16 0.95x24")], "6m", False),  # 4 min
    ],
    "SparkMemoryGrowing": [
        # used memory 40 GiB, growing 0.1 GiB an hour for 13 hours: 1.2 GiB over 12 h
        case([("node_memory_MemTotal_bytes{%s}" % NODE, "%dx13" % (120 * GIB)),
              ("node_memory_MemAvailable_bytes{%s}" % NODE, "%d-%dx13" % (80 * GIB, GIB // 10))],
             "13h", True, dict(LABELS), interval="1h"),
        case([("node_memory_MemTotal_bytes{%s}" % NODE, "%dx13" % (120 * GIB)),
              ("node_memory_MemAvailable_bytes{%s}" % NODE, "%dx13" % (80 * GIB))],
             "13h", False, interval="1h"),
        # 0.1 GiB an hour, but for 2 hours only (a new host, Prometheus just started): no window yet
        case([("node_memory_MemTotal_bytes{%s}" % NODE, "_x11 %dx2" % (120 * GIB)),
              ("node_memory_MemAvailable_bytes{%s}" % NODE, "_x11 %d-%dx2" % (80 * GIB, GIB // 10))],
             "13h", False, interval="1h"),
        # 0.02 GiB an hour: 0.24 GiB over 12 h, inside the band
        case([("node_memory_MemTotal_bytes{%s}" % NODE, "%dx13" % (120 * GIB)),
              ("node_memory_MemAvailable_bytes{%s}" % NODE, "%d-%dx13" % (80 * GIB, GIB // 50))],
             "13h", False, interval="1h"),
    ],
    "SparkPairWorkerLost": [
        case([('node_systemd_unit_state{%s,name="sparkops-ray.service",state="active"}' % WORKER, "0x20")], "2m", True,
             {"job": "node", "instance": "spark-pa-worker", "kind": "worker", "cluster": "pair_a",
              "name": "sparkops-ray.service", "state": "active"}),
        case([("up{%s}" % WORKER, "0x20")], "2m", True,
             {"job": "node", "instance": "spark-pa-worker", "kind": "worker", "cluster": "pair_a"}),
        case([('node_systemd_unit_state{%s,name="sparkops-ray.service",state="active"}' % WORKER, "1x20"),
              ("up{%s}" % WORKER, "1x20")], "2m", False),
        # a single Spark runs no Ray worker
        case([('node_systemd_unit_state{%s,name="sparkops-ray.service",state="active"}' % NODE, "0x20")], "2m", False),
    ],
    "SparkKvPoolOffPlan": [
        # plan 1 GiB: 0.8 GiB allocated is 20 % off (tolerance 10 %), 0.95 GiB is 5 %
        case([('sparkops_serve_kv_plan_bytes{%s,unit="sparkops-serve.service"}' % NODE, "%dx10" % GIB),
              ('sparkops_serve_kv_pool_bytes{%s,unit="sparkops-serve.service"}' % NODE, "%dx10" % (GIB * 8 // 10))],
             "2m", True, dict(LABELS, unit="sparkops-serve.service")),
        case([('sparkops_serve_kv_plan_bytes{%s,unit="sparkops-serve.service"}' % NODE, "%dx10" % GIB),
              ('sparkops_serve_kv_pool_bytes{%s,unit="sparkops-serve.service"}' % NODE, "%dx10" % (GIB * 12 // 10))],
             "2m", True, dict(LABELS, unit="sparkops-serve.service")),    # more than planned counts too
        case([('sparkops_serve_kv_plan_bytes{%s,unit="sparkops-serve.service"}' % NODE, "%dx10" % GIB),
              ('sparkops_serve_kv_pool_bytes{%s,unit="sparkops-serve.service"}' % NODE, "%dx10" % (GIB * 95 // 100))],
             "2m", False),
        case([('sparkops_serve_kv_plan_bytes{%s,unit="sparkops-serve.service"}' % NODE, "%dx10" % GIB)],
             "2m", False),                                          # starting: no pool read yet
    ],
    "SparkGatewayModelWithoutServer": [
        case([('haproxy_backend_active_servers{%s,proxy="model_tiny-llama"}' % GATEWAY, "0x20")], "2m", True,
             {"job": "gateway", "instance": "gateway-01", "kind": "gateway", "proxy": "model_tiny-llama"}),
        case([('haproxy_backend_active_servers{%s,proxy="model_tiny-llama"}' % GATEWAY, "1x20")], "2m", False),
        case([('haproxy_backend_active_servers{%s,proxy="model_tiny-llama"}' % GATEWAY, "1x3 0x2 1x15")], "2m",
             False),                                             # a server back within the minute
        case([('haproxy_backend_active_servers{%s,proxy="stats"}' % GATEWAY, "0x20")], "2m", False),  # not a model's
    ],
}


def promtool_tests(alert, doc, cases):
    """promtool's test groups for `cases` of one alert; an alert that fires carries the rule's own labels."""
    rule_labels = alerts(doc)[alert].get("labels") or {}
    out = []
    for c in cases:
        expected = [{"exp_labels": dict(c["labels"], **rule_labels)}] if c["fires"] else []
        out.append({"interval": c["interval"], "input_series": c["input_series"],
                    "alert_rule_test": [{"eval_time": c["at"], "alertname": alert, "exp_alerts": expected}]})
    return out


@pytest.fixture(scope="module")
def doc():
    return rules()


def test_the_rendered_rules_pass_promtool_check(tmp_path, doc):
    path = tmp_path / "rules.yml"
    path.write_text(render("rules.yml.j2"))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_broken_rule_is_refused_by_the_check_the_role_runs(tmp_path):
    """The role installs the rules with validate: promtool check rules %s; a bad expression must fail it."""
    text = render("rules.yml.j2").replace("up{job=\"vllm\", kind!=\"\"} == 0", "up{job=\"vllm\", kind!=\"\" == 0")
    path = tmp_path / "rules.yml"
    path.write_text(text)
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode != 0


def test_every_alert_has_firing_and_quiet_cases(doc):
    assert set(alerts(doc)) == set(CASES)
    for alert, cases in CASES.items():
        assert any(c["fires"] for c in cases) and any(not c["fires"] for c in cases), alert


@pytest.mark.parametrize("alert", sorted(CASES))
def test_alert(tmp_path, doc, alert):
    result = promtool(tmp_path, doc, promtool_tests(alert, doc, CASES[alert]))
    assert result.returncode == 0, result.stdout + result.stderr


MUTATIONS = {
    "never": lambda expr: "(%s) and on() vector(0) == 1" % expr,
    "always": lambda expr: "(%s) or on() label_replace(vector(1), \"instance\", \"spark-01\", \"\", \"\")" % expr,
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("alert", sorted(CASES))
def test_each_alert_test_fails_with_the_rule_broken(tmp_path, doc, alert, mutation):
    """The mutated rule: never firing (the firing cases must fail), or always firing (the quiet ones must)."""
    broken = copy.deepcopy(doc)
    rule = alerts(broken)[alert]
    rule["expr"] = MUTATIONS[mutation](rule["expr"])
    result = promtool(tmp_path, broken, promtool_tests(alert, broken, CASES[alert]))
    assert result.returncode != 0, "%s %s: promtool test rules passed with the rule broken" % (alert, mutation)
    assert "FAILED" in result.stdout + result.stderr


def test_the_recording_rules_give_the_verify_band(tmp_path, doc):
    tests = [{
        "interval": "1h",
        "input_series": [
            {"series": "node_memory_MemTotal_bytes{%s}" % NODE, "values": "%dx13" % (120 * GIB)},
            {"series": "node_memory_MemAvailable_bytes{%s}" % NODE, "values": "%d-%dx13" % (80 * GIB, GIB // 4)}],
        "promql_expr_test": [
            {"expr": "sparkops:memory_used_bytes", "eval_time": "13h",
             "exp_samples": [{"labels": "sparkops:memory_used_bytes{%s}" % NODE,
                              "value": 40 * GIB + 13 * (GIB // 4)}]},
            # the trend of 0.25 GiB an hour over the 12 h window (in MB: the regression over the recorded steps is not exact)
            {"expr": "round(sparkops:memory_used_bytes:growth_window / 1e6)", "eval_time": "13h",
             "exp_samples": [{"labels": "{%s}" % NODE, "value": round(12 * (GIB // 4) / 1e6)}]}],
    }]
    result = promtool(tmp_path, doc, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_take_the_role_settings(tmp_path):
    """A setting changes the rule: with a 4 GiB margin, 9 GiB MemAvailable over a 6 GiB threshold warns."""
    doc = rules(monitoring_mem_available_margin_gib=4, monitoring_kv_cache_usage_pct=80, spark_serve_unit_name="llm")
    cases = {
        "SparkMemAvailableLow": [case([("node_memory_MemAvailable_bytes{%s}" % NODE, "%dx40" % (9 * GIB)),
                                       memwatch_threshold(6)], "2m", True, dict(LABELS))],
        "SparkKvCacheFull": [case([('vllm:kv_cache_usage_perc{%s,model_name="m",engine="0"}' % VLLM, "0.85x40")], "6m",
                                  True, {"instance": "spark-01"})],
        "SparkServerRestartLoop": [case([('node_systemd_service_restart_total{%s,name="llm.service"}' % NODE,
                                          "0 0 1 1 2 2 3 3")], "105s", True, dict(LABELS, name="llm.service"))],
    }
    for alert, alert_cases in cases.items():
        result = promtool(tmp_path, doc, promtool_tests(alert, doc, alert_cases), name=alert)
        assert result.returncode == 0, alert + ": " + result.stdout + result.stderr


# --- the scrape configuration -----------------------------------------------------------------

FLEET = {
    "spark-01": {"ansible_host": "192.0.2.11"},
    "spark-02": {"ansible_host": "192.0.2.12", "serve_port": 8080, "monitoring_node_exporter_port": 9101},
    "spark-pa-head": {"ansible_host": "192.0.2.21", "cluster_role": "head", "cluster_name": "pair_a"},
    "spark-pa-worker": {"ansible_host": "192.0.2.22", "cluster_role": "worker", "cluster_name": "pair_a"},
}


def scrape_config(tmp_path, **overrides):
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(render("rules.yml.j2"))
    hostvars = {h: dict(v, inventory_hostname=h) for h, v in FLEET.items()}
    hostvars["mon"] = {"ansible_host": "192.0.2.50", "inventory_hostname": "mon"}
    hostvars["gw"] = {"ansible_host": "192.0.2.5", "inventory_hostname": "gw"}
    text = render("prometheus.yml.j2", hostvars=hostvars, groups={"sparks": sorted(FLEET), "monitors": ["mon"], "gateways": ["gw"]},
                  monitoring_prometheus_rules_file=str(rules_file), ansible_host="192.0.2.50", **overrides)
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    return path, yaml.safe_load(text)


def targets(config, job):
    (scrape,) = [s for s in config["scrape_configs"] if s["job_name"] == job]
    return {c["labels"]["instance"]: (c["targets"], c["labels"]["kind"]) for c in scrape["static_configs"]}


def test_prometheus_scrapes_every_node_exporter_and_every_server_but_a_worker(tmp_path):
    path, config = scrape_config(tmp_path)
    result = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert targets(config, "node") == {
        "spark-01": (["192.0.2.11:9100"], "single"), "spark-02": (["192.0.2.12:9101"], "single"),
        "spark-pa-head": (["192.0.2.21:9100"], "head"), "spark-pa-worker": (["192.0.2.22:9100"], "worker")}
    assert targets(config, "vllm") == {
        "spark-01": (["192.0.2.11:8000"], "single"), "spark-02": (["192.0.2.12:8080"], "single"),
        "spark-pa-head": (["192.0.2.21:8000"], "head")}
    assert targets(config, "gateway") == {"gw": (["192.0.2.5:8404"], "gateway")}
    assert config["rule_files"] == [str(tmp_path / "rules.yml")]
    assert "alerting" not in config


def test_a_webhook_adds_alertmanager(tmp_path):
    path, config = scrape_config(tmp_path, monitoring_alertmanager_webhook_url="https://hooks.example/alert")
    result = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["192.0.2.50:9093"]


def test_the_listen_addresses_are_the_management_address():
    node = render("node-exporter.default.j2", ansible_host="192.0.2.11", cluster_role="worker")
    (args,) = [line for line in node.splitlines() if line.startswith("ARGS=")]
    assert "--web.listen-address=192.0.2.11:9100 " in args
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter " in args
    assert "--collector.systemd.unit-include=(sparkops-serve[.]service|memwatch[.]service|sparkops-ray[.]service)\"" in args
    # a Spark with several models: each model's server unit (the serve role's names), no unit of the one server
    node = render("node-exporter.default.j2", ansible_host="192.0.2.14",
                  spark_models=[{"name": "chat", "priority": 10, "port": 8000}, {"name": "embed", "priority": 5, "port": 8001}])
    assert ("--collector.systemd.unit-include=(sparkops-serve-chat[.]service|sparkops-serve-embed[.]service|"
            "memwatch[.]service)\"") in node, node
    prom = render("prometheus.default.j2", ansible_host="192.0.2.50", monitoring_prometheus_retention="30d")
    (args,) = [line for line in prom.splitlines() if line.startswith("ARGS=")]
    assert "--web.listen-address=192.0.2.50:9090 " in args and "--storage.tsdb.retention.time=30d\"" in args


@pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool is not installed (Debian's prometheus-alertmanager)")
def test_the_alertmanager_configuration_passes_amtool(tmp_path):
    path = tmp_path / "alertmanager.yml"
    path.write_text(render("alertmanager.yml.j2", monitoring_alertmanager_webhook_url="https://hooks.example/alert"))
    result = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert yaml.safe_load(path.read_text())["receivers"][0]["webhook_configs"] == [{"url": "https://hooks.example/alert"}]
