"""Unknown is not absent: when docker cannot tell the serving container's state, memwatch still acts.

The stand-in docker CLI (mwhelpers.FAKE_DOCKER) plays an engine that is down (every call fails
with "Cannot connect to the Docker daemon"), hung (no answer: each call is cut by memwatch's
bound) or down for the next N calls only; the stand-in systemctl plays the serve unit.
Only a docker answer that says "no such container" means there is nothing to stop.
"""
import pytest

from test_memwatch_daemon import drive, events


def unit_calls(lab):
    return lab.container().get("systemctl_calls", [])


@pytest.mark.parametrize("engine", ["down", "hang"])
def test_docker_unknown_escalates_to_a_stop_through_systemd(mw, lab, engine):
    """docker-only mode (stop_via_unit false): docker does not answer -> retry within the grace,
    then `systemctl stop` of the serve unit; log and metrics say docker was unknown."""
    lab.set_container(engine=engine)
    # kill_timeout_s also bounds each systemctl call of the stand-in: 1 s was cut short on a busy
    # machine (the stand-in's start alone took longer); a hung docker costs this bound once.
    dog = lab.watchdog(mw, stop_via_unit=False, stop_grace_s=2, kill_timeout_s=5,
                       serve_unit="sparkops-serve.service")
    assert drive(dog, lab, [(4, 1)] * 5) == [(5, "available")]
    assert ["stop", "sparkops-serve.service"] in unit_calls(lab)
    (action,) = events(lab, "action")
    assert action["result"] == "unit_stopped", action
    assert action["docker_unknown"] is True and action["docker_errors"]
    assert any("retries within the 2 s grace" in s["step"] for s in action["steps"])
    # no docker stop/kill was attempted against an engine that does not answer
    verbs = [c[0] for c in lab.container().get("calls", [])]
    assert "stop" not in verbs and "kill" not in verbs and "logs" not in verbs
    (unknown,) = events(lab, "docker_unknown")
    assert unknown["level"] == "error" and unknown["container"] == "vllm-test"
    if engine == "down":
        assert "Cannot connect to the Docker daemon" in unknown["error"]
    else:
        assert "timed out" in unknown["error"]
    m = lab.metrics()
    assert m[("memwatch_docker_unknown_total", frozenset())] == 1
    assert m[("memwatch_docker_unknown_steps_total", frozenset({("step", "retry")}))] >= 1
    assert m[("memwatch_docker_unknown_steps_total", frozenset({("step", "unit_stop")}))] == 1
    assert m[("memwatch_docker_unknown_steps_total", frozenset({("step", "unit_kill")}))] == 0
    assert m[("memwatch_actions_total", frozenset({("result", "unit_stopped")}))] == 1
    # the archive is still written first, with what memwatch has (no docker logs)
    (archived,) = events(lab, "archived")
    assert "docker did not answer" in archived["container_log"]


def test_docker_retry_within_the_grace_takes_the_normal_path_when_docker_answers(mw, lab):
    lab.set_container(engine_down_calls=2)  # the first query and one retry fail
    dog = lab.watchdog(mw, stop_via_unit=False, stop_grace_s=5, kill_timeout_s=2)
    drive(dog, lab, [(4, 1)] * 5)
    (action,) = events(lab, "action")
    assert action["result"] == "stopped" and action["docker_unknown"] is True
    assert ["stop", "-t", "5", "vllm-test"] in lab.container()["calls"]
    assert unit_calls(lab) == []
    assert lab.container()["running"] is False
    assert len(events(lab, "docker_answered")) == 1
    m = lab.metrics()
    assert m[("memwatch_docker_unknown_total", frozenset())] == 1
    assert m[("memwatch_docker_unknown_steps_total", frozenset({("step", "retry")}))] == 2
    assert m[("memwatch_docker_unknown_steps_total", frozenset({("step", "unit_stop")}))] == 0


def test_docker_unknown_and_a_failed_unit_stop_kills_the_units_processes(mw, lab):
    """The stop job fails and the unit stays active: a stop job is queued (so that systemd does
    not restart it) and the unit's processes get SIGKILL."""
    lab.set_container(engine="down", stop_mode="fail")
    dog = lab.watchdog(mw, stop_via_unit=True, stop_grace_s=0, kill_timeout_s=10,
                       serve_unit="sparkops-serve.service")
    drive(dog, lab, [(4, 1)] * 5)
    calls = unit_calls(lab)
    assert calls[0] == ["stop", "sparkops-serve.service"]
    assert ["stop", "--no-block", "sparkops-serve.service"] in calls
    kill = ["kill", "--signal=SIGKILL", "sparkops-serve.service"]
    assert kill in calls
    assert calls.index(["stop", "--no-block", "sparkops-serve.service"]) < calls.index(kill)
    (action,) = events(lab, "action")
    assert action["result"] == "unit_killed", action
    assert lab.container()["unit_state"] == "inactive"
    (escalation,) = [e for e in events(lab, "escalation") if e["step"] == "unit_kill"]
    assert escalation["unit"] == "sparkops-serve.service"
    m = lab.metrics()
    assert m[("memwatch_docker_unknown_steps_total", frozenset({("step", "unit_kill")}))] == 1
    assert m[("memwatch_actions_total", frozenset({("result", "unit_killed")}))] == 1


def test_docker_unknown_and_no_serve_unit_is_a_failure_not_nothing_to_stop(mw, lab):
    lab.set_container(engine="down", unit_loaded=False)
    dog = lab.watchdog(mw, stop_via_unit=False, stop_grace_s=0, kill_timeout_s=10)
    drive(dog, lab, [(4, 1)] * 5)
    (action,) = events(lab, "action")
    assert action["result"] == "failed" and "not loaded" in action["reason"]
    assert ["kill", "--signal=SIGKILL", "sparkops-serve.service"] not in unit_calls(lab)


def test_only_no_such_container_means_absent(mw, lab):
    """A real 'No such container' answer: nothing to stop, no escalation, no docker_unknown."""
    lab.set_container(exists=False)
    dog = lab.watchdog(mw, stop_via_unit=False)
    drive(dog, lab, [(4, 1)] * 5)
    (action,) = events(lab, "action")
    assert action["result"] == "not_running" and action["docker_unknown"] is False
    assert unit_calls(lab) == [] and events(lab, "docker_unknown") == []
    assert lab.metrics()[("memwatch_docker_unknown_total", frozenset())] == 0


@pytest.mark.parametrize("stderr, expected", [
    ("Error: No such object: vllm-test\n", "absent"),
    ("Error response from daemon: No such container: vllm-test\n", "absent"),
    ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n", "unknown"),
    ("permission denied while trying to connect to the Docker daemon socket\n", "unknown"),
])
def test_container_state_tells_absent_from_unknown(mw, lab, monkeypatch, stderr, expected):
    dog = lab.watchdog(mw)
    monkeypatch.setattr(dog, "_docker", lambda args, timeout, stdout=None: (1, "", stderr))
    assert dog.container_state().status == expected
    monkeypatch.setattr(dog, "_docker", lambda args, timeout, stdout=None: (0, "garbage\n", ""))
    assert dog.container_state().status == "unknown"
    monkeypatch.setattr(dog, "_docker", lambda args, timeout, stdout=None: (None, "", "timed out after 2s"))
    assert dog.container_state().status == "unknown"
