"""memwatch on a lab Spark, watching a stand-in serving container (a sibling on the host engine).

The tests drive memwatch through the meminfo file and the kernel log file it is configured to
read (/var/lib/memwatch-test/...), then check what a user sees: the container stopped (or
killed after the grace), the incident archive, the metrics file, memwatch's log.
Run in file order: the first incident stops the container converge started; the second one
uses a container that ignores SIGTERM.
"""
import datetime
import json
import time

import pytest
from memwatch_lab import (ARCHIVES, GIB, IGNORE_TERM, METRICS, NAME, NV, TEST_DIR, container_state, events, metrics, put_file,
                          start_the_serve_unit_and_fire, wait_for, write_meminfo)


@pytest.fixture(scope="module", autouse=True)
def cleanup(host):
    yield
    host.run("systemctl stop sparkops-serve.service")
    host.run("docker ps -aq --filter label=sparkops-memwatch-test=1 | xargs -r docker rm -f")


@pytest.fixture(scope="module")
def image(host):
    res = host.run_test("docker inspect -f '{{.Config.Image}}' %s" % NAME)
    return res.stdout.strip()


def test_memwatch_runs_hardened(host):
    svc = host.service("memwatch.service")
    assert svc.is_running and svc.is_enabled
    props = svc.systemd_properties
    assert props["Restart"] == "always"
    assert props["MemoryMax"] == str(128 * 1024 * 1024)
    assert props["OOMScoreAdjust"] == "-500"
    assert props["ProtectSystem"] == "strict"
    assert props["NoNewPrivileges"] == "yes"
    assert props["ProtectKernelLogs"] == "no"   # /dev/kmsg stays readable
    cfg = json.loads(host.file("/etc/sparkops/memwatch.json").content_string)
    assert [t["container"] for t in cfg["targets"]] == [NAME] and cfg["stop_grace_s"] == 3
    assert host.run("/usr/local/bin/memwatch check-config /etc/sparkops/memwatch.json").rc == 0


def test_healthy_memory_keeps_it_armed_and_the_container_running(host, image):
    assert image
    m = wait_for("metrics", lambda: host.file(METRICS).exists and metrics(host))
    assert m["memwatch_armed"] == 1
    assert m['memwatch_meminfo_bytes{field="MemAvailable"}'] == 60 * GIB * 1024
    samples = m["memwatch_samples_total"]
    wait_for("more samples", lambda: metrics(host)["memwatch_samples_total"] > samples)
    assert container_state(host) == (True, 0)


def test_low_memory_stops_the_container_gracefully_and_archives_logs(host, image):
    assert container_state(host)[0] is True
    write_meminfo(host, 5, 3)  # rule A: MemAvailable < 6 GiB
    state = wait_for("the container to stop", lambda: container_state(host) == (False, 0) and container_state(host))
    assert state == (False, 0)  # exit 0: it handled SIGTERM (graceful)
    logs = host.run("docker logs %s" % NAME).stdout
    assert "SIGTERM received" in logs
    action = wait_for("the action log line", lambda: events(host, "action"))[-1]
    assert action["result"] == "stopped"
    assert [s["step"] for s in action["steps"]][-1] == "docker stop -t 3 %s" % NAME
    assert action["steps"][-1]["seconds"] < 3
    archive = action["archive"]
    assert archive.startswith(ARCHIVES + "/memwatch-incident-")
    listing = host.run_test("tar -tzf %s" % archive).stdout
    assert "container.log" in listing and "memwatch.log" in listing and "trace.txt" in listing
    clog = host.run_test("tar -xzOf %s --wildcards '*/container.log'" % archive).stdout
    assert "stand-in vLLM: serving" in clog
    m = metrics(host)
    assert m['memwatch_rule_fires_total{rule="available"}'] == 1
    assert m['memwatch_actions_total{result="stopped"}'] == 1
    assert m["memwatch_armed"] == 0
    assert m['memwatch_meminfo_bytes{field="MemAvailable"}'] == 5 * GIB * 1024
    # one action per incident: still low, no second action
    time.sleep(4)
    assert len(events(host, "action")) == 1


def test_a_container_ignoring_sigterm_is_killed_after_the_grace(host, image):
    host.run_test("docker rm -f %s" % NAME)
    host.run_test("docker run -d --name %s --label sparkops-memwatch-test=1 %s python3 -u -c \"%s\""
                  % (NAME, image, IGNORE_TERM))
    write_meminfo(host, 60, 30)
    wait_for("re-arming after recovery", lambda: metrics(host)["memwatch_armed"] == 1)
    assert container_state(host)[0] is True
    write_meminfo(host, 8, 1)  # rule B: MemAvailable < 10 GiB and MemFree < 2 GiB
    state = wait_for("the container to be killed", lambda: container_state(host) == (False, 137) and container_state(host))
    assert state == (False, 137)  # SIGKILL after the grace
    action = wait_for("the second action", lambda: len(events(host, "action")) == 2 and events(host, "action"))[-1]
    assert action["result"] == "killed"
    assert action["steps"][-1]["seconds"] >= 3
    m = metrics(host)
    assert m['memwatch_rule_fires_total{rule="available_and_free"}'] == 1
    assert m['memwatch_actions_total{result="killed"}'] == 1
    assert len(host.run_test("ls %s" % ARCHIVES).stdout.split()) == 2


def test_nv_err_lines_are_counted_once_across_restarts(host):
    for i in (1, 2):
        host.run_test("echo '%s' >> %s/kern.log" % (NV % i, TEST_DIR))
    wait_for("2 NV_ERR lines", lambda: metrics(host)["memwatch_nv_err_no_memory_total"] == 2)
    host.run_test("systemctl restart memwatch.service")
    host.run_test("echo '%s' >> %s/kern.log" % (NV % 3, TEST_DIR))
    wait_for("3 NV_ERR lines", lambda: metrics(host)["memwatch_nv_err_no_memory_total"] == 3)
    time.sleep(3)
    assert metrics(host)["memwatch_nv_err_no_memory_total"] == 3
    assert metrics(host)['memwatch_kernel_log_readable{source="file"}'] == 1


SERVE_UNIT = """[Unit]
Description=stand-in serving unit for the memwatch test
[Service]
ExecStartPre=-/usr/bin/docker rm -f {name}
ExecStart=/usr/bin/docker run --name {name} --label sparkops-memwatch-test=1 {image} python3 -u -c "{script}"
ExecStop=/usr/bin/docker stop -t 3 {name}
Restart=on-failure
RestartSec=1
"""
# exits 143 on SIGTERM, as a process dying of SIGTERM does: a failure for Restart=on-failure
DIES_OF_TERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: "
                "(print('stand-in: SIGTERM', flush=True), sys.exit(143))); "
                "print('stand-in vLLM under a unit: serving', flush=True); time.sleep(1800)")


def test_stop_via_the_serve_unit_leaves_it_stopped_no_restart(host, image):
    """Default memwatch_stop_via_unit: systemctl stop of the serve unit: Restart=on-failure does
    not bring the server back (no ping-pong), although the container exits 143."""
    host.run_test("docker rm -f %s" % NAME)
    write_meminfo(host, 60, 30)
    wait_for("re-arming after recovery", lambda: metrics(host)["memwatch_armed"] == 1)
    unit = SERVE_UNIT.format(name=NAME, image=image, script=DIES_OF_TERM)
    host.run_test("cat > /etc/systemd/system/sparkops-serve.service <<'EOF'\n%sEOF" % unit)
    action = start_the_serve_unit_and_fire(host, 3)
    assert action["result"] == "stopped"
    assert [(s["step"], s["rc"]) for s in action["steps"]] == [("systemctl stop sparkops-serve.service", 0)]
    time.sleep(4)  # > RestartSec: a restart would have happened by now
    props = host.service("sparkops-serve.service").systemd_properties
    assert props["ActiveState"] in ("inactive", "failed")
    assert props["NRestarts"] == "0"
    assert container_state(host) == (False, 143)


# A stand-in for the docker CLI (not docker): an engine that does not answer. memwatch is
# pointed at it through the "docker" key of its configuration (memwatch_docker_path).
DOCKER_FAILS = "/usr/local/bin/memwatch-test-standin-docker-fails"
DOCKER_FAILS_SCRIPT = """#!/bin/sh
# stand-in docker CLI for the memwatch test: the engine does not answer
echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running? (stand-in)" >&2
exit 1
"""
CONFIG = "/etc/sparkops/memwatch.json"
TS = "%Y-%m-%dT%H:%M:%S.%fZ"   # memwatch's log stamps


def test_docker_unknown_still_stops_the_serve_unit_through_systemd(host, image):
    """Unknown is not absent: with a docker CLI that fails and memwatch in docker-only mode
    (stop_via_unit false), a firing still stops the serve unit through systemd (no restart),
    and the log and the metrics say that docker did not answer."""
    original = host.file(CONFIG).content_string
    put_file(host, DOCKER_FAILS, DOCKER_FAILS_SCRIPT, mode="0755")
    cfg = json.loads(original)
    cfg.update({"docker": DOCKER_FAILS, "stop_via_unit": False})
    try:
        put_file(host, CONFIG + ".test", json.dumps(cfg, indent=2) + "\n")
        host.run_test("/usr/local/bin/memwatch check-config %s.test >/dev/null && mv %s.test %s" % (CONFIG, CONFIG, CONFIG))
        write_meminfo(host, 60, 30)
        host.run_test("systemctl restart memwatch.service")
        wait_for("re-arming after recovery", lambda: host.file(METRICS).exists and metrics(host)["memwatch_armed"] == 1)
        action = start_the_serve_unit_and_fire(host, 4)
        assert action["result"] == "unit_stopped", action
        assert action["docker_unknown"] is True
        assert "Cannot connect to the Docker daemon" in action["docker_errors"][0]
        assert ("systemctl stop sparkops-serve.service", 0) in [(s["step"], s.get("rc")) for s in action["steps"]]
        assert any("retries within the 3 s grace" in s["step"] for s in action["steps"])
        unknown = events(host, "docker_unknown")
        assert unknown and "stand-in" in unknown[-1]["error"]
        assert [e["step"] for e in events(host, "escalation")] == ["unit_stop"]
        # the unit's ExecStop (the real docker) stopped the container gracefully: exit 143
        wait_for("the container to exit", lambda: container_state(host) == (False, 143))
        props = host.service("sparkops-serve.service").systemd_properties
        assert props["ActiveState"] in ("inactive", "failed")
        time.sleep(4)  # > RestartSec=1: a restart would have happened by now
        assert host.service("sparkops-serve.service").systemd_properties["NRestarts"] == "0"
        m = metrics(host)
        assert m["memwatch_docker_unknown_total"] == 1
        assert m['memwatch_docker_unknown_steps_total{step="retry"}'] >= 1
        assert m['memwatch_docker_unknown_steps_total{step="unit_stop"}'] == 1
        assert m['memwatch_docker_unknown_steps_total{step="unit_kill"}'] == 0
        assert m['memwatch_actions_total{result="unit_stopped"}'] == 1
    finally:
        put_file(host, CONFIG, original)
        host.run("rm -f %s" % DOCKER_FAILS)
        host.run("systemctl restart memwatch.service")


# A stand-in for the docker CLI that hands every command to the real one, except that while STUCK
# exists `docker stop` and `docker kill` fail as the engine's do on a container whose process is
# stuck in the kernel (a GPU driver call): the engine answers, the container keeps running. memwatch
# is pointed at it (memwatch_docker_path), and so is the stand-in serve unit's ExecStop.
DOCKER_STUCK = "/usr/local/bin/memwatch-test-standin-docker-stuck"
STUCK = TEST_DIR + "/stop-fails"
DOCKER_STUCK_SCRIPT = """#!/bin/sh
# stand-in docker CLI for the memwatch test: while %s exists, stop and kill leave the container running
if [ -e %s ]; then
    case "$1" in
        stop|kill)
            echo "Error response from daemon: cannot $1 container: tried to kill container, but did not receive an exit event (stand-in)" >&2
            exit 1 ;;
    esac
fi
exec /usr/bin/docker "$@"
""" % (STUCK, STUCK)
SERVE_UNIT_FILE = "/etc/systemd/system/sparkops-serve.service"


def test_a_failing_stop_is_reported_memwatch_stays_armed_and_retries_until_the_server_is_down(host, image):
    """SPEC §11: the serve unit's ExecStop, `docker stop` and `docker kill` all fail and
    leave the server (a container ignoring SIGTERM) running. memwatch escalates to the kill through
    systemd, reports the action `failed` (log, metrics), stays armed with the incident open, acts
    again after its backoff (stop grace + kill timeout) while memory stays low, and once the engine
    can stop the container again (the test removes STUCK after the failure) the retry leaves the
    server really down: docker says it exited, the incident ends `server_down` after 2 attempts."""
    original_cfg = host.file(CONFIG).content_string
    original_unit = host.file(SERVE_UNIT_FILE).content_string if host.file(SERVE_UNIT_FILE).exists else None
    cfg = json.loads(original_cfg)
    backoff = cfg["stop_grace_s"] + cfg["kill_timeout_s"]
    try:
        host.run_test("touch %s" % STUCK)
        put_file(host, DOCKER_STUCK, DOCKER_STUCK_SCRIPT, mode="0755")
        cfg["docker"] = DOCKER_STUCK
        put_file(host, CONFIG + ".test", json.dumps(cfg, indent=2) + "\n")
        host.run_test("/usr/local/bin/memwatch check-config %s.test >/dev/null && mv %s.test %s" % (CONFIG, CONFIG, CONFIG))
        unit = (SERVE_UNIT.format(name=NAME, image=image, script=IGNORE_TERM)
                .replace("ExecStop=/usr/bin/docker ", "ExecStop=%s " % DOCKER_STUCK) + "TimeoutStopSec=2\n")
        put_file(host, SERVE_UNIT_FILE, unit)
        host.run("docker rm -f %s" % NAME)
        write_meminfo(host, 60, 30)
        host.run_test("systemctl restart memwatch.service")
        wait_for("re-arming after recovery", lambda: host.file(METRICS).exists and metrics(host)["memwatch_armed"] == 1)
        before = metrics(host)
        n = len(events(host, "action"))
        archives = len(host.run_test("ls %s" % ARCHIVES).stdout.split())

        # the firing (5 samples), the archive (its docker logs bounded by archive_timeout_s, memwatch's
        # default 30 s), the whole chain within memwatch's stop bound, and a margin for a loaded machine
        bound = cfg["stop_grace_s"] + 3 * cfg["kill_timeout_s"]
        first = start_the_serve_unit_and_fire(host, n + 1, timeout=5 + cfg.get("archive_timeout_s", 30) + bound + 30)
        # reported: failed, with what still runs, after the whole chain
        assert first["result"] == "failed" and first["level"] == "error", first
        assert first["attempt"] == 1 and first["server_down"] is False and first["retry_after_s"] == backoff, first
        # the whole chain within memwatch's stop bound (bound_s; "seconds" also holds the archive, bounded apart)
        assert first["bound_s"] == bound and first["seconds"] <= bound + cfg.get("archive_timeout_s", 30), first
        assert "the container %s is still running" % NAME in first["reason"], first
        steps = [(s["step"], s.get("rc")) for s in first["steps"]]
        assert ("docker stop -t 3 %s" % NAME, 1) in steps and ("docker kill %s" % NAME, 1) in steps, steps
        assert steps[-1][0] == "systemctl kill --signal=SIGKILL sparkops-serve.service", steps
        kill = events(host, "escalation")[-1]
        assert kill["step"] == "unit_kill" and kill["docker_answered"] is True, kill
        assert container_state(host) == (True, 0), "the stand-in engine stopped the container after all"
        # stays armed, the incident open
        m = metrics(host)
        assert m['memwatch_actions_total{result="failed"}'] == before.get('memwatch_actions_total{result="failed"}', 0) + 1
        assert m["memwatch_armed"] == 1 and m["memwatch_incident_open"] == 1 and m["memwatch_incident_attempts"] == 1
        assert m["memwatch_incident_server_down"] == 0

        host.run_test("rm %s" % STUCK)    # the engine can stop the container again
        second = wait_for("the retry's action", lambda: len(events(host, "action")) == n + 2 and events(host, "action"),
                          timeout=backoff + 120)[-1]
        retry = events(host, "retry")[-1]
        assert retry["attempt"] == 2 and retry["last_result"] == "failed", retry
        # not sooner than the backoff after the failed attempt (log stamps: UTC, microseconds)
        waited = (datetime.datetime.strptime(retry["ts"], TS) - datetime.datetime.strptime(first["ts"], TS)).total_seconds()
        assert waited >= backoff - 1, (waited, backoff)
        assert second["attempt"] == 2 and second["server_down"] is True, second
        assert second["result"] == "killed", second     # docker stop -t 3: SIGTERM ignored, SIGKILL after the grace
        assert second["archive"] == first["archive"], "the retry archived again"
        end = events(host, "incident_end")[-1]
        assert end["ended"] == "server_down" and end["attempts"] == 2 and end["server_down"] is True, end
        assert container_state(host) == (False, 137)
        m = metrics(host)
        assert m["memwatch_armed"] == 0 and m["memwatch_incident_open"] == 0
        assert m["memwatch_incident_attempts"] == 2 and m["memwatch_incident_server_down"] == 1
        assert len(host.run_test("ls %s" % ARCHIVES).stdout.split()) == archives + 1
        print("memwatch with a failing stop: %d attempts, the server down %.1f s after the firing "
              "(the retry %.1f s after the failed attempt; backoff %d s)" % (end["attempts"], end["seconds"], waited, backoff))
    finally:
        host.run("rm -f %s" % STUCK)
        host.run("systemctl stop sparkops-serve.service; docker rm -f %s" % NAME)
        put_file(host, CONFIG, original_cfg)
        if original_unit is None:
            host.run("rm -f %s" % SERVE_UNIT_FILE)
        else:
            put_file(host, SERVE_UNIT_FILE, original_unit)
        host.run("rm -f %s; systemctl daemon-reload; systemctl reset-failed sparkops-serve.service" % DOCKER_STUCK)
        host.run("systemctl restart memwatch.service")
