"""The watchdog as a service: actions, archives, metrics, kernel log counting, config checks.

A fake docker CLI stands in for the serving container (mwhelpers.FAKE_DOCKER); everything else
(files, subprocesses, tar archives, the state file) is real.
"""
import json
import os
import tarfile

import pytest

from mwhelpers import PROGRAM, fake_journalctl, parse_metrics


def drive(dog, lab, samples):
    """samples: list of (avail_gib, free_gib); one watchdog sample each. Returns the firings.

    The kernel log is read beside the sampling (a thread); after each sample this waits for a
    read it started and takes the result in, so that counts can be asserted per sample
    (test_memwatch_kernel_log_async.py tests that the service itself never waits)."""
    out = []
    for avail, free in samples:
        lab.write_meminfo(avail, free)
        firing = dog.sample()
        assert dog.kernel_log_settle(10), "the kernel log read did not finish within 10 s"
        if firing is not None:
            out.append((firing.sample, firing.rule))
    return out


def events(lab, name):
    return [e for e in lab.log_events() if e["event"] == name]


def test_graceful_stop_archives_first_then_stops_once_per_incident(mw, lab):
    dog = lab.watchdog(mw, stop_grace_s=3)
    assert drive(dog, lab, [(60, 30)] * 3 + [(5, 3)] * 12) == [(8, "available")]
    calls = lab.container()["calls"]
    verbs = [c[0] for c in calls]
    # logs archived before the stop; exactly one stop for the whole incident
    assert verbs.index("logs") < verbs.index("stop")
    assert [c for c in calls if c[0] == "stop"] == [["stop", "-t", "3", "vllm-test"]]
    assert "kill" not in verbs
    assert lab.container()["running"] is False
    (action,) = events(lab, "action")
    assert action["result"] == "stopped" and action["exit_code"] == 0
    archives = os.listdir(lab.config["archive_dir"])
    assert len(archives) == 1 and archives[0].startswith("memwatch-incident-")
    with tarfile.open(os.path.join(lab.config["archive_dir"], archives[0])) as tar:
        names = {os.path.basename(n): n for n in tar.getnames()}
        assert {"container.log", "memwatch.log", "incident.json", "trace.txt"} <= set(names)
        log = tar.extractfile(names["container.log"]).read().decode()
        assert "serving the model" in log and "stderr line" in log
        own = tar.extractfile(names["memwatch.log"]).read().decode()
        assert '"event": "fired"' in own
        trace_text = tar.extractfile(names["trace.txt"]).read().decode()
    # the archived trace replays to the same firing
    tpath = lab.tmp / "trace.txt"
    tpath.write_text(trace_text)
    assert [(f.sample, f.rule) for f in mw.replay(open(str(tpath)), mw.validate_config({}))] == [(8, "available")]
    m = lab.metrics()
    assert m[("memwatch_rule_fires_total", frozenset({("rule", "available")}))] == 1
    assert m[("memwatch_actions_total", frozenset({("result", "stopped")}))] == 1
    assert m[("memwatch_armed", frozenset())] == 0
    assert m[("memwatch_rule_consecutive_samples", frozenset({("rule", "available")}))] == 12
    assert m[("memwatch_meminfo_bytes", frozenset({("field", "MemAvailable")}))] == 5 * 1024 ** 3


def test_rearms_after_recovery_and_acts_on_the_next_incident(mw, lab):
    dog = lab.watchdog(mw)
    assert drive(dog, lab, [(5, 3)] * 5 + [(60, 30)] * 4 + [(5, 3)] * 5) == [(5, "available")]
    assert len(events(lab, "action")) == 1 and events(lab, "rearmed") == []
    lab.set_container(running=True)
    assert drive(dog, lab, [(60, 30)] * 5 + [(8, 1)] * 5) == [(24, "available_and_free")]
    assert len(events(lab, "rearmed")) == 1 and len(events(lab, "action")) == 2


def test_a_container_ignoring_sigterm_is_reported_killed(mw, lab):
    lab.set_container(mode="ignore_term")  # docker stop sends SIGKILL after the grace: exit 137
    dog = lab.watchdog(mw, stop_grace_s=3)
    drive(dog, lab, [(4, 1)] * 5)
    (action,) = events(lab, "action")
    assert action["result"] == "killed" and action["exit_code"] == 137
    assert lab.container()["running"] is False


@pytest.mark.parametrize("mode", ["fail", "hang"])
def test_docker_stop_failing_or_hanging_falls_back_to_kill(mw, lab, mode):
    lab.set_container(mode=mode)
    # The bound must exceed one stand-in docker call on a loaded machine (a python start), or the
    # kill itself times out and is read as "docker unknown"; only the hanging stop needs to hit it.
    # (2 s: the stand-ins run under this Python without the pyenv shim, well below 1 s a call.)
    dog = lab.watchdog(mw, stop_grace_s=0, kill_timeout_s=2 if mode == "hang" else 15)
    drive(dog, lab, [(4, 1)] * 5)
    (action,) = events(lab, "action")
    assert action["result"] == "killed"
    assert [s["step"].split()[:2] for s in action["steps"]] == [["docker", "stop"], ["docker", "kill"]]
    if mode == "hang":
        assert action["steps"][0]["rc"] is None  # timed out
    assert lab.container()["running"] is False


def test_stop_via_unit_stops_the_unit_and_does_not_docker_stop(mw, lab):
    dog = lab.watchdog(mw, stop_via_unit=True, serve_unit="sparkops-serve.service")
    drive(dog, lab, [(4, 1)] * 5)
    st = lab.container()
    assert st["systemctl_calls"] == [["stop", "sparkops-serve.service"]]
    assert "stop" not in [c[0] for c in st["calls"]]
    (action,) = events(lab, "action")
    assert action["result"] == "stopped"


def test_stop_via_unit_without_such_unit_falls_back_to_docker_stop(mw, lab):
    lab.set_container(unit_loaded=False)
    dog = lab.watchdog(mw, stop_via_unit=True)
    drive(dog, lab, [(4, 1)] * 5)
    (action,) = events(lab, "action")
    assert action["result"] == "stopped"
    assert action["steps"][0]["rc"] == 5
    assert ["stop", "-t", "0", "vllm-test"] in lab.container()["calls"]


def test_no_container_means_nothing_to_stop(mw, lab):
    lab.set_container(exists=False)
    dog = lab.watchdog(mw)
    drive(dog, lab, [(4, 1)] * 5)
    (action,) = events(lab, "action")
    assert action["result"] == "not_running"
    assert "stop" not in [c[0] for c in lab.container()["calls"]]


def test_dry_run_decides_and_logs_but_never_acts(mw, lab):
    dog = lab.watchdog(mw, dry_run=True)
    assert drive(dog, lab, [(4, 1)] * 8) == [(5, "available")]
    assert lab.container().get("calls", []) == []
    assert not os.path.exists(lab.config["archive_dir"]) or os.listdir(lab.config["archive_dir"]) == []
    (action,) = events(lab, "action")
    assert action["result"] == "dry_run"
    m = lab.metrics()
    assert m[("memwatch_dry_run", frozenset())] == 1
    assert m[("memwatch_actions_total", frozenset({("result", "dry_run")}))] == 1


def test_shm_leftovers_are_reported_not_removed(mw, lab):
    (lab.shm / "psm_1a2b3c").write_bytes(b"x" * 4096)
    (lab.shm / "unrelated").write_bytes(b"y")
    dog = lab.watchdog(mw)
    drive(dog, lab, [(4, 1)] * 5)
    (rep,) = events(lab, "shm_leftovers")
    assert rep["names"] == ["psm_1a2b3c"] and rep["bytes"] == 4096
    assert (lab.shm / "psm_1a2b3c").exists()
    assert lab.metrics()[("memwatch_shm_leftover_objects", frozenset())] == 1


def test_archive_retention_keeps_the_newest(mw, lab):
    dog = lab.watchdog(mw, archive_keep=2, recovery_samples=1)
    for _incident in range(4):
        lab.set_container(running=True)
        drive(dog, lab, [(4, 1)] * 5 + [(60, 30)])
    assert len(events(lab, "action")) == 4
    kept = sorted(os.listdir(lab.config["archive_dir"]))
    assert len(kept) == 2
    assert [e["path"] for e in events(lab, "archived")][-2:] == [os.path.join(lab.config["archive_dir"], k) for k in kept]


def test_disarmed_state_survives_a_restart(mw, lab):
    dog = lab.watchdog(mw)
    drive(dog, lab, [(4, 1)] * 5)
    dog2 = lab.watchdog(mw)  # memwatch restarted in the middle of the incident
    lab.set_container(running=True)
    assert drive(dog2, lab, [(4, 1)] * 10) == []
    # (dog2 counts its samples from its own start)
    assert drive(dog2, lab, [(60, 30)] * 5 + [(4, 1)] * 5) == [(20, "available")]


# -- kernel log --------------------------------------------------------------------------------

NV = "NVRM: nvAssertFailedNoLog: NV_ERR_NO_MEMORY at uvm_gpu.c:123\n"


def test_nv_err_lines_in_a_file_are_counted_once_across_restarts(mw, lab):
    klog = lab.tmp / "kern.log"
    klog.write_text("boot\n" + NV + "other\n" + NV)
    over = {"kernel_log_source": "file", "kernel_log_path": str(klog), "diag_every_samples": 2}
    dog = lab.watchdog(mw, **over)
    drive(dog, lab, [(60, 30)] * 6)
    assert dog.state["nv_err_total"] == 2
    # a partial line is not counted until complete
    with open(str(klog), "a") as h:
        h.write(NV + NV[:20])
    drive(dog, lab, [(60, 30)] * 2)
    assert dog.state["nv_err_total"] == 3
    # restart: nothing new -> nothing counted again; then the completed line counts once
    dog2 = lab.watchdog(mw, **over)
    drive(dog2, lab, [(60, 30)] * 4)
    assert dog2.state["nv_err_total"] == 3
    with open(str(klog), "a") as h:
        h.write(NV[20:])
    drive(dog2, lab, [(60, 30)] * 2)
    assert dog2.state["nv_err_total"] == 4
    assert lab.metrics()[("memwatch_nv_err_no_memory_total", frozenset())] == 4
    # rotation: a new file is read from its start
    os.rename(str(klog), str(klog) + ".1")
    klog.write_text(NV)
    dog3 = lab.watchdog(mw, **over)
    drive(dog3, lab, [(60, 30)] * 2)
    assert dog3.state["nv_err_total"] == 5


def test_nv_err_counted_about_every_diag_samples(mw, lab):
    klog = lab.tmp / "kern.log"
    klog.write_text(NV)
    dog = lab.watchdog(mw, kernel_log_source="file", kernel_log_path=str(klog))
    drive(dog, lab, [(60, 30)])            # the first sample runs a diagnostic pass
    assert dog.state["nv_err_total"] == 1
    with open(str(klog), "a") as h:
        h.write(NV)
    drive(dog, lab, [(60, 30)] * 8)        # samples 2..9
    assert dog.state["nv_err_total"] == 1
    drive(dog, lab, [(60, 30)])            # sample 10
    assert dog.state["nv_err_total"] == 2
    diag = events(lab, "diag")[-1]
    for field in ("Cached", "AnonPages", "Slab", "PageTables", "Shmem", "MemAvailable", "MemFree"):
        assert field + "_kib" in diag
    assert ("memwatch_meminfo_bytes", frozenset({("field", "PageTables")})) in lab.metrics()


def test_unreadable_kernel_log_is_logged_once_and_watching_goes_on(mw, lab):
    dog = lab.watchdog(mw, kernel_log_source="file", kernel_log_path=str(lab.tmp / "absent.log"),
                       diag_every_samples=1)
    assert drive(dog, lab, [(60, 30)] * 10 + [(4, 1)] * 5) == [(15, "available")]
    assert len(events(lab, "kernel_log_unavailable")) == 1
    m = lab.metrics()
    assert m[("memwatch_kernel_log_readable", frozenset({("source", "file")}))] == 0
    (lab.tmp / "absent.log").write_text(NV)
    drive(dog, lab, [(60, 30)])
    assert len(events(lab, "kernel_log_readable")) == 1 and dog.state["nv_err_total"] == 1


def test_journal_source_follows_the_cursor_across_restarts(mw, lab, monkeypatch):
    jctl, journal, _pids = fake_journalctl(lab, monkeypatch, "a\n" + NV + NV)
    over = {"kernel_log_source": "journal", "journalctl": jctl, "diag_every_samples": 1}
    dog = lab.watchdog(mw, **over)
    drive(dog, lab, [(60, 30)] * 3)
    assert dog.state["nv_err_total"] == 2 and dog.state["kernel_log"]["cursor"] == "s=2"
    with open(str(journal), "a") as h:
        h.write("b\n" + NV)
    dog2 = lab.watchdog(mw, **over)
    drive(dog2, lab, [(60, 30)] * 3)
    assert dog2.state["nv_err_total"] == 3


def test_kmsg_source_unreadable_is_handled(mw, lab):
    dog = lab.watchdog(mw, kernel_log_source="kmsg", kernel_log_path=str(lab.tmp / "no-kmsg"))
    drive(dog, lab, [(60, 30)] * 2)
    assert len(events(lab, "kernel_log_unavailable")) == 1


# -- the service entry point, config ---------------------------------------------------------

def test_run_command_end_to_end(lab, run_memwatch):
    lab.write_meminfo(4, 1)
    cfg = lab.write_config(stop_grace_s=1)
    proc = run_memwatch("run", "--config", cfg, "--samples", "8")
    assert proc.returncode == 0, proc.stderr
    logged = [json.loads(line)["event"] for line in proc.stderr.splitlines()]
    assert logged[0] == "start" and logged[-1] == "stop"
    assert logged.count("fired") == 1 and logged.count("action") == 1
    assert ["stop", "-t", "1", "vllm-test"] in lab.container()["calls"]
    state = json.loads((lab.tmp / "state.json").read_text())
    assert state["armed"] is False and state["actions_total"] == {"stopped": 1}


def test_run_command_meminfo_option_and_dry_run(lab, run_memwatch):
    other = lab.tmp / "other-meminfo"
    from mwhelpers import meminfo
    other.write_text(meminfo(4, 1))
    cfg = lab.write_config()
    proc = run_memwatch("--dry-run", "--config", cfg, "--meminfo", str(other), "--samples", "6")
    assert proc.returncode == 0, proc.stderr
    actions = [json.loads(line) for line in proc.stderr.splitlines() if '"action"' in line]
    assert [a["result"] for a in actions] == ["dry_run"]
    assert lab.container().get("calls", []) == []


def test_sigterm_stops_the_service_cleanly(lab):
    import signal
    import subprocess
    import sys
    import time
    cfg = lab.write_config(interval_s=0.05)
    proc = subprocess.Popen([sys.executable, PROGRAM, "run", "--config", cfg], stderr=subprocess.PIPE,
                            universal_newlines=True)
    deadline = time.time() + 20
    while not (lab.tmp / "memwatch.prom").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert json.loads(err.splitlines()[-1])["event"] == "stop"
    assert parse_metrics((lab.tmp / "memwatch.prom").read_text())[("memwatch_samples_total", frozenset())] >= 1


@pytest.mark.parametrize("bad, message", [
    ({"available_lt_gib": "6"}, "available_lt_gib must be a number > 0"),
    ({"available_lt_gib": True}, "available_lt_gib must be"),
    ({"consecutive_samples": 0}, "consecutive_samples must be an integer >= 1"),
    ({"consecutive_samples": 2.5}, "consecutive_samples must be"),
    ({"kernel_log_source": "dmesg"}, "kernel_log_source must be one of journal, kmsg, file, none"),
    ({"kernel_log_source": "file"}, "kernel_log_source 'file' needs kernel_log_path"),
    ({"stop_grace": 3}, "unknown key 'stop_grace'"),
    ({"shm_patterns": [""]}, "shm_patterns must be a list of non-empty strings"),
])
def test_check_config_rejects_bad_values_naming_the_key(mw, tmp_path, monkeypatch, capsys, bad, message):
    """The program's main() in this process (the executable is `sys.exit(main())`; that wiring, exit
    code and all, is run as a process by the two tests below and by test_run_command_*)."""
    path = tmp_path / "memwatch.json"
    path.write_text(json.dumps(bad))
    assert mw.main(["check-config", str(path)]) == 2
    assert message in capsys.readouterr().err
    # the service refuses to start on it too (never reaching the sampling loop, stubbed here so that a
    # config accepted by mistake fails this test instead of watching this machine)
    monkeypatch.setattr(mw, "cmd_run", lambda cfg, args: 0)
    assert mw.main(["run", "--config", str(path), "--samples", "1"]) == 2


def test_check_config_prints_the_full_configuration(run_memwatch, tmp_path):
    path = tmp_path / "memwatch.json"
    path.write_text(json.dumps({"stop_grace_s": 3, "container_name": "x"}))
    proc = run_memwatch("check-config", str(path))
    assert proc.returncode == 0
    cfg = json.loads(proc.stdout)
    assert cfg["stop_grace_s"] == 3 and cfg["available_lt_gib"] == 6.0 and cfg["consecutive_samples"] == 5


def test_an_explicit_missing_config_is_an_error(run_memwatch, tmp_path):
    proc = run_memwatch("replay", "--config", str(tmp_path / "nope.json"), "/dev/null")
    assert proc.returncode == 2 and "cannot read" in proc.stderr


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg is not readable here")
def test_kmsg_source_counts_by_sequence_number_across_restarts(mw):
    cfg = mw.validate_config({"kernel_log_source": "kmsg", "kernel_log_pattern": "e"})
    state = {}
    first = mw.KernelLog(cfg, state).poll()
    assert first > 0 and state["seq"] >= 0 and state["boot_id"]
    saved = json.loads(json.dumps(state))       # as persisted in the state file
    again = mw.KernelLog(cfg, saved).poll()     # a restarted memwatch: only records after seq
    assert again < first
    saved["boot_id"] = "another-boot"           # after a reboot the sequence starts over
    assert mw.KernelLog(cfg, saved).poll() >= first


def test_metrics_carry_the_configured_thresholds(mw, lab):
    """The monitoring alerts compare MemAvailable with memwatch's own thresholds (docs/monitoring.md)."""
    dog = lab.watchdog(mw, available_lt_gib=6.5, available_and_free_available_lt_gib=11,
                       available_and_free_free_lt_gib=2.25)
    drive(dog, lab, [(60, 30)])
    m = lab.metrics()
    thresholds = dict((dict(labels)["rule"] + "/" + dict(labels)["field"], value)
                      for (name, labels), value in m.items() if name == "memwatch_rule_threshold_bytes")
    assert thresholds == {"available/MemAvailable": 6.5 * 1024 ** 3,
                          "available_and_free/MemAvailable": 11 * 1024 ** 3,
                          "available_and_free/MemFree": 2.25 * 1024 ** 3}
