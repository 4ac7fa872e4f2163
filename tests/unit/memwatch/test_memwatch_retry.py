# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""memwatch finishes what it starts (SPEC §11 "Recovery is bounded").

An action that did not leave the server down is escalated up to the kill through systemd,
reported as failed, and memwatch stays armed: the next firing sample after the retry backoff
(stop_grace_s + kill_timeout_s) acts again. Once an action leaves the server down, memwatch
disarms as before. The stand-in docker CLI and systemctl (mwhelpers) play a container that
docker cannot stop or kill, a unit whose processes survive SIGKILL, and a hung engine.
"""
import json
import os
import time

from test_memwatch_daemon import drive, events

UNIT = "sparkops-serve.service"
LOW = (4, 1)


def unit_calls(lab):
    return lab.container().get("systemctl_calls", [])


def wait_for_the_backoff(dog):
    """Sleep until memwatch may act again (the backoff it set after the failed attempt)."""
    time.sleep(max(0.0, dog.retry_at - time.monotonic()) + 0.05)


def metric(lab, name, **labels):
    return lab.metrics()[(name, frozenset(labels.items()))]


def test_a_container_docker_cannot_stop_is_escalated_reported_failed_and_retried_until_down(mw, lab):
    lab.set_container(mode="fail", kill_mode="fail", stop_mode="fail")
    # kill_timeout_s 3: each stand-in call fits on a busy machine; the backoff is 0 + 3 s
    dog = lab.watchdog(mw, stop_via_unit=False, stop_grace_s=0, kill_timeout_s=3, serve_unit=UNIT)
    assert drive(dog, lab, [LOW] * 5) == [(5, "available")]
    (action,) = events(lab, "action")
    assert action["result"] == "failed" and action["level"] == "error"
    assert metric(lab, "memwatch_armed") == 1
    assert (action["attempt"], action["server_down"], action["retry_after_s"]) == (1, False, 3)
    # the whole chain, up to the kill through systemd
    assert [s["step"] for s in action["steps"]] == [
        "docker stop -t 0 vllm-test", "docker kill vllm-test", "systemctl stop %s" % UNIT,
        "systemctl kill --signal=SIGKILL %s" % UNIT]
    assert "the container vllm-test is still running (docker inspect)" in action["reason"]
    calls = unit_calls(lab)
    kill = ["kill", "--signal=SIGKILL", UNIT]
    assert calls.index(["stop", "--no-block", UNIT]) < calls.index(kill)
    assert lab.container()["running"] is True
    assert [e["step"] for e in events(lab, "escalation")] == ["unit_stop", "unit_kill"]
    assert all(e["level"] == "error" and e["docker_answered"] is True for e in events(lab, "escalation"))
    assert metric(lab, "memwatch_actions_total", result="failed") == 1
    assert metric(lab, "memwatch_incident_open") == 1
    assert metric(lab, "memwatch_incident_attempts") == 1
    assert metric(lab, "memwatch_incident_server_down") == 0
    # not steps taken because docker did not answer: docker answered, the container runs
    assert metric(lab, "memwatch_docker_unknown_steps_total", step="unit_kill") == 0
    state = json.loads((lab.tmp / "state.json").read_text())
    assert state["armed"] is True and state["incident"]["open"] is True  # a restart stays armed

    # memory pressure goes on: within the backoff memwatch stays armed and does not act
    assert drive(dog, lab, [LOW] * 3) == []
    assert len(events(lab, "action")) == 1 and metric(lab, "memwatch_armed") == 1

    # after the backoff the next firing sample acts again, and says why
    wait_for_the_backoff(dog)
    assert drive(dog, lab, [LOW]) == [(9, "available")]
    (retry,) = events(lab, "retry")
    assert retry["level"] == "error" and retry["attempt"] == 2 and retry["last_result"] == "failed"
    assert "still up" in retry["note"] and "still running" in retry["last_reason"]
    second = events(lab, "action")[-1]
    assert (second["attempt"], second["result"]) == (2, "failed")
    assert metric(lab, "memwatch_armed") == 1 and metric(lab, "memwatch_incident_attempts") == 2
    # evidence is archived once per incident, on its first attempt
    assert len(os.listdir(lab.config["archive_dir"])) == 1 and second["archive"] == action["archive"]
    assert len(events(lab, "fired")) == 1 and metric(lab, "memwatch_rule_fires_total", rule="available") == 1

    # docker kill works again: the next attempt stops the server and memwatch disarms as before
    lab.set_container(kill_mode="works")
    wait_for_the_backoff(dog)
    assert drive(dog, lab, [LOW] * 4) == [(10, "available")]
    third = events(lab, "action")[-1]
    assert (third["attempt"], third["result"], third["server_down"]) == (3, "killed", True)
    assert lab.container()["running"] is False
    (end,) = events(lab, "incident_end")
    assert (end["ended"], end["server_down"], end["attempts"], end["result"]) == ("server_down", True, 3, "killed")
    assert len(events(lab, "action")) == 3
    assert metric(lab, "memwatch_actions_total", result="failed") == 2
    assert metric(lab, "memwatch_actions_total", result="killed") == 1
    assert metric(lab, "memwatch_armed") == 0
    assert metric(lab, "memwatch_incident_open") == 0
    assert metric(lab, "memwatch_incident_attempts") == 3
    assert metric(lab, "memwatch_incident_server_down") == 1
    # and re-arms after recovery, as before
    assert drive(dog, lab, [(60, 30)] * 5) == [] and len(events(lab, "rearmed")) == 1


def test_docker_unknown_and_a_unit_that_survives_sigkill_is_failed_then_retried(mw, lab):
    """Unit path: docker does not answer and the unit's processes survive SIGKILL (stuck in the
    kernel): failed, still armed; the next attempt after the backoff finds them killable."""
    lab.set_container(engine="down", stop_mode="fail", unit_kill_mode="ignore")
    dog = lab.watchdog(mw, stop_via_unit=True, stop_grace_s=0, kill_timeout_s=3, serve_unit=UNIT)
    assert drive(dog, lab, [LOW] * 5) == [(5, "available")]
    (action,) = events(lab, "action")
    assert action["result"] == "failed" and action["level"] == "error"
    assert "still deactivating after SIGKILL" in action["reason"]
    assert metric(lab, "memwatch_docker_unknown_steps_total", step="unit_kill") == 1
    assert metric(lab, "memwatch_armed") == 1 and metric(lab, "memwatch_incident_open") == 1
    assert drive(dog, lab, [LOW] * 2) == []
    lab.set_container(unit_kill_mode="dies")
    wait_for_the_backoff(dog)
    assert drive(dog, lab, [LOW] * 3) == [(8, "available")]
    second = events(lab, "action")[-1]
    assert (second["attempt"], second["result"], second["server_down"]) == (2, "unit_killed", True)
    assert "docker did not answer" in second["verified"]
    assert len(events(lab, "action")) == 2
    (end,) = events(lab, "incident_end")
    assert (end["server_down"], end["attempts"]) == (True, 2)
    assert metric(lab, "memwatch_armed") == 0 and metric(lab, "memwatch_incident_attempts") == 2


def test_memory_recovering_with_the_server_still_up_ends_the_incident_and_stays_armed(mw, lab):
    lab.set_container(mode="fail", kill_mode="fail", stop_mode="fail")
    dog = lab.watchdog(mw, stop_via_unit=False, stop_grace_s=0, kill_timeout_s=3, serve_unit=UNIT)
    assert drive(dog, lab, [LOW] * 5 + [(60, 30)] * 5) == [(5, "available")]
    (end,) = events(lab, "incident_end")
    assert (end["ended"], end["server_down"], end["attempts"], end["level"]) == ("memory_recovered", False, 1, "error")
    assert metric(lab, "memwatch_armed") == 1 and metric(lab, "memwatch_incident_open") == 0
    assert metric(lab, "memwatch_incident_server_down") == 0
    # the next dip is a new incident: fired, archived and acted on at once
    lab.set_container(kill_mode="works")
    assert drive(dog, lab, [LOW] * 5) == [(15, "available")]
    assert len(events(lab, "fired")) == 2 and len(os.listdir(lab.config["archive_dir"])) == 2
    last = events(lab, "action")[-1]
    assert (last["attempt"], last["result"]) == (1, "killed") and metric(lab, "memwatch_armed") == 0


def test_a_restarted_memwatch_stays_armed_and_its_next_firing_acts_at_once(mw, lab):
    lab.set_container(mode="fail", kill_mode="fail", stop_mode="fail")
    over = dict(stop_via_unit=False, stop_grace_s=0, kill_timeout_s=3, serve_unit=UNIT)
    dog = lab.watchdog(mw, **over)
    assert drive(dog, lab, [LOW] * 5) == [(5, "available")]
    assert events(lab, "action")[-1]["result"] == "failed"
    lab.set_container(kill_mode="works")
    dog2 = lab.watchdog(mw, **over)  # memwatch restarted in the middle of the incident
    assert dog2.detector.armed is True
    assert drive(dog2, lab, [LOW] * 5) == [(5, "available")]
    second = events(lab, "action")[-1]
    assert (second["attempt"], second["result"]) == (2, "killed")
    (end,) = events(lab, "incident_end")
    assert (end["attempts"], end["server_down"]) == (2, True)
    assert len(events(lab, "fired")) == 1 and len(events(lab, "retry")) == 1


def test_a_hung_engine_is_stopped_within_the_documented_bound(mw, lab):
    """The engine does not answer and the unit's stop job hangs on it (its ExecStop is a docker
    stop). Each step is cut at the action's deadlines: the unit stop within grace + kill_timeout_s,
    the kill through systemd within one more kill_timeout_s; the whole stop within
    stop_bound_s = grace + 3 x kill_timeout_s. The measured time is printed, not asserted."""
    lab.set_container(engine="hang", stop_mode="hang")
    grace, kill_s = 2, 3
    dog = lab.watchdog(mw, stop_via_unit=True, stop_grace_s=grace, kill_timeout_s=kill_s, serve_unit=UNIT)
    assert drive(dog, lab, [LOW] * 5) == [(5, "available")]
    (action,) = events(lab, "action")
    print("hung engine: firing to server down in %.1f s (bound %s s)" % (action["seconds"], action.get("bound_s")))
    assert action["result"] == "unit_killed" and action["server_down"] is True
    assert action["verified"] == "systemd: unit %s inactive; docker did not answer" % UNIT
    assert action["bound_s"] == grace + 3 * kill_s
    unit_stop, retries, unit_kill = action["steps"]
    assert unit_stop["step"] == "systemctl stop %s" % UNIT and unit_stop["rc"] is None
    assert unit_stop["timeout_s"] <= grace + kill_s
    assert retries["step"].startswith("docker inspect")
    assert unit_kill["step"] == "systemctl kill --signal=SIGKILL %s" % UNIT and unit_kill["timeout_s"] <= kill_s
    assert metric(lab, "memwatch_armed") == 0 and metric(lab, "memwatch_incident_server_down") == 1
