"""One meaning of "idle" (roles/serve/files/serve-unit `reading`, SPEC §11; used by the rollout's
drain and gate and by the drained recycle): vLLM's gauges and completions from a stand-in API server
(HTTP on loopback), the liveness state file as `run` writes it, and a stand-in `systemctl` for the
unit's current invocation. What is asserted: the 0/0 gauges a stalled engine leaves behind, while
liveness still says "live", are not idle: a probe generation made by the reading must pass; busy is
busy at once; a stalled or starting server is not live; a unit without liveness falls back to the
gauges, said so.
"""
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import harness

HELPER = os.path.join(harness.ROOT, "roles", "serve", "files", "serve-unit")
UNIT = "sparkops-serve.service"


class Server:
    """/metrics with vLLM's two gauges (running, waiting), or a 500 when `down`; /v1/completions
    answers, hangs (a stalled engine) or refuses (404), and counts the requests it got."""

    def __init__(self):
        self.running, self.waiting, self.down, self.completions, self.asked = 0, 0, False, "answer", []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):      # pylint: disable=arguments-differ
                pass

            def _send(self, code, body):
                data = body.encode("utf-8")
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):                  # pylint: disable=invalid-name
                if me.down:
                    self._send(500, "")
                    return
                self._send(200, 'vllm:num_requests_running{engine="0",model_name="m"} %s\n'
                                'vllm:num_requests_waiting{engine="0",model_name="m"} %s\n' % (me.running, me.waiting))

            def do_POST(self):                 # pylint: disable=invalid-name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                me.asked.append((self.headers.get("Authorization"), body))
                if me.completions == "hang":
                    time.sleep(5)          # the reading gave up after its 1 s: nobody reads the answer
                    return
                if me.completions == "404":
                    self._send(404, '{"error": "model m2 does not exist"}')
                    return
                self._send(200, '{"choices": [{"text": "x"}]}')

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(name="server", scope="module")
def server_fixture():
    m = Server()
    yield m
    m.server.shutdown()


@pytest.fixture(name="box")
def box_fixture(tmp_path, server):
    server.running, server.waiting, server.down, server.completions, server.asked = 0, 0, False, "answer", []
    bindir = tmp_path / "bin"
    bindir.mkdir()
    systemctl = bindir / "systemctl"
    systemctl.write_text("#!/bin/sh\necho inv-now\n")
    systemctl.chmod(0o755)
    (tmp_path / "live").mkdir()
    (tmp_path / "env").write_text("OTHER=1\nVLLM_API_KEY=k-123\n")
    return tmp_path


def write_state(box, **fields):
    state = {"state": "live", "reason": "x", "invocation": "inv-now", "last_success": time.time() - 5, "unit": UNIT}
    state.update(fields)
    (box / "live" / "state.json").write_text(json.dumps(state))


def reading(box, server, *extra, liveness=True):
    env = dict(os.environ, PATH="%s:%s" % (box / "bin", os.environ["PATH"]))
    started = time.monotonic()
    r = subprocess.run([sys.executable, HELPER, "reading", "--unit", UNIT, "--base-url", server.url,
                        "--liveness-dir", str(box / "live") if liveness else "", "--model", "m",
                        "--api-key-file", str(box / "env"), "--probe-timeout-s", "1"] + list(extra),
                       capture_output=True, text=True, env=env, timeout=60, check=False)
    out = json.loads(r.stdout) if r.stdout.strip() else {}
    return r.returncode, out, time.monotonic() - started


def test_idle_and_a_probe_that_passes_now_is_idle(box, server):
    write_state(box)
    rc, out = reading(box, server)[:2]
    assert rc == 0 and out["live"] is True and out["queue"] == 0, out
    assert out["why"].startswith("a probe generation: HTTP 200 in ")
    # liveness's own probe: one token of the served model, with the server's key from the env file
    assert server.asked == [("Bearer k-123", {"model": "m", "prompt": "hello", "max_tokens": 1})]


def test_the_stale_gauges_of_a_stalled_engine_are_not_idle(box, server):
    """0 running, 0 waiting, liveness still says live (its own probe has not timed out yet), and a
    generation does not complete: not live. Read by the gauges alone this was drained."""
    write_state(box)
    server.completions = "hang"
    rc, out, took = reading(box, server)
    assert rc == 4 and out["live"] is False, out
    assert out["why"].startswith("a probe generation: timed out in 1.")
    assert took < 15


@pytest.mark.parametrize("state", ["stalled", "starting", "given_up"])
def test_a_server_liveness_does_not_find_live_is_not_idle(box, server, state):
    write_state(box, state=state, reason="what liveness said")
    rc, out = reading(box, server)[:2]
    assert rc == 4 and out["why"] == "liveness says %s: what liveness said" % state
    assert not server.asked


def test_busy_is_busy_at_once_and_live_for_the_gate(box, server):
    server.running, server.waiting = 1, 2
    write_state(box)
    rc, out = reading(box, server)[:2]
    assert rc == 3 and out["queue"] == 3 and out["why"] == "3 request(s) running or waiting", out
    assert not server.asked
    # the rollout's gate asks for live only
    rc, out = reading(box, server, "--want", "live")[:2]
    assert rc == 0 and out["live"] is True
    server.completions = "hang"
    rc, out = reading(box, server, "--want", "live")[:2]
    assert rc == 4 and out["live"] is False


def test_a_probe_the_api_server_refuses_leaves_the_gauges_alone(box, server):
    write_state(box)
    server.completions = "404"
    rc, out = reading(box, server)[:2]
    assert rc == 0 and "a probe generation cannot judge this server (HTTP 404" in out["why"], out


def test_a_unit_without_liveness_is_read_by_its_gauges_said_so(box, server):
    # no state file: a unit from before liveness (a rollout replaces it)
    rc, out = reading(box, server)[:2]
    assert rc == 0 and "a unit without liveness" in out["why"]
    # a state of an earlier start: this start runs without liveness
    write_state(box, invocation="inv-before", state="stalled")
    rc, out = reading(box, server)[:2]
    assert rc == 0 and "its state is of an earlier one" in out["why"]
    # liveness off in the role (serve_liveness_enabled false)
    rc, out = reading(box, server, liveness=False)[:2]
    assert rc == 0 and "liveness is off" in out["why"]
    server.running = 1
    rc, out = reading(box, server, liveness=False)[:2]
    assert rc == 3
    assert not server.asked


def test_no_metrics_is_its_own_answer(box, server):
    server.down = True
    write_state(box)
    rc, out = reading(box, server)[:2]
    assert rc == 5 and out["why"].startswith(server.url + "/metrics: ")
