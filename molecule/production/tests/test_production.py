"""What a user of the example inventory gets on a lab Spark after site.yml: the host tuned, the
model served with the plan's KV pool, memwatch watching the real server by its real name, check
mode that changes nothing, and memwatch stopping the real server gracefully under a drill."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest
import testinfra.utils.ansible_runner
from test_args_memo import _memo, _parser_result, _task_status   # this folder is on sys.path (pytest's rootdir-less import)
from test_every_playbook import playbook
from test_monitoring import _address, _get

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
sys.path.insert(0, os.path.join(PROJECT, "tests", "support"))
from lab_key import curl_auth  # noqa: E402 (tests/support is put on the path just above)
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("all")

UNIT = "sparkops-serve"          # spark_serve_unit_name's default (roles/common)
# Files and units that site.yml owns on a Spark: check mode and refused input must leave them be.
OWNED = ("/etc/sysctl.d/90-sparkops.conf /etc/fstab /etc/sparkops/* /etc/systemd/system/sparkops-* "
         "/etc/systemd/system/memwatch.service /usr/local/bin/memwatch /usr/local/sbin/sparkops-* "
         "/var/lib/sparkops/runtime-image/state.json")


def _playbook(book, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    cmd = ["ansible-playbook", "-i", INVENTORY, book] + list(extra)
    return subprocess.run(cmd, env=env, cwd=PROJECT, capture_output=True, text=True, timeout=900, check=False)


def _site(*extra):
    return _playbook(os.path.join(PROJECT, "playbooks", "site.yml"), *extra)


def owned_files_digest(host):
    """sha256 of every file site.yml owns on the host, as one listing."""
    return host.check_output("sha256sum %s 2>/dev/null | sort -k2 || true" % OWNED)


def _wait(what, check, timeout=180):
    """Wait for the state an assertion is about, with a bound."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError("timed out after %d s waiting for %s" % (timeout, what))


def _unit(host, unit, *props):
    out = host.check_output("systemctl show -p %s %s" % (",".join(props), unit))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_sysctl_file_has_the_settings(host):
    conf = host.file("/etc/sysctl.d/90-sparkops.conf")
    assert conf.exists and conf.user == "root" and conf.mode == 0o644
    settings = dict(
        (key.strip(), value.strip())
        for key, _sep, value in (
            line.partition("=") for line in conf.content_string.splitlines()
            if line.strip() and not line.startswith("#")
        )
    )
    assert settings == {"vm.min_free_kbytes": "65536", "vm.vfs_cache_pressure": "200"}


def test_no_active_swap_line_in_fstab(host):
    fstab = host.file("/etc/fstab").content_string
    active = [line for line in fstab.splitlines()
              if line.strip() and not line.lstrip().startswith("#") and line.split()[2:3] == ["swap"]]
    assert active == []
    # The image ships a swap line: it is still there, commented out with the reason.
    assert re.search(r"^# disabled by sparkops\.appliance .*/swap\.img\s+none\s+swap", fstab, re.M)
    # (Live swap is the kernel's, shared by every container of this machine: a lab Spark cannot
    # have swap of its own, so `swapoff -a` is not observable here; the fstab line is.)


def test_jemalloc_present(host):
    assert host.package("libjemalloc2").is_installed
    libs = host.run("ldconfig -p").stdout
    assert re.search(r"libjemalloc\.so\.2 .*=> /", libs)


def test_the_api_is_closed_without_the_key(host):
    """The example inventory's key (from its vault; the lab's override file) is required on /v1:
    without it, or with another, vLLM answers 401; /health stays open for the probes."""
    code = "curl -s -o /dev/null -w '%{http_code}' --max-time 30 "
    assert host.check_output(code + "http://127.0.0.1:8000/v1/models") == "401"
    assert host.check_output(code + "-H 'Authorization: Bearer wrong' http://127.0.0.1:8000/v1/models") == "401"
    assert host.check_output(code + curl_auth() + " http://127.0.0.1:8000/v1/models") == "200"
    assert host.check_output(code + "http://127.0.0.1:8000/health") == "200"


def test_the_whole_flow_serves_the_model(host):
    # site.yml fetched the checkpoint, planned, built the runtime image and started the unit.
    assert host.service(UNIT).is_running
    out = host.check_output(
        "curl -sf http://127.0.0.1:8000/v1/completions " + curl_auth() + " -H 'Content-Type: application/json' "
        "-d '{\"model\": \"tiny-llama\", \"prompt\": \"hello\", \"max_tokens\": 4}'")
    body = json.loads(out)
    assert body["choices"][0]["finish_reason"] == "length"
    report = json.loads(host.file("/var/lib/sparkops/serve/plan-vs-actual.json").content_string)
    # vLLM sized its KV pool from the plan's --kv-cache-memory-bytes (block rounding aside).
    planned = report["plan"]["kv_cache_memory_bytes"] / 2 ** 30
    assert abs(report["actual"]["kv_cache_gib"] - planned) < 0.1 * planned
    assert host.service("memwatch").is_running


def test_memwatch_watches_the_container_that_serve_runs(host):
    # memwatch runs in a play of its own: the names must be the serve role's, not a fallback.
    config = json.loads(host.file("/etc/sparkops/memwatch.json").content_string)
    container = "sparkops-vllm-" + host.backend.get_hostname()   # spark_serve_container_name (lab)
    assert config["targets"] == [{"name": "", "unit": UNIT + ".service", "container": container, "priority": 0}]
    running = host.check_output("docker inspect -f '{{.State.Running}}' %s" % container)
    assert running == "true"


def test_check_mode_on_the_converged_spark_changes_nothing(host):
    before = owned_files_digest(host)
    invocation = _unit(host, UNIT, "InvocationID")["InvocationID"]
    result = _site("--check", "--diff")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    recap = re.search(r"^%s\s+: ok=\d+\s+changed=(\d+)" % re.escape(host.backend.get_hostname()), out, re.M)
    assert recap and recap.group(1) == "0", out[-4000:]
    assert owned_files_digest(host) == before
    assert _unit(host, UNIT, "InvocationID")["InvocationID"] == invocation   # not restarted
    # the first play's forecast of what this run restarts (roles/preflight/tasks/restarts.yml) renders
    # the unit and env as the serve play would: on the converged Spark, nothing
    assert "site.yml restarts the server serving now" not in out, out[-4000:]


def test_y_one_changed_flag_runs_the_parser_again_and_the_next_run_skips_it(host):
    """After the checks above that need the converged line; the drill below stops this server anyway.

    The run after the change also shows that a re-converge asks systemd only where a unit is not
    as wanted: memwatch stopped and the recycle timer disabled by hand are started and enabled
    again, while the serve unit, enabled and running, is not asked (its task is skipped)."""
    before = _memo(host)
    changed = _site("-e", '{"serve_max_num_seqs": 7}')
    out = changed.stdout + changed.stderr
    assert changed.returncode == 0, out[-4000:]
    # one server: said, not refused, before any phase ran
    # (the YAML result format folds a long message over lines: compared with its whitespace as one space)
    assert ("site.yml restarts the server serving now on %s (its unit or environment changes)" % host.backend.get_hostname()
            in " ".join(out.split())), out[-4000:]
    assert _parser_result(out) == "ok", out[-4000:]
    memo = json.loads(_memo(host)[0])
    assert memo["args"][memo["args"].index("--max-num-seqs") + 1] == "7"
    assert memo["key"] != json.loads(before[0])["key"]
    # The same line again, a no-op for the server: the parser is skipped and the memo is not
    # rewritten (same content, same file). Only the two units stopped here are asked for.
    remembered = _memo(host)
    host.run_test("systemctl stop memwatch.service && systemctl disable --now %s-recycle.timer" % UNIT)
    again = _site("-e", '{"serve_max_num_seqs": 7}')
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert "site.yml restarts the server serving now" not in out, out[-4000:]
    assert _parser_result(out) == "skipping", out[-4000:]
    assert _memo(host) == remembered
    assert host.service(UNIT).is_running
    assert _task_status(out, "Enable and start the serve unit") == "skipping", out[-4000:]
    assert _task_status(out, "Enable and start memwatch") == "changed", out[-4000:]
    assert _task_status(out, "Enable the drained-recycle timer") == "changed", out[-4000:]
    assert host.service("memwatch").is_running
    timer = host.service(UNIT + "-recycle.timer")
    assert timer.is_enabled and timer.is_running


DRILL_DIR = "/var/lib/sparkops-drill"
KIB_PER_GIB = 1024 * 1024


def _drill_meminfo(host, avail_gib, free_gib):
    text = ("MemTotal:       24683000 kB\\nMemFree:        %d kB\\nMemAvailable:   %d kB\\n"
            "Cached:         3000000 kB\\nAnonPages:      3000000 kB\\nShmem:          20000 kB\\n"
            "Slab:           900000 kB\\nPageTables:     65000 kB\\n"
            % (free_gib * KIB_PER_GIB, avail_gib * KIB_PER_GIB))
    host.run_test("mkdir -p %s && printf '%s' > %s/meminfo.tmp && mv %s/meminfo.tmp %s/meminfo"
                  % (DRILL_DIR, text, DRILL_DIR, DRILL_DIR, DRILL_DIR))


def test_zz_memwatch_stops_the_real_server_gracefully(host):
    # Runs last (zz): it stops the server that the other tests use.
    container = "sparkops-vllm-" + host.backend.get_hostname()   # spark_serve_container_name (lab)
    _drill_meminfo(host, 12, 8)  # healthy
    drill = _playbook(os.path.join(os.path.dirname(__file__), "..", "memwatch-drill.yml"))
    assert drill.returncode == 0, drill.stdout + drill.stderr
    assert host.service(UNIT).is_running
    archives_before = host.run("ls /var/lib/memwatch/incidents").stdout.split()
    _drill_meminfo(host, 4, 1)  # rule A (and B): MemAvailable < 6 GiB
    # The stop takes up to the 30 s docker stop grace: wait for the unit to be inactive (not merely
    # no longer active: "deactivating" is still inside the grace), then look at the container.
    _wait("the serve unit to be inactive after memwatch's stop",
          lambda: _unit(host, UNIT, "ActiveState")["ActiveState"] in ("inactive", "failed"))
    assert _unit(host, UNIT, "ActiveState")["ActiveState"] == "inactive"   # a clean stop, not a failure
    state = host.check_output("docker inspect -f '{{.State.Running}} {{.State.ExitCode}}' %s 2>/dev/null || true"
                              % container)
    # vLLM exits 0 on SIGTERM (graceful), or --rm removed the container altogether.
    assert state in ("false 0", ""), state
    archives = host.run("ls /var/lib/memwatch/incidents").stdout.split()
    new = [a for a in archives if a not in archives_before]
    assert len(new) == 1, archives
    listing = host.check_output("tar -tzf /var/lib/memwatch/incidents/%s" % new[0])
    assert "container.log" in listing and "memwatch.log" in listing
    # systemd does not restart a unit stopped on request (no ping-pong with Restart=on-failure):
    # wait past RestartSec (+ margin) before saying it did not come back.
    props = _unit(host, UNIT, "RestartUSec", "NRestarts")
    restart_s = float(re.match(r"(\d+)", props["RestartUSec"]).group(1)) if props["RestartUSec"].endswith("s") else 15
    time.sleep(restart_s + 5)
    after = _unit(host, UNIT, "ActiveState", "NRestarts")
    assert after["ActiveState"] == "inactive" and after["NRestarts"] == props["NRestarts"], after
    metrics = host.file("/var/lib/prometheus/node-exporter/memwatch.prom").content_string
    assert 'memwatch_rule_fires_total{rule="available"} 1' in metrics


def _alerts(host):
    """{alertname: state} of Prometheus' alerts now (pending or firing), from its HTTP API."""
    alerts = json.loads(_get(host, "http://%s:9090/api/v1/alerts" % _address(host)))["data"]["alerts"]
    return {a["labels"]["alertname"]: a["state"] for a in alerts}


def _status():
    """status.yml's exit status and its row for the Spark (docs/monitoring.md#the-status-view)."""
    with tempfile.TemporaryDirectory() as tmp:
        rc, out = playbook("status.yml", "-e", json.dumps({"status_report_dir": tmp}))
        with open(os.path.join(tmp, "status.json"), encoding="utf-8") as handle:
            (row,) = json.load(handle)
    return rc, row, out


@pytest.fixture(name="stop_the_server_at_the_end")
def fixture_stop_the_server_at_the_end(host):
    """The vLLM container is a sibling on the lab's Docker engine: the scenario's destroy removes the lab
    Spark, not it. A server left running is found by the next run's names guard, rightly, as a
    container this host's unit does not run."""
    yield
    host.run("systemctl stop %s" % UNIT)


def test_zzz_the_drill_fires_its_alerts_and_status_says_unhealthy_then_healthy_after_recovery(host, stop_the_server_at_the_end):
    # Runs after the memwatch drill (zz), which left the server stopped by memwatch: Prometheus
    # raises SparkMemwatchFired (at once) and SparkServerDown (after its 2 min), and status.yml
    # fails naming the stopped unit. Then the operator's recovery: memory back, the unit started.
    assert _unit(host, UNIT, "ActiveState")["ActiveState"] == "inactive"
    rc, row, out = _status()
    assert rc != 0 and row["state"] == "inactive", out[-3000:]
    assert any(p.startswith(UNIT + ".service is inactive") for p in row["problems"]), row
    assert row["memwatch_last_event"], row
    firing = {"SparkMemwatchFired", "SparkServerDown"}
    _wait("Prometheus to fire %s" % sorted(firing),
          lambda: firing <= {name for name, state in _alerts(host).items() if state == "firing"}, timeout=300)

    _drill_meminfo(host, 12, 8)   # healthy again
    host.run_test("systemctl start %s" % UNIT)
    liveness = "/var/lib/sparkops/serve/%s-liveness/state.json" % UNIT   # serve_liveness_dir's default
    _wait("the restarted server to be live",
          lambda: json.loads(host.file(liveness).content_string or "{}").get("state") == "live", timeout=600)
    rc, row, out = _status()
    assert rc == 0 and row["problems"] == [] and row["state"] == "active", out[-3000:]
    _wait("SparkServerDown to end", lambda: "SparkServerDown" not in _alerts(host), timeout=120)
