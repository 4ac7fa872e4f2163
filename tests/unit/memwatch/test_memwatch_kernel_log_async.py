"""Sampling never waits on the kernel-log read.

A stand-in journalctl (a script, named as such) that sleeps before answering plays a slow
journal; one that never answers plays a hung one. The real `memwatch run` process samples
meanwhile: the diag event of every sample (diag_every_samples 1) carries its time stamp, and the
gaps between them must stay near the interval.
"""
import datetime
import json
import os
import subprocess
import sys

import pytest

from mwhelpers import PROGRAM, Lab, fake_journalctl
from test_memwatch_daemon import NV


def journal_lab(lab, monkeypatch, sleep_s):
    """The stand-in journalctl (mwhelpers), answering after sleep_s, with one NV_ERR line."""
    jctl, _journal, pids = fake_journalctl(lab, monkeypatch, "boot\n" + NV, sleep_s=sleep_s)
    return jctl, pids


def sample_times(stderr):
    """{sample number: unix time} from the diag events (one per sample with diag_every_samples 1)."""
    out = {}
    for line in stderr.splitlines():
        rec = json.loads(line)
        if rec["event"] == "diag":
            out[rec["sample"]] = datetime.datetime.strptime(rec["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
    return out


# The two `memwatch run` processes below mostly wait (on the interval, on the slow or hung journal):
# they run side by side, each in its own lab (its own tmp tree, stand-ins and environment), started
# once for this module; each test reads its own run. Same configurations, samples and bounds.
RUNS = {
    # name: (journal answers after s, samples, config overrides)
    "slow": (3, 25, {}),
    "hung": (600, 20, {"kernel_log_timeout_s": 1}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    started = {}
    env = pytest.MonkeyPatch()
    try:
        for name, (sleep_s, samples, extra) in RUNS.items():
            lab = Lab(tmp_path_factory.mktemp("memwatch-" + name), env)
            jctl, pids = journal_lab(lab, env, sleep_s=sleep_s)
            cfg = lab.write_config(interval_s=0.2, diag_every_samples=1, kernel_log_source="journal",
                                   journalctl=jctl, **extra)
            err = open(str(lab.tmp / "memwatch.stderr"), "w+")
            # the environment as the lab set it now (FAKE_JOURNAL* of this lab): the process keeps it
            proc = subprocess.Popen([sys.executable, PROGRAM, "run", "--config", cfg, "--samples", str(samples)],
                                    stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ))
            started[name] = (lab, pids, proc, err)
    finally:
        env.undo()
    done = {}
    try:
        for name, (lab, pids, proc, err) in started.items():
            rc = proc.wait(timeout=120)
            err.seek(0)
            done[name] = (lab, pids, subprocess.CompletedProcess(proc.args, rc, "", err.read()))
    finally:
        for _lab, _pids, proc, err in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.close()
    return done


def test_samples_keep_their_interval_while_the_journal_is_slow(runs):
    lab, _pids, proc = runs["slow"]
    assert proc.returncode == 0, proc.stderr
    times = sample_times(proc.stderr)
    assert sorted(times) == list(range(1, 26))
    gaps = [times[n + 1] - times[n] for n in range(1, 25)]
    # 0.2 s interval; a loaded CI machine may be late by a second, never by the journal's 3 s
    assert max(gaps) < 1.5, gaps
    # the slow read still counted its NV_ERR line (once) when it came back, during sampling
    counted = [json.loads(line) for line in proc.stderr.splitlines() if '"nv_err_no_memory"' in line]
    assert [c["total"] for c in counted] == [1]
    state = json.loads((lab.tmp / "state.json").read_text())
    assert state["nv_err_total"] == 1 and state["kernel_log"]["cursor"] == "s=1"


def test_a_hung_journalctl_is_bounded_and_reaped(runs):
    _lab, pids, proc = runs["hung"]
    assert proc.returncode == 0, proc.stderr
    logged = [json.loads(line) for line in proc.stderr.splitlines()]
    (unavailable,) = [e for e in logged if e["event"] == "kernel_log_unavailable"]
    assert "did not answer within 1 s" in unavailable["error"]
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) >= 2  # read again at a later diag pass after the first was cut
    for pid in started:       # every stand-in journalctl was killed and reaped: none is left
        assert not os.path.exists("/proc/%d" % pid), "journalctl %d still there" % pid
    times = sample_times(proc.stderr)
    assert max(times[n + 1] - times[n] for n in range(1, 20)) < 1.5
    m = [e for e in logged if e["event"] == "stop"]
    assert m and m[0]["samples"] == 20


def test_the_position_is_saved_with_the_count_and_read_by_the_next_start(mw, lab, monkeypatch):
    """Each line counted once across restarts: the count and the cursor are persisted together,
    by the sampling thread, after the reader's result is taken in."""
    jctl, _pids = journal_lab(lab, monkeypatch, sleep_s=0)
    over = {"kernel_log_source": "journal", "journalctl": jctl, "diag_every_samples": 1}
    dog = lab.watchdog(mw, **over)
    lab.write_meminfo(60, 30)
    dog.sample()
    assert dog.kernel_log_settle(10)
    assert dog.state["nv_err_total"] == 1
    saved = json.loads((lab.tmp / "state.json").read_text())
    assert saved["nv_err_total"] == 1 and saved["kernel_log"] == {"cursor": "s=1"}
    dog.close()
    with open(str(lab.tmp / "journal.txt"), "a") as handle:
        handle.write(NV)
    dog2 = lab.watchdog(mw, **over)
    dog2.sample()
    assert dog2.kernel_log_settle(10)
    dog2.sample()
    assert dog2.kernel_log_settle(10)
    assert dog2.state["nv_err_total"] == 2 and dog2.state["kernel_log"]["cursor"] == "s=2"
