"""memwatch on a lab Spark, watching a stand-in serving container (a sibling on the host engine).

The tests drive memwatch through the meminfo file and the kernel log file it is configured to
read (/var/lib/memwatch-test/...), then check what a user sees: the container stopped (or
killed after the grace), the incident archive, the metrics file, memwatch's log.
Run in file order: the first incident stops the container converge started; the second one
uses a container that ignores SIGTERM.
"""
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
    assert cfg["container_name"] == NAME and cfg["stop_grace_s"] == 3
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
