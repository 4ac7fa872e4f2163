"""playbooks/status.yml (docs/monitoring.md, the status view): one reading per host, one table, the
same as JSON under the report folder, and a non-zero exit status when a host is unhealthy.

The hosts are this machine (local connection), each with its own files (liveness, plan report,
memwatch's configuration and log, the image tags, a meminfo); systemctl and journalctl are stand-ins
on PATH that answer per unit name (no systemd here)."""
import json
import os
import stat
import sys

import pytest

from harness import ROOT, ansible_env, batch_inventory, host_results, play_json

sys.path.insert(0, os.path.join(ROOT, "playbooks", "files"))
import status_probe  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.sparkops.appliance.plugins.filter.status_table import COLUMNS, status_table  # noqa: E402

GIB_KB = 1048576

SYSTEMCTL = """#!%s
import json, sys
units = json.load(open(%r))
unit = sys.argv[2]
props = sys.argv[4].split(",")
for prop in props:
    print("%%s=%%s" %% (prop, units.get(unit, {}).get(prop, "")))
"""
JOURNALCTL = """#!%s
import json, sys
restarts = json.load(open(%r))
unit = sys.argv[sys.argv.index("-u") + 1]
for _ in range(restarts.get(unit, 0)):
    print(json.dumps({"MESSAGE": "Scheduled restart job"}))
"""


def fake(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def host_files(tmp_path, name, liveness, avail_gib, free_gib, events):
    base = tmp_path / name
    (base / "live").mkdir(parents=True)
    (base / "live" / "state.json").write_text(json.dumps({"state": liveness, "reason": ""}))
    (base / "report.json").write_text(json.dumps({"image": "sparkops/vllm-runtime:aaa",
                                                  "plan": {"gmu": 0.812, "kv_exp_gib": 20.5},
                                                  "actual": {"kv_cache_gib": 20.25}}))
    (base / "memwatch.json").write_text(json.dumps({"available_lt_gib": 6.0, "available_and_free_available_lt_gib": 10.0,
                                                    "available_and_free_free_lt_gib": 2.0}))
    (base / "log").mkdir()
    (base / "log" / "memwatch.log").write_text("".join(json.dumps(e) + "\n" for e in events))
    (base / "image").mkdir()
    (base / "image" / "state.json").write_text(json.dumps({"current": "sparkops/vllm-runtime:bbb",
                                                           "previous": "sparkops/vllm-runtime:aaa"}))
    (base / "meminfo").write_text("MemTotal: %d kB\nMemFree: %d kB\nMemAvailable: %d kB\n"
                                  % (120 * GIB_KB, free_gib * GIB_KB, avail_gib * GIB_KB))
    return {"spark_serve_unit_name": "srv-" + name, "serve_liveness_dir": str(base / "live"),
            "serve_report_path": str(base / "report.json"), "memwatch_config_path": str(base / "memwatch.json"),
            "memwatch_log_dir": str(base / "log"), "runtime_image_build_dir": str(base / "image"),
            "status_meminfo_path": str(base / "meminfo"), "memwatch_unit_name": "mw-%s.service" % name}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("status")
    units = {
        "srv-good.service": {"ActiveState": "active", "SubState": "running", "ActiveEnterTimestamp": "Thu 2026-12-03 05:00:00 UTC",
                             "NRestarts": "0"},
        "srv-bad.service": {"ActiveState": "failed", "SubState": "failed", "NRestarts": "4"},
        "mw-good.service": {"ActiveState": "active"}, "mw-bad.service": {"ActiveState": "active"},
        "srv-good-recycle.timer": {"ActiveState": "active", "NextElapseUSecRealtime": "1796274000000000"},
    }
    (tmp_path / "units.json").write_text(json.dumps(units))
    (tmp_path / "restarts.json").write_text(json.dumps({"srv-bad.service": 4}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir / "systemctl", SYSTEMCTL % (sys.executable, str(tmp_path / "units.json")))
    fake(bin_dir / "journalctl", JOURNALCTL % (sys.executable, str(tmp_path / "restarts.json")))
    hosts = {
        "good": host_files(tmp_path, "good", "live", 80, 40, [{"ts": "2026-12-01T01:00:00Z", "event": "rearmed"}]),
        "bad": host_files(tmp_path, "bad", "given_up", 5, 1,
                          [{"ts": "2026-12-03T04:00:00Z", "event": "fired", "rule": "available"},
                           {"ts": "2026-12-03T04:00:01Z", "event": "sample"}]),
    }
    report = tmp_path / "report"
    doc = play_json(os.path.join(ROOT, "playbooks", "status.yml"), inventory=batch_inventory(tmp_path, hosts),
                    extra_vars={"status_report_dir": str(report)}, connection=None,
                    env=ansible_env(PATH=str(bin_dir) + os.pathsep + os.environ["PATH"]))
    rows = {r["host"]: r for r in json.loads((report / "status.json").read_text())}
    return {"doc": doc, "rows": rows}


def test_the_json_holds_one_reading_per_host(run):
    good, bad = run["rows"]["good"], run["rows"]["bad"]
    assert (good["kind"], good["state"], good["liveness"], good["restarts_24h"]) == ("single", "active", "live", 0)
    assert good["since"] == "Thu 2026-12-03 05:00:00 UTC"
    assert (good["image"], good["image_previous"]) == ("sparkops/vllm-runtime:bbb", "sparkops/vllm-runtime:aaa")
    assert (good["plan_gmu"], good["plan_kv_gib"], good["actual_kv_gib"]) == (0.812, 20.5, 20.25)
    assert (good["mem_available_gib"], good["mem_free_gib"], good["memwatch_available_lt_gib"]) == (80, 40, 6.0)
    assert good["memwatch_last_event"] == {"ts": "2026-12-01T01:00:00Z", "event": "rearmed"}
    assert good["next_recycle"] == "2026-12-03T05:00:00Z"   # 1796274000 s after the epoch
    assert good["problems"] == []
    assert (bad["state"], bad["restarts_24h"], bad["liveness"]) == ("failed", 4, "given_up")
    assert bad["memwatch_last_event"] == {"ts": "2026-12-03T04:00:00Z", "event": "fired", "rule": "available"}
    assert bad["next_recycle"] is None
    assert bad["problems"] == ["srv-bad.service is failed", "liveness given_up", "MemAvailable 5.00 GiB under memwatch's 6.00 GiB",
                               "MemAvailable and MemFree under memwatch's rule B"]


def test_an_unhealthy_host_fails_the_run_and_a_healthy_one_does_not(run):
    stats = run["doc"]["stats"]
    assert stats["bad"]["failures"] == 1 and stats["good"]["failures"] == 0
    # nothing changes on a host: the only changes are the report's, on the controller
    changed = {t for h in ("good", "bad") for _p, t, r in host_results(run["doc"], h) if r.get("changed")}
    assert changed <= {"The status folder", "The fleet's status as JSON"}
    (failed,) = [r for _p, _t, r in host_results(run["doc"], "bad") if r.get("failed")]
    assert "bad is unhealthy: srv-bad.service is failed; liveness given_up" in failed["msg"]


def test_the_table_has_a_line_per_host(run):
    (table,) = [r["msg"] for _p, t, r in host_results(run["doc"], "good") if t == "The fleet's status"]
    assert table[0].split()[0] == "host" and len(table) == 3
    good = [line for line in table if line.startswith("good ")][0]
    assert "bbb (aaa)" in good and "0.812" in good and "20.500/20.250" in good and good.endswith("ok")


def test_the_table_filter_refuses_what_is_not_a_list_of_readings():
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError):
        status_table("not a list")
    assert len(status_table([])) == 1 and status_table([])[0].split("  ")[0] == COLUMNS[0]


def test_a_worker_is_read_by_its_ray_unit_and_has_no_liveness():
    row = {"unit": "sparkops-ray.service", "state": "active", "liveness": "stalled", "memwatch": "active",
           "mem_available_gib": 50, "mem_free_gib": 20, "memwatch_available_lt_gib": 6,
           "memwatch_available_and_free_available_lt_gib": 10, "memwatch_available_and_free_free_lt_gib": 2}
    assert status_probe.problems(row, "worker") == []
    assert status_probe.problems(row, "head") == ["liveness stalled"]


def test_a_spark_with_several_models_has_a_reading_per_model_in_one_call(tmp_path):
    """spark_models: each model's server read by the serve role's names (its unit, liveness, report),
    in the one probe call; the host is unhealthy when one model's server is."""
    units = {"srv-two-chat.service": {"ActiveState": "active", "SubState": "running", "NRestarts": "0"},
             "srv-two-embed.service": {"ActiveState": "inactive", "SubState": "dead", "NRestarts": "0"},
             "mw-two.service": {"ActiveState": "active"}}
    (tmp_path / "units.json").write_text(json.dumps(units))
    (tmp_path / "restarts.json").write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir / "systemctl", SYSTEMCTL % (sys.executable, str(tmp_path / "units.json")))
    fake(bin_dir / "journalctl", JOURNALCTL % (sys.executable, str(tmp_path / "restarts.json")))
    two = host_files(tmp_path, "two", "live", 80, 40, [])
    base = tmp_path / "two"
    for name, kv in (("chat", 20.0), ("embed", 2.0)):
        (base / ("srv-two-%s-liveness" % name)).mkdir()
        (base / ("srv-two-%s-liveness" % name) / "state.json").write_text(json.dumps({"state": "live"}))
        (base / ("srv-two-%s-plan-vs-actual.json" % name)).write_text(json.dumps({"plan": {"kv_exp_gib": kv},
                                                                                  "actual": {"kv_cache_gib": kv}}))
    two["spark_models"] = [{"name": "chat", "priority": 10, "port": 8000}, {"name": "embed", "priority": 5, "port": 8001}]
    report = tmp_path / "report"
    doc = play_json(os.path.join(ROOT, "playbooks", "status.yml"), inventory=batch_inventory(tmp_path, {"two": two}),
                    extra_vars={"status_report_dir": str(report)}, connection=None,
                    env=ansible_env(PATH=str(bin_dir) + os.pathsep + os.environ["PATH"]))
    rows = json.loads((report / "status.json").read_text())
    assert [(r["host"], r["model"], r["unit"], r["state"], r["actual_kv_gib"]) for r in rows] == [
        ("two", "chat", "srv-two-chat.service", "active", 20.0), ("two", "embed", "srv-two-embed.service", "inactive", 2.0)]
    assert rows[0]["problems"] == [] and rows[1]["problems"] == ["srv-two-embed.service is inactive"]
    scripts = [t for _p, t, _r in host_results(doc, "two") if t == "Read the host (one call)"]
    assert len(scripts) == 1
    (failed,) = [r for _p, _t, r in host_results(doc, "two") if r.get("failed")]
    assert "two is unhealthy: srv-two-embed.service is inactive" in failed["msg"]
    (table,) = [r["msg"] for _p, t, r in host_results(doc, "two") if t == "The fleet's status"]
    assert len(table) == 3 and table[1].startswith("two chat") and table[2].startswith("two embed")
