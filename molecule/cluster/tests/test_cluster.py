"""Two lab Sparks as one TP=2 server (SPEC §8): a real 2-node Ray cluster, the head's vLLM serving
with TP=2 over Ray, Ray's ports answering on the interconnect only, and the failure path (a stopped worker
ends the head's server, a converge names it, starting it again serves again with no manual step)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(PROJECT, "tests", "support"))
from lab_key import curl_auth  # noqa: E402 (tests/support is put on the path just above)
CONVERGE = os.path.join(os.path.dirname(HERE), "converge.yml")
CHECK_NODES = os.path.join(PROJECT, "roles", "cluster", "files", "cluster-nodes.py")
CHECKER = os.path.join(PROJECT, "roles", "serve", "files", "vllm_check_args.py")
with open(os.path.join(os.path.dirname(HERE), "molecule.yml"), encoding="utf-8") as _f:
    _INV = yaml.safe_load(_f)["provisioner"]["inventory"]
HEAD, WORKER = "sparkops-molecule-cluster-head", "sparkops-molecule-cluster-worker"
IPS = {h: v["spark_interconnect_ip"] for h, v in _INV["host_vars"].items()}
ADDRESS = IPS[HEAD] + ":6379"
BASE = "http://127.0.0.1:8000"


def _name(host):
    return host.backend.get_hostname()


def _nodes(host, want=2, timeout_s=5):
    """The head's Ray, asked from inside its Ray container: (exit status, JSON)."""
    with open(CHECK_NODES, encoding="utf-8") as f:
        script = f.read()
    r = subprocess.run(["docker", "exec", "-i", HEAD + "-ray", "python3", "-", ADDRESS, str(want), str(timeout_s)],
                       input=script, capture_output=True, text=True, timeout=timeout_s + 120, check=False)
    return r.returncode, (json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {})


def _complete(host, prompt="hello"):
    cmd = ("curl -fsS --max-time 120 %s/v1/completions %s -H 'Content-Type: application/json' -d '%s'"
           % (BASE, curl_auth(), json.dumps({"model": "tiny-llama", "prompt": prompt, "max_tokens": 4})))
    return json.loads(host.check_output(cmd))


def _wait(predicate, bound_s, step_s=3):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def _converge(*extra):
    env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
    return subprocess.run(["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], CONVERGE] + list(extra),
                          capture_output=True, text=True, env=env, cwd=PROJECT, timeout=1800, check=False)


def test_two_alive_nodes_seen_from_the_head(host):
    if _name(host) != HEAD:
        pytest.skip("asked from the head")
    rc, out = _nodes(host)
    assert rc == 0, out
    assert out["alive"] == 2 and out["alive_ips"] == sorted(IPS.values())


def test_the_worker_runs_no_server(host):
    if _name(host) != WORKER:
        pytest.skip("the worker")
    assert not host.file("/etc/systemd/system/sparkops-serve.service").exists
    assert host.service("sparkops-ray").is_running


def test_head_serves_tp2_over_ray_and_vllm_parses_the_line(host):
    if _name(host) != HEAD:
        pytest.skip("the head")
    unit = host.file("/etc/systemd/system/sparkops-serve.service").content_string
    # the ExecStart= line and its continuation lines only (comments and ExecStop= follow it)
    lines = unit.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    command = []
    for line in lines[start:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    flat = " ".join(" ".join(command).split())
    assert "--tensor-parallel-size 2 --distributed-executor-backend ray" in flat
    repo = " sparkops/molecule-cluster-runtime:"   # the scenario's runtime_image_repo
    args = flat.split(repo, 1)[1].split(" ", 1)[1]
    image = repo.strip() + flat.split(repo, 1)[1].split(" ", 1)[0]
    with open(CHECKER, encoding="utf-8") as f:
        r = subprocess.run(["docker", "run", "--rm", "-i", "--network", "none", "--entrypoint", "python3", image, "-"]
                           + args.split(), input=f.read(), capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    assert '"accepted": true' in r.stdout


MGMT = {HEAD: "172.31.252.11", WORKER: "172.31.252.12"}   # molecule.yml: the management network (eth1)
PROBE = """
import json, socket, sys, threading
out = {}

def probe(port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((sys.argv[1], port))
        out[port] = "open"
    except socket.timeout:
        out[port] = "no answer"
    except OSError as e:
        out[port] = "refused" if e.errno == 111 else "error %s" % e
    finally:
        s.close()

threads = [threading.Thread(target=probe, args=(int(p),)) for p in sys.argv[2:]]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
"""


def _probe(from_node, address, port):
    """Connect from a lab Spark (its network namespace is its Ray container's) to address:port."""
    return _probe_many(from_node, address, [port])[port]


def _probe_many(from_node, address, ports):
    """{port: open, no answer, refused or error ...} for address:port from a lab Spark, all at once."""
    r = subprocess.run(["docker", "exec", "-i", from_node, "python3", "-", address] + [str(p) for p in ports], input=PROBE,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return {int(k): v for k, v in json.loads(r.stdout).items()}


ALLOWED = {HEAD: {22, 8000, 9100}, WORKER: {22, 9100}}   # cluster_firewall_allow_tcp, and the head's serve_port


def test_every_port_but_the_allowed_ones_is_closed_on_the_management_network(host):
    """Ray 2.60 (GCS, raylet, agents, workers, the client server on 10001) and vLLM's tensor-parallel
    listeners (TCPStore, NCCL bootstrap, ZMQ) bind 0.0.0.0; Linux takes a packet for any local
    address on any interface. The cluster role's nftables table is an allow-list on every interface
    but the interconnect (eth0 here) and loopback. Probed from the other node while the pair serves:
    every listening port answers on the interconnect address; on the management address only the
    allowed ones do (the head's server among them), every other one gives no answer, a listener
    started for the test too; an allowed port with nothing behind it is refused (the path is up)."""
    name = _name(host)
    other = WORKER if name == HEAD else HEAD
    assert IPS[name] in host.check_output("ip -o -4 addr show dev eth0")      # eth0 is the interconnect
    if name == HEAD:
        assert _wait(lambda: host.run("curl -fsS --max-time 5 %s/health" % BASE).rc == 0, 600, step_s=10)
    out = host.check_output("docker exec %s-ray ss -ltnH" % name)
    local = [line.split()[3] for line in out.splitlines() if line.strip()]
    others = [a for a in local if not a.startswith((IPS[name] + ":", "127.0.0.", "0.0.0.0:", "*:", "[::]:"))]
    assert others == []
    assert not any(a.endswith((":8265", ":52365")) for a in local)   # dashboard and job API are off
    ports = sorted({int(a.rsplit(":", 1)[1]) for a in local if not a.startswith(("127.0.0.", "[::1]:"))})
    ray_port = 6379 if name == HEAD else 6380                             # the GCS; the worker's raylet
    assert ray_port in ports, ports
    if name == HEAD:
        assert {10001, 8000} <= set(ports), ports          # Ray's client server; the server
        assert len(ports) > 10, ports                       # with vLLM's own listeners beside Ray's
    table = host.check_output("nft list table inet sparkops_ray")
    assert 'iifname { "eth0", "lo" } accept' in table or 'iifname { "lo", "eth0" } accept' in table, table
    inside = _probe_many(other, IPS[name], ports)
    assert set(inside.values()) == {"open"}, inside
    seen = _probe_many(other, MGMT[name], ports)
    wrong = {port: answer for port, answer in seen.items()
             if answer != ("open" if port in ALLOWED[name] else "no answer")}
    assert wrong == {}, seen
    assert _probe(other, MGMT[name], 22) in ("open", "refused")           # allowed: the path is up
    control = host.run("systemd-run --unit sparkops-probe-6399 python3 -m http.server 6399 --bind 0.0.0.0")
    assert control.rc == 0, control.stderr
    try:
        assert _wait(lambda: host.run("curl -fsS --max-time 2 -o /dev/null http://127.0.0.1:6399/").rc == 0, 30, step_s=0.5)
        assert _probe(other, IPS[name], 6399) == "open"
        assert _probe(other, MGMT[name], 6399) == "no answer"
    finally:
        host.run("systemctl stop sparkops-probe-6399")


def test_completion_with_tp2_across_both_sparks(host):
    if _name(host) != HEAD:
        pytest.skip("the head")
    out = _complete(host)
    assert out["usage"]["completion_tokens"] > 0


SVC = "sparkops-serve.service"
LIVE_DIR = "/var/lib/sparkops/serve/sparkops-serve-liveness"
DRILLS = os.path.join(PROJECT, "tests", "output", "molecule-cluster", "drills.json")
# the vLLM worker of the head's server on the worker node (a Ray actor in the worker's Ray container)
WORKER_ACTOR_STOP = ("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^ray::RayWorker' "
                     "&& kill -STOP ${p#/proc/} && echo ${p#/proc/}; done")


def _healthy(host):
    return host.run("curl -fsS --max-time 5 %s/health" % BASE).rc == 0


def _answers(host, max_time=20):
    body = json.dumps({"model": "tiny-llama", "prompt": "hello", "max_tokens": 4})
    return host.run("curl -fsS --max-time %d -o /dev/null %s -H 'Content-Type: application/json' -d '%s' %s/v1/completions"
                    % (max_time, curl_auth(), body, BASE)).rc == 0


def _prop(host, name):
    return host.check_output("systemctl show -p %s --value %s" % (name, SVC)).strip()


def _record(drill, seconds):
    """The measured time of a drill, kept with the scenario's evidence (and printed in the test log)."""
    os.makedirs(os.path.dirname(DRILLS), exist_ok=True)
    seen = {}
    if os.path.exists(DRILLS):
        with open(DRILLS, encoding="utf-8") as f:
            seen = json.load(f)
    seen[drill] = round(seconds, 1)
    with open(DRILLS, "w", encoding="utf-8") as f:
        json.dump(seen, f, indent=1)
    print("drill: %s: %.1f s" % (drill, seconds))


def _incidents(host):
    r = host.run("ls %s/incidents" % LIVE_DIR)
    return r.stdout.split() if r.rc == 0 else []


class Answered:
    """Completions sent to the head every 3 s in the background; when the answered ones were sent
    (time.monotonic())."""

    def __init__(self, host):
        self.host, self.answered, self.tries = host, [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            self.tries += 1
            sent = time.monotonic()
            if _answers(self.host, max_time=5):
                self.answered.append(sent)
            self.stop.wait(3)

    def end(self):
        self.stop.set()
        self.thread.join(timeout=60)
        return self.answered


def test_a_stalled_worker_is_found_by_the_heads_liveness_and_the_pair_serves_again(host):
    """The worker's vLLM process stopped (SIGSTOP; its Ray node stays alive, the head's /health stays
    200): the head's liveness finds no progress and restarts the head's server, Ray ends the stalled
    actor with the job, and the pair serves again with no manual step (SPEC §11)."""
    if _name(host) != HEAD:
        pytest.skip("driven from the head")
    assert _answers(host)
    before = _incidents(host)
    r = subprocess.run(["docker", "exec", WORKER + "-ray", "sh", "-c", WORKER_ACTOR_STOP],
                       capture_output=True, text=True, timeout=60, check=False)
    stopped = r.stdout.split()
    assert stopped, (r.stdout, r.stderr)
    stalled_at = time.monotonic()
    try:
        assert _healthy(host)                       # what no /health check can see
        assert not _answers(host, max_time=4)
        assert _wait(lambda: _answers(host), 900, step_s=5)
        _record("stalled worker: from the stall to a served completion", time.monotonic() - stalled_at)
        new = sorted(set(_incidents(host)) - set(before))
        assert len(new) == 1, new
        # the stalled actor went with the job: nothing of it is left stopped on the worker
        left = subprocess.run(["docker", "exec", WORKER + "-ray", "sh", "-c",
                               " ".join("test -d /proc/%s && echo %s;" % (p, p) for p in stopped)],
                              capture_output=True, text=True, timeout=60, check=False).stdout.split()
        assert not left, "stopped actors still there: %s" % left
    finally:
        subprocess.run(["docker", "exec", WORKER + "-ray", "sh", "-c", "kill -CONT %s 2>/dev/null; true" % " ".join(stopped)],
                       check=False, timeout=60)
    assert _nodes(host)[0] == 0


def test_a_ray_crash_on_the_head_brings_its_server_back(host):
    """The head's Ray container killed while the pair serves: the server (in Ray's PID namespace) ends
    with it, the Ray unit restarts and restarts the server (Requires=), the worker's Ray rejoins the new
    head, and the pair serves again with no manual step. With BindsTo= the server stayed stopped."""
    if _name(host) != HEAD:
        pytest.skip("driven from the head")
    assert _answers(host)
    restarts = int(host.check_output("systemctl show -p NRestarts --value sparkops-ray"))
    subprocess.run(["docker", "kill", HEAD + "-ray"], check=True, timeout=60, capture_output=True)
    crashed_at = time.monotonic()
    assert _wait(lambda: not _healthy(host), 120, step_s=1)
    assert _wait(lambda: _answers(host), 900, step_s=5), host.check_output("journalctl -u %s -n 40 --no-pager" % SVC)
    _record("head's Ray crash: from the kill to a served completion", time.monotonic() - crashed_at)
    assert int(host.check_output("systemctl show -p NRestarts --value sparkops-ray")) == restarts + 1
    # the server answers a little before its unit turns active: READY=1 follows the helper's own first
    # probe generation (seen "activating" right after a completion on a busy machine)
    assert _wait(lambda: _prop(host, "ActiveState") == "active", 120, step_s=1), _prop(host, "ActiveState")
    assert _nodes(host)[0] == 0


# The drill's bounds, far below the unit's own (TimeoutStartSec 120 + 300 + ...): a runtime drop-in,
# removed afterwards. Before, each start's wait failed at its bound and counted: the worker away for
# longer than two such starts left the head failed for good (start limit, serve_max_failed_starts).
DRILL_DROPIN = "/run/systemd/system/%s.d/50-drill-worker-away.conf" % SVC
DRILL_BOUNDS = "[Unit]\nStartLimitIntervalSec=3600\nStartLimitBurst=2\n[Service]\nTimeoutStartSec=60\n"
AWAY_S = 150            # more than two TimeoutStartSec of the drop-in, more than its start limit allows


def test_worker_loss_stops_the_head_converge_names_it_and_rejoin_serves(host):
    """The worker's Ray stopped for longer than every start bound: the head answers no completion
    meanwhile, waits in one start (no restart, no failed start), a converge names the missing worker,
    and the worker's return brings serving back with no manual step."""
    if _name(host) != HEAD:
        pytest.skip("driven from the head")
    worker = host.get_host("docker://" + WORKER)
    host.run("mkdir -p %s && printf '%s' > %s && systemctl daemon-reload"
             % (os.path.dirname(DRILL_DROPIN), DRILL_BOUNDS.replace("\n", "\\n"), DRILL_DROPIN))
    try:
        worker.run("systemctl stop sparkops-ray")
        away_at = time.monotonic()
        # vLLM's Ray executor ends the server when its worker's actor dies.
        assert _wait(lambda: not _healthy(host), 300)
        answered = Answered(host)
        assert _wait(lambda: "waiting for the pair's worker" in _prop(host, "StatusText"), 180, step_s=2), _prop(host, "StatusText")
        waiting_restarts = _prop(host, "NRestarts")
        r = _converge("--limit", HEAD, "-e", "cluster_join_timeout_s=20")
        out = " ".join((r.stdout + r.stderr).split())
        assert r.returncode != 0
        assert "the worker %s (%s) has not joined the head %s" % (WORKER, IPS[WORKER], ADDRESS) in out
        while time.monotonic() - away_at < AWAY_S:
            time.sleep(5)
        # still the one start, waiting; nothing failed, nothing counted
        # still waiting, nothing failed, nothing counted. A systemd reload (the converge above) drops the
        # extended deadline, so the wait may have timed out and begun again: not a failed start.
        story = host.run("journalctl --no-pager -n 120 -u %s -u sparkops-ray" % SVC).stdout
        assert _prop(host, "ActiveState") == "activating", story
        assert host.run("cat /run/sparkops/serve/%s.failed-starts" % SVC).stdout.strip() in ("", "0"), story
        print("worker away: %s automatic restarts of the waiting head while the worker was away"
              % (int(_prop(host, "NRestarts")) - int(waiting_restarts)))
        back_at = time.monotonic()
        worker.run("systemctl start sparkops-ray")
        assert _wait(lambda: _healthy(host), 900, step_s=5)
        sent = answered.end()
        # nothing sent while the worker was away was answered
        assert answered.tries > AWAY_S // 10
        assert not [t for t in sent if t < back_at], "answered on half a pair: %s" % [round(t - away_at) for t in sent]
        _record("worker away %d s: from its return to /health" % AWAY_S, time.monotonic() - back_at)
        assert host.run("cat /run/sparkops/serve/%s.failed-starts" % SVC).stdout.strip() in ("", "0")
        _complete(host)
        assert _complete(host, "The spark")["usage"]["completion_tokens"] > 0
    finally:
        host.run("rm -f %s && systemctl daemon-reload" % DRILL_DROPIN)


ROLLOUT = os.path.join(PROJECT, "playbooks", "rollout.yml")
SERVE_UNIT = "/etc/systemd/system/sparkops-serve.service"


def _rollout_inventory():
    """Molecule's inventory plus the scenario's group_vars/all (the lab overrides): group_vars are read
    next to the inventory or the playbook, and playbooks/rollout.yml is not next to the scenario's."""
    source = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"])
    target = tempfile.mkdtemp(prefix="sparkops-cluster-rollout-")
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    os.makedirs(os.path.join(target, "group_vars"), exist_ok=True)
    os.symlink(os.path.join(os.path.dirname(HERE), "group_vars", "all"), os.path.join(target, "group_vars", "all"))
    return target


def _images():
    """The image each Ray container and the head's server run, as the lab's engine reports them."""
    out = {}
    for name in (HEAD + "-ray", WORKER + "-ray", HEAD + "-vllm"):
        r = subprocess.run(["docker", "inspect", "--format", "{{.Config.Image}}", name], capture_output=True, text=True, check=False)
        out[name] = r.stdout.strip() if r.returncode == 0 else None
    return out


def _worker_servers():
    """Anything that is a vLLM server of the worker's: its serve unit file, a container named for it,
    a `vllm serve` process in its Ray container."""
    seen = []
    if subprocess.run(["docker", "exec", WORKER, "test", "-e", SERVE_UNIT], check=False).returncode == 0:
        seen.append("unit file")
    names = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=False).stdout.split()
    seen += [n for n in names if n == WORKER + "-vllm"]
    r = subprocess.run(["docker", "exec", WORKER + "-ray", "sh", "-c", "ps -eo args | grep -c '[v]llm serve' || true"],
                       capture_output=True, text=True, check=False)
    procs = r.stdout.strip()
    # a Ray container the rollout stops between `docker ps` and this exec answers with Docker's error, not a count
    if r.returncode == 0 and procs.isdigit() and procs != "0":
        seen.append("%s vllm serve processes" % procs)
    return seen


def _roll(name, extra):
    """rollout.yml on the pair while the worker is watched for a server every 2 s; the run's output is kept."""
    env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.extend(_worker_servers())
            stop.wait(2)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = subprocess.run(["ansible-playbook", "-i", _rollout_inventory(), ROLLOUT, "-e", json.dumps(extra)],
                           capture_output=True, text=True, env=env, cwd=PROJECT, timeout=2400, check=False)
    finally:
        stop.set()
        watcher.join(timeout=60)
    evidence = os.path.join(PROJECT, "tests", "output", "molecule-cluster")
    os.makedirs(evidence, exist_ok=True)
    with open(os.path.join(evidence, name + "-rollout.log"), "w", encoding="utf-8") as f:
        f.write(r.stdout + r.stderr)
    return r, seen


def test_a_pair_rolls_out_as_one_unit_and_a_failed_gate_rolls_both_back(host):
    """rollout.yml on the pair (one batch of two): a new image moves both Ray nodes and the head's server
    together, the worker never runs a server of its own (before, the rollout gave it a single-node
    `vllm serve` of the whole model and left both Ray nodes on the old image), and the pair serves TP=2
    again. Then a rollout whose head fails its start (a tokenizer that is not there, which the parser
    accepts) rolls both nodes back to that image together, and the pair serves again."""
    if _name(host) != HEAD:
        pytest.skip("driven from the head")
    before = _images()
    assert len(set(before.values())) == 1 and None not in before.values(), before
    r, seen = _roll("pair-good", {"runtime_image_env": {"SPARKOPS_LAB_ROLLOUT": "pair-good"}})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert not seen, seen
    good = _images()
    assert len(set(good.values())) == 1 and set(good.values()) != set(before.values()), good
    assert _nodes(host)[0] == 0
    assert _complete(host)["usage"]["completion_tokens"] > 0

    bad_args = ["--enforce-eager", "--tokenizer", "/nonexistent/tokenizer"]
    r, seen = _roll("pair-bad", {"runtime_image_env": {"SPARKOPS_LAB_ROLLOUT": "pair-bad"},
                                 "serve_extra_args": "{{ %s if cluster_role == 'head' else ['--enforce-eager'] }}" % json.dumps(bad_args)})
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0, out[-6000:]
    assert "rollout stopped at %s" % HEAD in out and "rollout stopped at pair pair-a" in out, out[-6000:]
    assert not seen, seen
    assert _images() == good
    assert _nodes(host)[0] == 0
    assert _wait(lambda: host.run("curl -fsS --max-time 5 %s/health" % BASE).rc == 0, 600, step_s=5)
    assert _complete(host)["usage"]["completion_tokens"] > 0
