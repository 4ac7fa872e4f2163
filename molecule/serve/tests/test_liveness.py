# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Liveness on the lab Spark's real systemd with the real vLLM (SPEC §11; docs/runtime.md
"Liveness"), with the scenario's shortened bounds (molecule.yml: a look every 5 s, busy without
progress for 15 s, a 10 s probe, one restart in the window):

- long concurrent requests for more than three stall bounds restart nothing, and each completes;
- an engine stopped with SIGSTOP (its API server still answers /health 200) is found, its
  evidence kept, and the server serves again with no manual step; the time from the stall to a
  served completion is measured and written to build/liveness-drill.json;
- the same stall again, past the bound, leaves the server stopped (exit 78, not restarted) with its
  reason in the journal, the state file and the metrics; a start by hand serves again.

Runs before the other files of this scenario (alphabetical) and leaves the server serving."""
import json
import os
import shlex
import time

from test_unit_semantics import (BASE, CONTAINER, HEALTH_TIMEOUT_S, PROJECT, SVC, end_load, ensure_serving, healthy,
                                 journal, now, prop, start_load, wait_for)
from lab_key import curl_auth  # tests/support, put on the path by test_unit_semantics

LIVE_DIR = "/var/lib/sparkops/serve/sparkops-serve-liveness"
PROM = "/var/lib/prometheus/node-exporter/sparkops-serve-liveness.prom"
STALL_S = 15            # serve_liveness_stall_s in molecule.yml
# serve-unit reading as spark_serve.reading renders it here: the rollout's drain and the recycle ask it
READING = ("/usr/local/libexec/sparkops/serve-unit reading --unit %s --base-url %s --liveness-dir %s --model tiny-llama "
           "--api-key-file /etc/sparkops/sparkops-serve.env --probe-timeout-s 10 --want idle" % (SVC, BASE, LIVE_DIR))
ENGINE_STOP = ("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^VLLM::EngineCore' "
               "&& kill -STOP ${p#/proc/} && echo stopped ${p#/proc/}; done")


def completes(host, max_time=20):
    body = json.dumps({"model": "tiny-llama", "prompt": "hello", "max_tokens": 4})
    return host.run("curl -fsS --max-time %d -o /dev/null %s -H 'Content-Type: application/json' -d '%s' %s/v1/completions"
                    % (max_time, curl_auth(), body, BASE)).rc == 0


def state(host):
    return json.loads(host.file(LIVE_DIR + "/state.json").content_string)


def metric(host, name, **labels):
    want = ",".join(['unit="%s"' % SVC] + ['%s="%s"' % kv for kv in sorted(labels.items())])
    for line in host.file(PROM).content_string.splitlines():
        if line.startswith("sparkops_serve_liveness_%s{%s}" % (name, want)):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no %s{%s} in %s" % (name, want, PROM))


def incidents(host):
    r = host.run("ls %s/incidents" % LIVE_DIR)
    return r.stdout.split() if r.rc == 0 else []


def stall_engine(host):
    r = host.run("docker exec %s sh -c %s" % (CONTAINER, shlex.quote(ENGINE_STOP)))
    assert "stopped" in r.stdout, (r.stdout, r.stderr)
    # the failure this is about: /health still 200 while no request completes
    assert healthy(host)
    assert not completes(host, max_time=4)


def test_long_requests_over_three_stall_bounds_restart_nothing(host):
    ensure_serving(host)
    inv, restarts = prop(host, SVC, "InvocationID"), prop(host, SVC, "NRestarts")
    before = incidents(host)
    load = "sparkops-test-liveness-load"
    try:
        start_load(host, load, "/tmp/lload", 8)
        t0 = time.monotonic()
        time.sleep(3 * STALL_S + 10)
        end_load(host, load, "/tmp/lload", 8)
        lasted = time.monotonic() - t0
        assert lasted > 3 * STALL_S
        assert prop(host, SVC, "InvocationID") == inv, "the server was restarted under load"
        assert prop(host, SVC, "NRestarts") == restarts
        assert incidents(host) == before
        assert state(host)["state"] == "live"
    finally:
        host.run("touch /tmp/lload/stop; systemctl stop %s" % load)


def test_a_stalled_engine_is_found_and_the_server_serves_again(host):
    ensure_serving(host)
    inv = prop(host, SVC, "InvocationID")
    total = state(host).get("restarts_total", 0)
    before = incidents(host)
    since = now(host)
    t0 = time.monotonic()
    stall_engine(host)
    # one meaning of "idle" (the drains' and the gate's): the frozen gauges say nothing runs or
    # waits, and liveness has not judged yet, but the stalled server is not idle
    r = host.run(READING)
    seen = json.loads(r.stdout or "{}")
    assert r.rc == 4 and seen.get("queue") == 0 and seen.get("live") is False, (r.stdout, r.stderr)
    wait_for("the server to serve again after the stall",
             lambda: prop(host, SVC, "InvocationID") != inv and completes(host), HEALTH_TIMEOUT_S + 120, step=2)
    seconds = round(time.monotonic() - t0, 1)
    os.makedirs(os.path.join(PROJECT, "build"), exist_ok=True)
    with open(os.path.join(PROJECT, "build", "liveness-drill.json"), "w", encoding="utf-8") as f:
        json.dump({"stall_to_serving_s": seconds, "at": time.time()}, f)
    print("liveness drill: from the stall to a served completion in %.1f s" % seconds)
    log = journal(host, SVC, since)
    assert "liveness: %s stalled (" % SVC in log and "stopped for a restart (1 of at most 1" in log, log[-3000:]
    st = state(host)
    assert st["restarts_total"] == total + 1 and len(st["restarts"]) == 1
    new = sorted(set(incidents(host)) - set(before))
    assert len(new) == 1
    summary = json.loads(host.file("%s/incidents/%s/summary.json" % (LIVE_DIR, new[0])).content_string)
    assert summary["probe"]["ok"] is False and "timed out" in summary["probe"]["detail"], summary
    assert "vllm:num_requests_running" in host.file("%s/incidents/%s/metrics.txt" % (LIVE_DIR, new[0])).content_string
    assert "Started " in host.file("%s/incidents/%s/journal.txt" % (LIVE_DIR, new[0])).content_string
    wait_for("liveness to find the new server live", lambda: state(host)["state"] == "live", 60)
    assert metric(host, "restarts_total") == total + 1 and metric(host, "state", state="live") == 1


def test_a_server_that_stalls_again_past_the_bound_is_left_stopped(host):
    ensure_serving(host)
    assert len(state(host)["restarts"]) == 1, "runs after the drill above (one restart in the window)"
    restarts = prop(host, SVC, "NRestarts")
    since = now(host)
    stall_engine(host)
    wait_for("the server to be stopped", lambda: prop(host, SVC, "ActiveState") in ("failed", "inactive"), 120, step=2)
    time.sleep(int(prop(host, SVC, "RestartUSec").rstrip("s") or 15) + 5)   # a restart would have begun
    try:
        assert prop(host, SVC, "ActiveState") in ("failed", "inactive")
        assert prop(host, SVC, "NRestarts") == restarts, "restarted past the bound"
        assert prop(host, SVC, "ExecMainStatus") == "78"
        log = journal(host, SVC, since)
        assert "stopped and left stopped" in log and "serve_liveness_max_restarts=1" in log, log[-3000:]
        st = state(host)
        assert st["state"] == "given_up" and "systemctl start %s" % SVC in st["reason"]
        assert metric(host, "state", state="given_up") == 1
        assert host.run("docker inspect %s" % CONTAINER).rc != 0, "the stalled container is still there"
    finally:
        # a start by hand clears the window and serves again
        host.run("systemctl reset-failed %s" % SVC)
        host.run_expect([0], "systemctl start %s" % SVC)
    ensure_serving(host)
    assert state(host)["restarts"] == [] and state(host)["state"] == "live"
