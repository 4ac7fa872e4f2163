"""A pair's head waits for its worker before vLLM starts (roles/serve/files/serve-unit `wait-pair`,
the head unit's ExecStartPre; docs/cluster.md "When a node goes away"). The Ray node count is a
stand-in for `docker exec -i <ray container> python3 - ADDRESS 2 BOUND < cluster-nodes.py` that
answers from a script of outcomes (the lab's cluster scenario runs the real one); systemd's notify
socket is a real AF_UNIX datagram socket the test reads. What is asserted: a missing worker is
waited for past every bound, with systemd told each time (EXTEND_TIMEOUT_USEC, STATUS), so a worker
away for hours costs one start and no failed start; the head's own Ray not answering fails the
start after --timeout-s; the count gets the script on stdin and its bound as its last argument.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

import harness

HELPER = os.path.join(harness.ROOT, "roles", "serve", "files", "serve-unit")
SCRIPT = os.path.join(harness.ROOT, "roles", "cluster", "files", "cluster-nodes.py")

# The stand-in count: each call takes the next outcome from OUTCOMES (the last one repeats) and
# records its argv and whether stdin was cluster-nodes.py.
NODES = r'''
import json, os, sys
box = os.environ["WAIT_BOX"]
with open(os.path.join(box, "outcomes")) as f:
    outcomes = f.read().split()
with open(os.path.join(box, "calls"), "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "stdin_is_script": sys.stdin.read() == open(os.environ["WAIT_SCRIPT"]).read()}) + "\n")
n = sum(1 for _ in open(os.path.join(box, "calls")))
what = outcomes[min(n, len(outcomes)) - 1]
if what == "both":
    print(json.dumps({"address": "10.10.0.1:6379", "want": 2, "alive": 2, "alive_ips": ["10.10.0.1", "10.10.0.2"]}))
    sys.exit(0)
if what == "worker":
    print(json.dumps({"address": "10.10.0.1:6379", "want": 2, "alive": 1, "alive_ips": ["10.10.0.1"]}))
    sys.exit(1)
if what == "headless":      # the head's GCS answers, its own node is not alive (only the worker's)
    print(json.dumps({"address": "10.10.0.1:6379", "want": 2, "alive": 1, "alive_ips": ["10.10.0.2"]}))
    sys.exit(1)
if what == "head":
    print(json.dumps({"address": "10.10.0.1:6379", "want": 2, "alive": 0, "error": "Could not find any running Ray instance"}))
    sys.exit(2)
sys.stderr.write("Error response from daemon: No such container: sparkops-ray\n")   # "gone"
sys.exit(1)
'''


class Box:
    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.nodes = tmp_path / "nodes.py"
        self.nodes.write_text(NODES)
        self.sock_path = str(tmp_path / "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.sock_path)
        self.sock.settimeout(0.2)
        # read as systemd does, all along: a datagram socket holds only a few unread messages
        # (net.unix.max_dgram_qlen) before the sender blocks
        self.received, self.closing = [], threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while not self.closing.is_set():
            try:
                self.received.append(self.sock.recv(65536).decode("ascii"))
            except socket.timeout:
                continue

    def run(self, outcomes, timeout_s=2, poll_s=0.2):
        (self.dir / "outcomes").write_text(" ".join(outcomes))
        env = dict(os.environ, WAIT_BOX=str(self.dir), WAIT_SCRIPT=SCRIPT, NOTIFY_SOCKET=self.sock_path)
        started = time.monotonic()
        r = subprocess.run([sys.executable, HELPER, "wait-pair", "--timeout-s", str(timeout_s), "--attempt-s", "7",
                            "--poll-s", str(poll_s), "--log-every-s", "0", "--rest-s", "1470", "--script", SCRIPT, "--",
                            sys.executable, str(self.nodes), "10.10.0.1:6379", "2"],
                           capture_output=True, text=True, env=env, timeout=120, check=False)
        return r, time.monotonic() - started

    def calls(self):
        with open(self.dir / "calls", encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def notes(self):
        time.sleep(0.5)       # the last datagram read
        return list(self.received)


@pytest.fixture(name="box")
def box_fixture(tmp_path):
    b = Box(tmp_path)
    yield b
    b.closing.set()
    b.reader.join(timeout=5)
    b.sock.close()


def test_a_missing_worker_is_waited_for_past_every_bound_with_systemd_told(box):
    """15 looks without the worker (about 3 s, past --timeout-s 2): still one start, then it starts."""
    r, took = box.run(["worker"] * 15 + ["both"], timeout_s=2)
    assert r.returncode == 0, r.stderr
    assert took > 2.5
    calls = box.calls()
    assert len(calls) == 16
    assert all(c["stdin_is_script"] for c in calls)
    assert all(c["argv"] == ["10.10.0.1:6379", "2", "7"] for c in calls)     # the look's own bound last
    notes = box.notes()
    # before each of the 16 looks: the deadline moved past it (one look of 7 s, its answer's bound of
    # 90 s, the pause and a margin, from then); after each look without the worker: what it saw
    extend = "EXTEND_TIMEOUT_USEC=%d\nSTATUS=" % int((7 + 90 + 0.2 + 30) * 1e6)
    waiting = "waiting for the pair's worker: 1 of 2 Ray nodes alive (10.10.0.1)"
    assert notes[0] == extend + "looking for both Ray nodes of the pair"
    assert len(notes) == 1 + 15 * 2 + 1
    for look in range(15):
        assert notes[1 + 2 * look].startswith("STATUS=" + waiting)
        assert notes[2 + 2 * look].startswith(extend + waiting)
    # once both are there, the rest of the start gets the unit's whole TimeoutStartSec again
    assert notes[-1] == "EXTEND_TIMEOUT_USEC=1470000000\nSTATUS=both Ray nodes alive: starting the server"
    assert "waiting for the pair's worker" in r.stderr
    assert "both Ray nodes are alive after" in r.stderr


def test_both_nodes_at_the_first_look_start_at_once_and_say_nothing(box):
    r = box.run(["both"])[0]
    assert r.returncode == 0 and r.stderr == ""
    assert box.notes() == ["EXTEND_TIMEOUT_USEC=%d\nSTATUS=looking for both Ray nodes of the pair" % int((7 + 90 + 0.2 + 30) * 1e6)]


@pytest.mark.parametrize("gone", ["head", "gone", "headless"])
def test_the_heads_own_ray_not_answering_fails_the_start_after_the_bound(box, gone):
    r, took = box.run([gone], timeout_s=1)
    assert r.returncode == 1
    assert 1 <= took < 30
    assert "the head's own Ray does not answer" in r.stderr and "this start fails" in r.stderr
    assert {"head": "Could not find any running Ray instance", "gone": "No such container",
            "headless": "its own node 10.10.0.1 is not among the alive ones: 10.10.0.2"}[gone] in r.stderr
    # while it is still within the bound, systemd hears that the start goes on
    assert all("STATUS=the head's own Ray does not answer" in n for n in box.notes()[1:-1])


def test_the_heads_bound_counts_only_time_without_its_ray(box):
    """Ray restarting on the head (its container gone a while), then the worker missing long after
    the head's bound, then both: the head's bound restarts once its Ray answers again."""
    # 4 s: three looks without Ray take well under it even on a loaded machine (1 s did not, once, beside
    # a CI run); the 25 looks without the worker take longer than it, so a bound that kept counting fails
    r, took = box.run(["gone"] * 3 + ["worker"] * 25 + ["gone"] * 3 + ["both"], timeout_s=4)
    assert r.returncode == 0, r.stderr
    assert len(box.calls()) == 32
    assert took > 4


def test_a_timeout_while_waiting_for_the_worker_is_not_a_failed_start(box, tmp_path):
    """A systemd reload re-arms the start's timer without the extension: a wait longer than
    TimeoutStartSec then times out. stop-post does not count that start (the marker of this
    invocation); any other timeout still counts."""
    state = tmp_path / "state"
    env = dict(os.environ, WAIT_BOX=str(box.dir), WAIT_SCRIPT=SCRIPT, INVOCATION_ID="inv7")
    (box.dir / "outcomes").write_text("worker worker both")
    r = subprocess.run([sys.executable, HELPER, "wait-pair", "--unit", "x.service", "--state-dir", str(state),
                        "--attempt-s", "7", "--poll-s", "0.1", "--script", SCRIPT, "--",
                        sys.executable, str(box.nodes), "10.10.0.1:6379", "2"],
                       capture_output=True, text=True, env=env, timeout=60, check=False)
    assert r.returncode == 0 and not (state / "x.service.waiting").exists()     # cleared once both are there
    (state / "x.service.waiting").write_text("inv7\n")                          # as while it waited
    post = [sys.executable, HELPER, "stop-post", "--unit", "x.service", "--state-dir", str(state)]
    timeout = dict(env, SERVICE_RESULT="timeout", EXIT_CODE="killed", EXIT_STATUS="TERM")
    r = subprocess.run(post, capture_output=True, text=True, env=timeout, timeout=60, check=True)
    assert "not a failed start" in r.stderr and not (state / "x.service.failed-starts").exists()
    # another invocation's marker: counted
    subprocess.run(post, capture_output=True, text=True, env=dict(timeout, INVOCATION_ID="inv8"), timeout=60, check=True)
    assert (state / "x.service.failed-starts").read_text() == "1\n"
