"""Several servers on one Spark (SPEC §13): memwatch stops the lowest-priority one still running,
only that one, and stops the next only when memory stays short for another consecutive_samples
samples; targets already stopped are skipped; the log, the archive and the metrics name each one.

Stand-ins for several containers and their units (the one-container stand-ins of mwhelpers serve
the single-server tests); everything else (files, subprocesses, archives, the state file) is real.
"""
import json
import os
import tarfile

import pytest

from mwhelpers import _script, trace

FAKE_DOCKER = r'''#!/usr/bin/env python3
# A fake docker CLI for several containers: {"containers": {name: {running, exit_code, unknown}}}.
# unknown: docker cannot tell (inspect fails with an engine error, not "no such container").
import json, os, sys
path = os.environ["FAKE_TARGETS_STATE"]
with open(path) as h:
    st = json.load(h)
argv = sys.argv[1:]
st.setdefault("calls", []).append(argv)
name = argv[-1]
box = st["containers"].get(name)
rc = 0
if box is not None and box.get("unknown"):
    sys.stderr.write("Error response from daemon: context deadline exceeded\n"); rc = 1
elif box is None and argv[0] in ("inspect", "logs", "stop", "kill"):
    sys.stderr.write("Error: No such object: %s\n" % name); rc = 1
elif argv[0] == "inspect" and "-f" in argv:
    print("%s %d" % ("true" if box["running"] else "false", box.get("exit_code", 0)))
elif argv[0] == "inspect":
    print(json.dumps([{"Name": "/" + name, "State": {"Running": box["running"]}}]))
elif argv[0] == "logs":
    print("2025-01-01T00:00:00Z INFO serving %s" % name)
elif argv[0] in ("stop", "kill"):
    box["running"] = False; box["exit_code"] = 0 if argv[0] == "stop" else 137; print(name)
else:
    rc = 64
with open(path, "w") as h:
    json.dump(st, h)
sys.exit(rc)
'''

FAKE_SYSTEMCTL = r'''#!/usr/bin/env python3
# A fake systemctl for several units: {"units": {unit: {state, container}}}; stop stops the unit's
# container as the serve unit's ExecStop does.
import json, os, sys
path = os.environ["FAKE_TARGETS_STATE"]
with open(path) as h:
    st = json.load(h)
argv = sys.argv[1:]
st.setdefault("systemctl_calls", []).append(argv)
unit = st["units"].get(argv[-1])
rc = 0
if argv[0] == "show":
    print("LoadState=%s" % ("loaded" if unit else "not-found"))
    print("ActiveState=%s" % (unit["state"] if unit else "inactive"))
elif unit is None:
    sys.stderr.write("Failed to %s %s: Unit not loaded.\n" % (argv[0], argv[-1])); rc = 5
elif argv[0] == "stop":
    unit["state"] = "inactive"
    box = st["containers"].get(unit["container"])
    if box is not None and not box.get("unknown"):
        box["running"] = False; box["exit_code"] = 0
else:
    rc = 64
with open(path, "w") as h:
    json.dump(st, h)
sys.exit(rc)
'''

# stop order: lowest priority first (as the serve_instances filter gives them with order='stop')
TARGETS = [
    {"name": "embed", "unit": "sparkops-serve-embed.service", "container": "sparkops-vllm-embed", "priority": 1},
    {"name": "code", "unit": "sparkops-serve-code.service", "container": "sparkops-vllm-code", "priority": 5},
    {"name": "chat", "unit": "sparkops-serve-chat.service", "container": "sparkops-vllm-chat", "priority": 10},
]
NEEDED = 5  # consecutive_samples (the default)
LOW, OK = (4, 1), (60, 30)


class Servers:
    """The containers and units of the targets, as the stand-ins see them."""

    def __init__(self, lab, monkeypatch):
        self.path = lab.tmp / "fake-targets.json"
        monkeypatch.setenv("FAKE_TARGETS_STATE", str(self.path))
        self.path.write_text(json.dumps({
            "containers": dict((t["container"], {"running": True, "exit_code": 0}) for t in TARGETS),
            "units": dict((t["unit"], {"state": "active", "container": t["container"]}) for t in TARGETS)}))
        self.docker = _script(lab.tmp / "docker-targets", FAKE_DOCKER)
        self.systemctl = _script(lab.tmp / "systemctl-targets", FAKE_SYSTEMCTL)

    def state(self):
        return json.loads(self.path.read_text())

    def set(self, container, **fields):
        st = self.state()
        st["containers"][container].update(fields)
        self.path.write_text(json.dumps(st))

    def set_unit(self, unit, state):
        st = self.state()
        st["units"][unit]["state"] = state
        self.path.write_text(json.dumps(st))

    def running(self):
        return [t["name"] for t in TARGETS if self.state()["containers"][t["container"]]["running"]]

    def stopped_in_order(self):
        """The containers docker stop or systemctl stop were called on, in call order."""
        st = self.state()
        by_unit = dict((t["unit"], t["name"]) for t in TARGETS)
        by_container = dict((t["container"], t["name"]) for t in TARGETS)
        out = [by_container[c[-1]] for c in st.get("calls", []) if c[0] == "stop"]
        return out + [by_unit[c[-1]] for c in st.get("systemctl_calls", []) if c[0] == "stop"]


@pytest.fixture
def servers(lab, monkeypatch):
    return Servers(lab, monkeypatch)


def watchdog(mw, lab, servers, **overrides):
    config = dict(lab.config, docker=servers.docker, systemctl=servers.systemctl, targets=TARGETS)
    config.pop("container_name", None)  # the old form of one target; targets replace it
    lab.config = config
    return lab.watchdog(mw, **overrides)


def drive(dog, lab, samples):
    """One watchdog sample per (avail_gib, free_gib); return the sample numbers that fired."""
    fired = []
    for avail, free in samples:
        lab.write_meminfo(avail, free)
        firing = dog.sample()
        if firing is not None:
            fired.append(firing.sample)
    return fired


def events(lab, name):
    return [e for e in lab.log_events() if e["event"] == name]


def labels(target, **more):
    return frozenset(dict({"model": target["name"], "unit": target["unit"], "container": target["container"]},
                          **more).items())


def test_the_lowest_priority_server_is_stopped_and_the_others_keep_serving(mw, lab, servers):
    dog = watchdog(mw, lab, servers, stop_grace_s=3)
    assert drive(dog, lab, [OK] * 3 + [LOW] * NEEDED) == [8]
    assert servers.stopped_in_order() == ["embed"]
    assert servers.running() == ["code", "chat"]
    (action,) = events(lab, "action")
    assert action["result"] == "stopped"
    assert (action["unit"], action["container"], action["model"]) == (
        "sparkops-serve-embed.service", "sparkops-vllm-embed", "embed")
    (end,) = events(lab, "incident_end")
    assert (end["unit"], end["container"], end["model"]) == (
        "sparkops-serve-embed.service", "sparkops-vllm-embed", "embed")
    # the archive holds the stopped server's log and names it
    (archive,) = os.listdir(lab.config["archive_dir"])
    with tarfile.open(os.path.join(lab.config["archive_dir"], archive)) as tar:
        names = dict((os.path.basename(n), n) for n in tar.getnames())
        assert "serving sparkops-vllm-embed" in tar.extractfile(names["container.log"]).read().decode()
        incident = json.loads(tar.extractfile(names["incident.json"]).read().decode())
    assert incident["target"] == {"unit": "sparkops-serve-embed.service", "container": "sparkops-vllm-embed",
                                  "model": "embed"}
    # armed for the next one, which waits for memory to stay short again
    (armed,) = events(lab, "armed_for_next")
    assert armed["next"] == ["sparkops-serve-code.service", "sparkops-serve-chat.service"]
    assert lab.metrics()[("memwatch_armed", frozenset())] == 1


def test_memory_recovering_after_the_first_stop_stops_nothing_else(mw, lab, servers):
    dog = watchdog(mw, lab, servers)
    # short for the firing; freed by the stop: a sample or two still short, then enough
    assert drive(dog, lab, [LOW] * NEEDED + [LOW] * (NEEDED - 1) + [OK] * 20) == [NEEDED]
    assert servers.stopped_in_order() == ["embed"]
    assert servers.running() == ["code", "chat"]
    assert len(events(lab, "action")) == 1


def test_memory_still_short_stops_the_next_one_after_the_consecutive_samples_bound(mw, lab, servers):
    dog = watchdog(mw, lab, servers)
    # the first stop: the sample after it starts a fresh count
    assert drive(dog, lab, [LOW] * NEEDED) == [NEEDED]
    assert drive(dog, lab, [LOW] * (NEEDED - 1)) == []
    assert servers.stopped_in_order() == ["embed"] and servers.running() == ["code", "chat"]
    # the NEEDED-th short sample in a row after the stop: the next one, and only it
    assert drive(dog, lab, [LOW]) == [2 * NEEDED]
    assert servers.stopped_in_order() == ["embed", "code"] and servers.running() == ["chat"]
    # and the last one after NEEDED more; then, all stopped, memwatch waits for recovery as with one server
    assert drive(dog, lab, [LOW] * (NEEDED + 10)) == [3 * NEEDED]
    assert servers.stopped_in_order() == ["embed", "code", "chat"] and servers.running() == []
    assert [a["model"] for a in events(lab, "action")] == ["embed", "code", "chat"]
    assert len(events(lab, "armed_for_next")) == 2
    assert lab.metrics()[("memwatch_armed", frozenset())] == 0


def test_a_short_sample_run_broken_by_one_good_sample_stops_nothing_more(mw, lab, servers):
    dog = watchdog(mw, lab, servers)
    assert drive(dog, lab, [LOW] * NEEDED + [LOW] * (NEEDED - 1) + [OK] + [LOW] * (NEEDED - 1)) == [NEEDED]
    assert servers.running() == ["code", "chat"]


def test_metrics_name_each_stopped_server(mw, lab, servers):
    dog = watchdog(mw, lab, servers)
    drive(dog, lab, [LOW] * (2 * NEEDED))
    m = lab.metrics()
    embed, code, chat = TARGETS
    for target in TARGETS:
        assert m[("memwatch_target_priority", labels(target))] == target["priority"]
    assert m[("memwatch_target_actions_total", labels(embed, result="stopped"))] == 1
    assert m[("memwatch_target_actions_total", labels(code, result="stopped"))] == 1
    assert not [k for k in m if k[0] == "memwatch_target_actions_total" and ("model", "chat") in k[1]]
    assert m[("memwatch_target_last_action_timestamp_seconds", labels(code))] >= \
        m[("memwatch_target_last_action_timestamp_seconds", labels(embed))] > 0
    assert ("memwatch_target_last_action_timestamp_seconds", labels(chat)) not in m
    # the names the monitoring role's alerts read are still there, summed over the servers
    assert m[("memwatch_actions_total", frozenset({("result", "stopped")}))] == 2
    assert m[("memwatch_rule_fires_total", frozenset({("rule", "available")}))] == 2
    # persisted: a restarted memwatch reports the same
    watchdog(mw, lab, servers).write_metrics()
    assert lab.metrics()[("memwatch_target_actions_total", labels(code, result="stopped"))] == 1


def test_a_server_already_stopped_is_skipped(mw, lab, servers):
    servers.set("sparkops-vllm-embed", running=False, exit_code=0)
    dog = watchdog(mw, lab, servers)
    assert drive(dog, lab, [LOW] * NEEDED) == [NEEDED]
    assert servers.stopped_in_order() == ["code"] and servers.running() == ["chat"]
    (skipped,) = events(lab, "target_skipped")
    assert skipped["model"] == "embed" and skipped["state"] == "exited"
    (action,) = events(lab, "action")
    assert action["model"] == "code"


def test_docker_unknown_for_a_lower_server_is_never_jumped_over_unless_its_unit_is_down(mw, lab, servers):
    """Docker cannot tell about the lowest: it may still run, so it is the one acted on (through
    systemd); only when its unit is down is it skipped."""
    servers.set("sparkops-vllm-embed", unknown=True)
    dog = watchdog(mw, lab, servers, stop_via_unit=True)
    assert drive(dog, lab, [LOW] * NEEDED) == [NEEDED]
    assert servers.stopped_in_order() == ["embed"] and servers.running() == ["embed", "code", "chat"]
    assert servers.state()["units"]["sparkops-serve-embed.service"]["state"] == "inactive"
    (action,) = events(lab, "action")
    assert action["model"] == "embed" and action["result"] == "unit_stopped"
    # its unit is down now: the next firing skips it and stops code
    assert drive(dog, lab, [LOW] * NEEDED) == [2 * NEEDED]
    assert servers.stopped_in_order() == ["embed", "code"] and servers.running() == ["embed", "chat"]
    assert [e["model"] for e in events(lab, "target_skipped")] == ["embed"]
    assert [a["model"] for a in events(lab, "action")] == ["embed", "code"]


def test_dry_run_names_the_server_it_would_stop_and_stops_none(mw, lab, servers):
    servers.set("sparkops-vllm-embed", running=False)
    dog = watchdog(mw, lab, servers, dry_run=True)
    assert drive(dog, lab, [LOW] * (3 * NEEDED)) == [NEEDED]
    (action,) = events(lab, "action")
    assert action["result"] == "dry_run" and action["model"] == "code"
    assert servers.stopped_in_order() == [] and servers.running() == ["code", "chat"]


def test_replay_names_the_server_each_firing_would_stop(mw, tmp_path):
    cfg = mw.validate_config({"targets": TARGETS})
    path = tmp_path / "trace.txt"

    def replayed(samples):
        path.write_text(trace(samples))
        with open(str(path)) as handle:
            return [(f.sample, (f.as_dict()["target"] or {}).get("model")) for f in mw.replay(handle, cfg)]

    assert replayed([LOW] * (2 * NEEDED) + [OK] * 3) == [(5, "embed"), (10, "code")]
    assert replayed([LOW] * NEEDED + [OK] * 10 + [LOW] * (NEEDED - 1)) == [(5, "embed")]
    # all three stopped: memwatch waits for recovery (re-armed at sample 25); a firing after it has
    # nothing left to stop
    assert replayed([LOW] * (4 * NEEDED) + [OK] * NEEDED + [LOW] * NEEDED) == [
        (5, "embed"), (10, "code"), (15, "chat"), (30, None)]
    # one server: the output is as it always was
    single = mw.validate_config({})
    path.write_text(trace([LOW] * (2 * NEEDED)))
    with open(str(path)) as handle:
        assert [f.as_dict() for f in mw.replay(handle, single)] == [{"sample": 5, "rule": "available"}]


@pytest.mark.parametrize("bad, words", [
    ({"targets": []}, ["targets must be a non-empty list"]),
    ({"targets": [dict(TARGETS[0], priority=7), TARGETS[1]]},
     ["targets[1] (priority 5) comes after targets[0] (priority 7)", "lowest priority first"]),
    ({"targets": [TARGETS[0], dict(TARGETS[1], unit=TARGETS[0]["unit"])]}, ["targets[1].unit", "its own unit"]),
    ({"targets": [TARGETS[0], dict(TARGETS[1], container=TARGETS[0]["container"])]}, ["targets[1].container"]),
    ({"targets": [dict(TARGETS[0], unit="sparkops-serve-embed")]}, ["targets[0].unit", "ending in .service"]),
    ({"targets": [dict(TARGETS[0], priority="high")]}, ["targets[0].priority must be a whole number"]),
    ({"targets": [dict(TARGETS[0], priority=True)]}, ["targets[0].priority must be a whole number"]),
    ({"targets": [{"name": "x", "unit": "x.service", "container": "x"}]}, ["targets[0]", "missing priority"]),
    ({"targets": [dict(TARGETS[0], port=8000)]}, ["targets[0]", "unknown key(s) port"]),
    ({"targets": TARGETS, "container_name": "x"}, ["targets and container_name are both given", "remove it"]),
])
def test_bad_targets_are_refused_naming_the_key_and_the_fix(mw, bad, words):
    with pytest.raises(mw.ConfigError) as err:
        mw.validate_config(bad, "memwatch.json")
    for word in words:
        assert word in str(err.value), str(err.value)


def test_the_old_form_is_read_as_one_target(mw):
    cfg = mw.validate_config({"serve_unit": "llm.service", "container_name": "llm"})
    assert cfg["targets"] == [{"name": "", "unit": "llm.service", "container": "llm", "priority": 0}]
    assert "serve_unit" not in cfg and "container_name" not in cfg
    assert mw.validate_config({})["targets"] == [
        {"name": "", "unit": "sparkops-serve.service", "container": "vllm", "priority": 0}]
