# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/rollout.yml on three lab Sparks serving for real behind a real gateway (the gateway
role's HAProxy on a lab host of its own), with a prober sending every completion through the gateway
(none to a host) from three clients at once, and reading the gateway's own view of each server (its
stats) every 0.5 s, throughout (its log is kept under the scenario's evidence directory and
summarised: requests, failures, per-server counts, the longest request). rollout.yml drains each host
through the gateway's runtime API, and through the generic hook too (tasks/lb_hook.yml, a stand-in for
another balancer, whose log times each host's absence).

- a good rollout (a new image tag, batches [1, 2]) ends with every host on the new tag, never more
  hosts out of service at once than the current batch, and 0 failed client requests;
- a bad rollout (a new tag plus a tokenizer path the parser accepts but vLLM cannot load, on one host
  of a batch of two) halts after that batch; that host serves its previous tag again, healthy, back in
  the gateway; the other hosts untouched; 0 failed client requests.
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIO = os.path.dirname(HERE)
PROJECT = os.path.dirname(os.path.dirname(SCENARIO))
sys.path.insert(0, os.path.join(PROJECT, "tests", "support"))
from interrupt import run_and_kill_when  # noqa: E402 (tests/support is put on the path just above)
from lab_key import auth_header, gateway_key  # noqa: E402
ROLLOUT = os.path.join(PROJECT, "playbooks", "rollout.yml")
HOSTS = ["sparkops-molecule-rollout-%d" % n for n in (1, 2, 3)]
GATEWAY = "sparkops-molecule-rollout-gw"
GATEWAY_PORT, GATEWAY_STATS_PORT = 8080, 8404     # the gateway role's defaults
BACKEND = "model_tiny-llama"
CLIENTS = 3                                       # the prober's clients, each one request at a time
UNIT_FILE = "/etc/systemd/system/sparkops-serve.service"
STATE_FILE = "/var/lib/sparkops/runtime-image/state.json"
BASE_EXTRA = ["--enforce-eager", "--distributed-executor-backend", "uni"]   # the lab overrides' serve_extra_args
# Between one host's completions. Back to back, the three CPU vLLMs generated tokens without a pause
# (about 9 completions a second) and took the CPU the rollout itself needs on this 2-core machine; one
# a second per host still samples each host about 50 times during a restart.
COMPLETION_PAUSE_S = float(os.environ.get("SPARKOPS_PROBER_PAUSE_S", "1.0"))


def ephemeral(*parts):
    path = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/tmp/sparkops-molecule-rollout"), *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


# The prober's logs, the playbooks' output and verify's reports: kept after the scenario (Molecule
# prunes its ephemeral directory), under tests/output/ (git-ignored) unless SPARKOPS_EVIDENCE_DIR says.
EVIDENCE = os.environ.get("SPARKOPS_EVIDENCE_DIR") or os.path.join(PROJECT, "tests", "output", "molecule-rollout")


def evidence(*parts):
    path = os.path.join(EVIDENCE, *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def inventory():
    """Molecule's inventory (its hosts and its group_vars/ of the scenario's values) plus the
    scenario's group_vars/all (the lab overrides): Ansible reads group_vars next to the inventory
    or the playbook, and playbooks/*.yml are not next to the scenario's."""
    source = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"])
    target = os.path.dirname(ephemeral("lab-inventory", "x"))
    shutil.rmtree(target)
    shutil.copytree(source, target, symlinks=True)
    os.makedirs(os.path.join(target, "group_vars"), exist_ok=True)
    os.symlink(os.path.join(SCENARIO, "group_vars", "all"), os.path.join(target, "group_vars", "all"))
    return target


def docker(*args):
    return subprocess.run(["docker"] + list(args), capture_output=True, text=True, check=False)


def sh(host, command):
    return docker("exec", host, "sh", "-c", command)


def address(host):
    return docker("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", host).stdout.split()[0]


def unit_image(host):
    text = sh(host, "cat %s" % UNIT_FILE).stdout
    return next(w for w in text.replace("\\\n", " ").split() if w.startswith("sparkops/molecule-rollout-runtime:"))


def request(url, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=dict(auth_header(), **{"Content-Type": "application/json"}))
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (lab addresses)
        return resp.status, resp.read()


def gateway_status(timeout=5):
    """{server: status} of the tiny Llama's backend, as the gateway sees it (its stats page, CSV)."""
    url = "http://%s:%d/stats;csv" % (address(GATEWAY), GATEWAY_STATS_PORT)
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (lab address)
        rows = resp.read().decode().lstrip("# ").splitlines()
    header = rows[0].split(",")
    out = {}
    for line in rows[1:]:
        row = dict(zip(header, line.split(",")))
        if row.get("pxname") == BACKEND and row.get("svname") not in ("FRONTEND", "BACKEND"):
            out[row["svname"]] = row["status"]
    return out


def through_gateway(body, timeout=60):
    """A completion through the gateway with the gateway's client key: (status, body, the server that answered)."""
    req = urllib.request.Request("http://%s:%d/v1/completions" % (address(GATEWAY), GATEWAY_PORT), data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer %s" % gateway_key(), "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (lab address)
        return resp.status, resp.read(), resp.headers.get("X-Sparkops-Server", "")


class Prober:
    """Completions through the gateway from CLIENTS clients; the gateway's view of each server."""

    def __init__(self, lb_dir, log_path):
        self.lb_dir, self.log_path = lb_dir, log_path
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.records = []

    def lb(self, host):
        try:
            with open(os.path.join(self.lb_dir, host)) as handle:
                return handle.read().strip()
        except OSError:
            return "in"

    def log(self, record):
        with self.lock:
            self.records.append(record)
            with open(self.log_path, "a") as handle:
                handle.write(json.dumps(record) + "\n")

    def completions(self, client):
        while not self.stop.is_set():
            start, server = time.time(), ""
            try:
                status, body, server = through_gateway({"model": "tiny-llama", "prompt": "hello", "max_tokens": 4})
                ok = status == 200 and bool(json.loads(body)["choices"])
                error = ""
            except Exception as exc:   # a refused or dropped connection, an error answer: what is counted here
                ok, error = False, str(exc)[:200]
            self.log({"kind": "completion", "client": client, "host": server, "start": start, "end": time.time(), "ok": ok,
                      "error": error})
            self.stop.wait(COMPLETION_PAUSE_S)

    def health(self):
        while not self.stop.is_set():
            try:
                status = gateway_status()
            except Exception as exc:   # the gateway's own stats not answering is a finding too
                status = {"error": str(exc)[:200]}
            self.log({"kind": "health", "t": time.time(), "status": status,
                      "down": [h for h in HOSTS if status.get(h) != "UP"],
                      "out": [h for h in HOSTS if self.lb(h) == "out"]})
            time.sleep(0.5)

    def __enter__(self):
        self.threads = [threading.Thread(target=self.completions, args=(n,), daemon=True) for n in range(CLIENTS)]
        self.threads.append(threading.Thread(target=self.health, daemon=True))
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)

    def summary(self):
        comps = [r for r in self.records if r["kind"] == "completion"]
        health = [r for r in self.records if r["kind"] == "health"]
        return {
            "completions": len(comps),
            "failed": len([r for r in comps if not r["ok"]]),
            "errors": sorted(set(r["error"] for r in comps if not r["ok"]))[:5],
            "per_host": dict((h, len([r for r in comps if r["ok"] and r["host"] == h])) for h in HOSTS),
            "max_latency_s": round(max([r["end"] - r["start"] for r in comps] or [0]), 2),
            "gateway_samples": len(health),
            "max_down_at_once": max([len(r["down"]) for r in health] or [0]),
        }


def out_intervals(lb_dir):
    """host -> [(out time, in time or None)] from the stand-in balancer's events log."""
    spans = {}
    with open(os.path.join(lb_dir, "events.log")) as handle:
        for line in handle:
            stamp, host, action = line.split()
            if action == "out":
                spans.setdefault(host, []).append([float(stamp), None])
            elif spans.get(host):
                spans[host][-1][1] = float(stamp)
    return spans


def lb_extra(lb_dir, extra_vars):
    return dict(extra_vars, rollout_drain_hook=os.path.join(SCENARIO, "tasks", "lb_hook.yml"), rollout_lab_lb_dir=lb_dir)


def reset_lb(lb_dir):
    if os.path.exists(os.path.join(lb_dir, "events.log")):
        os.remove(os.path.join(lb_dir, "events.log"))
    for host in HOSTS:
        with open(os.path.join(lb_dir, host), "w") as handle:
            handle.write("in\n")


def lb_state(lb_dir, host):
    with open(os.path.join(lb_dir, host)) as handle:
        return handle.read().strip()


def rollout(lb_dir, name, extra_vars, limit=None, reset=True):
    if reset:
        reset_lb(lb_dir)
    extra = lb_extra(lb_dir, extra_vars)
    env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
    log_path = evidence(name + "-prober.jsonl")
    if os.path.exists(log_path):
        os.remove(log_path)
    start = time.monotonic()
    with Prober(lb_dir, log_path) as prober:
        time.sleep(5)   # requests flow before the rollout begins
        proc = subprocess.run(["ansible-playbook", "-i", inventory(), ROLLOUT, "-e", json.dumps(extra)]
                              + (["--limit", limit] if limit else []),
                              capture_output=True, text=True, env=env, cwd=PROJECT, timeout=1800, check=False)
        wall = time.monotonic() - start - 5
        time.sleep(5)
    with open(evidence(name + "-ansible.log"), "w") as handle:
        handle.write(proc.stdout + proc.stderr)
    summary = dict(prober.summary(), wall_s=round(wall, 1), rc=proc.returncode)
    print("%s rollout: %s" % (name, json.dumps(summary)))
    return proc, prober, summary


@pytest.fixture(scope="module", autouse=True)
def stop_servers_at_the_end():
    """The vLLM containers are siblings on the lab's Docker engine: stop them so that the scenario's
    destroy leaves no vLLM behind."""
    yield
    for host in HOSTS:
        sh(host, "systemctl stop sparkops-serve.service; systemctl reset-failed sparkops-serve.service")


@pytest.fixture(scope="module")
def lb_dir():
    path = evidence("lb", "x")
    return os.path.dirname(path)


@pytest.fixture(scope="module")
def tags():
    return {"before": dict((h, unit_image(h)) for h in HOSTS)}


def test_prometheus_scrapes_every_spark_its_server_and_the_gateway():
    """The monitoring role on the three and on the gateway's host (its monitors group): every node
    exporter, every server's /metrics and the gateway's exporter are targets, all up, read from
    Prometheus' HTTP API; no alert fires on the converged fleet."""
    base = "http://%s:9090/api/v1/" % address(GATEWAY)
    deadline, health = time.monotonic() + 180, {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base + "targets", timeout=10) as resp:  # noqa: S310 (lab address)
            targets = json.loads(resp.read())["data"]["activeTargets"]
        health = {(t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in targets}
        if len(health) == 7 and set(health.values()) == {"up"}:
            break
        time.sleep(5)
    assert health == dict([(("node", h), "up") for h in HOSTS] + [(("vllm", h), "up") for h in HOSTS]
                          + [(("gateway", GATEWAY), "up")]), health
    with urllib.request.urlopen(base + "alerts", timeout=10) as resp:  # noqa: S310 (lab address)
        firing = [a["labels"] for a in json.loads(resp.read())["data"]["alerts"] if a["state"] == "firing"]
    assert firing == [], firing


def test_a_good_rollout_moves_every_host_to_the_new_tag_batch_by_batch(lb_dir, tags):
    """rollout_serial [1, 2]: the canary alone, then the other two together (a batch of more than one
    host; the default [1, '25%'] cuts 3 hosts into 1+1+1, which the filter's unit tests cover)."""
    assert len(set(tags["before"].values())) == 1, tags
    proc, _prober, summary = rollout(lb_dir, "good", {"runtime_image_env": {"SPARKOPS_LAB_ROLLOUT": "good"},
                                                      "rollout_serial": [1, 2]})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    after = dict((h, unit_image(h)) for h in HOSTS)
    assert len(set(after.values())) == 1 and set(after.values()) != set(tags["before"].values()), after
    # every request through the gateway answered, and every server answered some
    assert summary["failed"] == 0, summary
    assert all(count > 0 for count in summary["per_host"].values()), summary
    assert gateway_status() == dict((h, "UP") for h in HOSTS)
    spans = out_intervals(lb_dir)
    assert sorted(spans) == sorted(HOSTS), spans
    for host in HOSTS:
        assert len(spans[host]) == 1 and spans[host][0][1] is not None, spans
        print("%s out of the balancer for %.1f s" % (host, spans[host][0][1] - spans[host][0][0]))
    # batch by batch: the canary (the first host out) is back in before the second batch goes out
    order = sorted(HOSTS, key=lambda h: spans[h][0][0])
    canary, second = order[0], order[1:]
    assert all(spans[canary][0][1] <= spans[h][0][0] for h in second), spans
    # never more hosts out of the gateway's rotation at once than the largest batch
    assert summary["max_down_at_once"] <= 2, summary


def test_a_failure_in_a_batch_of_two_puts_that_host_back_and_halts(lb_dir):
    """rollout_serial [2, 1]: the first batch is two hosts, and only the second of them gets a setting that
    fails its start (a tokenizer that is not there; vLLM's parser accepts the line). That host runs its
    whole rescue (previous image, unit and env, healthy, back in the balancer) while the batch's other host
    passes its gate on the new image and is back in the balancer too; the rollout stops after the batch,
    naming the host and the failed step, and the third host is never touched (with any_errors_fatal
    the rescue was listed but never ran: tests/unit/playbooks/test_rollout_batch_failure.py)."""
    first, failing, later = HOSTS
    previous = dict((h, unit_image(h)) for h in HOSTS)
    untouched = sh(later, "sha256sum %s %s; stat -c %%Y %s" % (UNIT_FILE, STATE_FILE, UNIT_FILE)).stdout
    bad_args = "{{ %s + (['--tokenizer', '/nonexistent/tokenizer'] if inventory_hostname == %r else []) }}" % (
        json.dumps(BASE_EXTRA), failing)
    proc, _prober, summary = rollout(lb_dir, "bad", {
        "runtime_image_env": {"SPARKOPS_LAB_ROLLOUT": "bad"}, "rollout_serial": [2, 1], "serve_extra_args": bad_args})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "rollout stopped at %s" % failing in out and "Wait for /health" in out, out[-4000:]
    assert "runs its previous image, unit and env again" in out and "is healthy" in out, out[-4000:]
    # the failed host: its previous image, unit and env, serving
    assert unit_image(failing) == previous[failing]
    assert json.loads(sh(failing, "cat %s" % STATE_FILE).stdout)["current"] == previous[failing]
    # the batch's other host: the new image, gated
    assert unit_image(first) != previous[first]
    for host in (first, failing):
        status, _body = request("http://%s:8000/health" % address(host), timeout=5)
        assert status == 200, host
        status, body = request("http://%s:8000/v1/completions" % address(host),
                               {"model": "tiny-llama", "prompt": "hello", "max_tokens": 4})
        assert status == 200 and json.loads(body)["choices"], host
    # both back in the balancer; the later batch untouched and never out
    spans = out_intervals(lb_dir)
    assert sorted(spans) == sorted([first, failing]), spans
    assert all(len(spans[h]) == 1 and spans[h][0][1] is not None for h in (first, failing)), spans
    for host in (first, failing):
        with open(os.path.join(lb_dir, host)) as handle:
            assert handle.read().strip() == "in", host
    assert sh(later, "sha256sum %s %s; stat -c %%Y %s" % (UNIT_FILE, STATE_FILE, UNIT_FILE)).stdout == untouched
    # every request through the gateway answered; both back in its rotation
    assert summary["failed"] == 0, summary
    assert gateway_status() == dict((h, "UP") for h in HOSTS)
    assert summary["max_down_at_once"] <= 2, summary


SITE = os.path.join(PROJECT, "playbooks", "site.yml")


def site(name, extra, *args):
    """playbooks/site.yml with extra vars (and more arguments); its output kept as evidence, and
    returned with the whitespace of each run of it as one space (the YAML result format folds a long
    message over lines)."""
    env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
    proc = subprocess.run(["ansible-playbook", "-i", inventory(), SITE, "-e", json.dumps(extra)] + list(args),
                          capture_output=True, text=True, env=env, cwd=PROJECT, timeout=1200, check=False)
    out = proc.stdout + proc.stderr
    with open(evidence(name + "-ansible.log"), "w") as handle:
        handle.write(out)
    return proc, " ".join(out.split())


def site_refusal(name, extra):
    """site() on the serving fleet; the images of the scenario's repository before and after, and each
    host's unit (digest and mtime) before and after."""
    def images():
        return docker("images", "-q", "--no-trunc", "sparkops/molecule-rollout-runtime").stdout.split()

    def units():
        return dict((h, sh(h, "sha256sum %s; stat -c %%Y %s" % (UNIT_FILE, UNIT_FILE)).stdout) for h in HOSTS)

    before = (images(), units())
    proc, out = site(name, extra)
    return proc, out, before, (images(), units())


def test_site_yml_that_would_restart_every_serving_host_stops_in_its_first_play_and_names_rollout():
    """site.yml (every phase) on the serving fleet, with a new runtime image recipe: its first play
    forecasts the restart of all three servers and stops before any phase runs: no image built, no
    unit written. Before, the refusal came in the serve play, after the image play had built the new
    image on every host (and, on a real fleet, after Docker and Ray had restarted)."""
    proc, out, before, after = site_refusal("site-refusal", {"runtime_image_env": {"SPARKOPS_LAB_ROLLOUT": "site"}})
    assert proc.returncode != 0, out[-4000:]
    assert "site.yml would restart the servers serving now on 3 hosts at once" in out and "playbooks/rollout.yml" in out, out[-4000:]
    for host in HOSTS:
        assert re.search(r"%s \(its unit or environment changes \(the runtime image "
                         r"sparkops/molecule-rollout-runtime:\w+ is built by this run\)\)" % re.escape(host), out), out[-4000:]
    assert "PLAY [Host tuning" not in out, out[-4000:]
    assert after == before


def test_site_yml_counts_each_hosts_own_reason_and_leaves_a_host_without_one_out():
    """One host with a new image, one with a changed vLLM setting (its stop grace), one with nothing
    (the image it serves, its settings): two servers would restart, for different reasons; the
    third is not named (the first run of this test named it: it served another tag than the default
    recipe's, which the forecast rightly counted)."""
    first, second, third = HOSTS
    # the image each host serves now (the rollouts above left them on different tags), but a new
    # recipe on the first: serve_image outranks the tag the runtime_image role would give
    serving = dict((h, unit_image(h)) for h in HOSTS)
    extra = {"runtime_image_env": "{{ {'SPARKOPS_LAB_ROLLOUT': 'site'} if inventory_hostname == '%s' else {} }}" % first,
             "serve_image": "{{ %s[inventory_hostname] if inventory_hostname != '%s' else spark_runtime_image }}"
                            % (json.dumps(serving), first),
             "serve_stop_grace_s": "{{ 11 if inventory_hostname == '%s' else 10 }}" % second}
    proc, out, before, after = site_refusal("site-refusal-mixed", extra)
    assert proc.returncode != 0, out[-4000:]
    assert "site.yml would restart the servers serving now on 2 hosts at once" in out, out[-4000:]
    assert re.search(r"%s \(its unit or environment changes \(the runtime image [^)]* is built by this run\)\)"
                     % re.escape(first), out), out[-4000:]
    assert "%s (its unit or environment changes)" % second in out, out[-4000:]
    # the refusal's list of servers (elsewhere in the output every host is named, "ok: [host] (...)")
    named = re.search(r"hosts at once: (.*?)\. The fleet would stop serving", out).group(1)
    assert third not in named, named
    assert after == before


ROLLOUT_STATE = "/etc/sparkops/sparkops-serve.rollout.json"


def invocation(host):
    return sh(host, "systemctl show -p InvocationID --value sparkops-serve.service").stdout.strip()


GOOD_RECORD = "/etc/sparkops/sparkops-serve.good.json"


def test_a_rollout_interrupted_after_the_unit_write_ends_served_and_back_in_rotation(lb_dir):
    """A rollout of one host killed (its whole process group, as a lost controller or a Ctrl-C would
    leave it) the moment the new unit is on the host: the host is out of the balancer, marked drained,
    its unit new and never gated. The next run, with the same change (so nothing is left to write),
    finds the drain state, restarts the server, gates it and puts it back in the balancer; the new
    configuration is then the last good one. Before the drain state, that run saw no pending change:
    no drain, no restart, no gate, and the host stayed out of the balancer."""
    host = HOSTS[0]
    reset_lb(lb_dir)
    extra = lb_extra(lb_dir, {"runtime_image_env": {"SPARKOPS_LAB_ROLLOUT": "interrupted"}})
    env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
    unit_before = sh(host, "sha256sum %s" % UNIT_FILE).stdout
    image_before = unit_image(host)
    killed, returncode, first_out = run_and_kill_when(
        ["ansible-playbook", "-i", inventory(), ROLLOUT, "--limit", host, "-e", json.dumps(extra)],
        evidence("interrupted-first-ansible.log"),
        lambda: sh(host, "sha256sum %s" % UNIT_FILE).stdout != unit_before, env=env, cwd=PROJECT)
    assert killed, "the first run ended (rc %s) before its unit write: %s" % (returncode, first_out[-3000:])
    new_image = unit_image(host)
    assert new_image != image_before
    state = json.loads(sh(host, "cat %s" % ROLLOUT_STATE).stdout)
    assert state["drained"] is True, state
    assert lb_state(lb_dir, host) == "out"
    assert gateway_status()[host].startswith("DRAIN")     # the gateway's drain too (HAProxy says "DRAIN (agent)")
    invocation_after_kill = invocation(host)
    good_before = json.loads(sh(host, "cat %s" % GOOD_RECORD).stdout)
    assert good_before["image"] == image_before, good_before

    proc, _prober, summary = rollout(lb_dir, "interrupted-again", extra, limit=host, reset=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "restarts: an earlier rollout left this host drained" in out, out[-4000:]
    assert unit_image(host) == new_image
    assert lb_state(lb_dir, host) == "in"
    state = json.loads(sh(host, "cat %s" % ROLLOUT_STATE).stdout)
    assert state["drained"] is False and state["result"] == "gated", state
    assert json.loads(sh(host, "cat %s" % GOOD_RECORD).stdout)["image"] == new_image
    status, body = request("http://%s:8000/v1/completions" % address(host),
                           {"model": "tiny-llama", "prompt": "hello", "max_tokens": 4})
    assert status == 200 and json.loads(body)["choices"], host
    # the server that answers was started by the second run (systemd's id of the unit's current start)
    assert invocation(host) != invocation_after_kill
    assert summary["failed"] == 0, summary
    assert gateway_status()[host] == "UP"


VERIFY = os.path.join(PROJECT, "playbooks", "verify.yml")
# The lab's target shape: the tiny model's 1024-token context, small rounds (docs/verify.md). The lab
# Spark's /proc/meminfo is the whole shared machine's: 0.77 GiB of growth over 4 rounds was measured
# with no leak while other jobs started, hence a 1.5 GiB band here and a 1 GiB-per-round stand-in leak.
VERIFY_LAB = {"verify_prompt_tokens": 64, "verify_max_tokens": 16, "verify_requests": 4, "verify_concurrency": 2,
              "verify_rounds": 4, "verify_round_requests": 4, "verify_settle_s": 3, "verify_band_gib": 1.5}


def run_verify(name, extra):
    report_dir = os.path.dirname(evidence("verify-" + name, "x"))
    env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
    start = time.monotonic()
    proc = subprocess.run(["ansible-playbook", "-i", inventory(), VERIFY, "--limit", HOSTS[0],
                           "-e", json.dumps(dict(VERIFY_LAB, verify_report_dir=report_dir, **extra))],
                          capture_output=True, text=True, env=env, cwd=PROJECT, timeout=1200, check=False)
    with open(os.path.join(report_dir, "ansible.log"), "w") as handle:
        handle.write(proc.stdout + proc.stderr)
    print("verify %s: rc %s in %.0f s" % (name, proc.returncode, time.monotonic() - start))
    return proc, report_dir


def test_verify_reports_real_latency_and_memory_figures():
    proc, report_dir = run_verify("good", {})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    with open(os.path.join(report_dir, HOSTS[0] + ".json")) as handle:
        report = json.load(handle)
    load = report["load"]
    shown = {k: load["concurrency"][k] for k in ("ttft", "tpot", "inter_token", "e2e", "requests", "failed")}
    print(json.dumps({"target_length": load["target_length"], "concurrency": shown, "band": load["band"]}, indent=1))
    for phase in ("target_length", "concurrency"):
        assert load[phase]["failed"] == 0 and load[phase]["requests"] > 0
        # TPOT is per request ((e2e - TTFT) / (tokens - 1)): it holds under load. The inter-token gaps are
        # what this client read: events that arrive in one read (a busy machine) give gaps of 0.
        for key in ("ttft", "tpot", "e2e"):
            assert load[phase][key]["n"] > 0 and 0 < load[phase][key]["p50_ms"] <= load[phase][key]["p99_ms"]
        assert load[phase]["inter_token"]["n"] > 0 and 0 <= load[phase]["inter_token"]["p50_ms"] <= load[phase]["inter_token"]["p99_ms"]
        assert load[phase]["tpot"]["n"] == load[phase]["requests"] - load[phase]["failed"]
    assert load["concurrency"]["prefill"]["requests"] > 0 and load["concurrency"]["decode"]["requests"] > 0
    assert len(load["rounds"]) == VERIFY_LAB["verify_rounds"] and load["band"]["ok"]
    assert all(r["meminfo_gib"]["MemAvailable"] > 0 and r["meminfo_gib"]["AnonPages"] > 0 for r in load["rounds"])
    assert report["startup"]["now"]["kv_cache_gib"] > 0 and report["startup"]["kv_plan_gib"] > 0
    with open(os.path.join(report_dir, HOSTS[0] + "-memory.png"), "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "latency (ms)" in out and "within the band" in out


def test_verify_band_check_fails_on_a_leaking_stand_in():
    proc, report_dir = run_verify("leak", {"verify_leak_standin_mib": 1024})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "is not fit for long-running service" in out and "used memory grew" in out, out[-4000:]
    with open(os.path.join(report_dir, HOSTS[0] + ".json")) as handle:
        band = json.load(handle)["load"]["band"]
    print("leak stand-in band: %s" % json.dumps(band))
    assert not band["ok"] and band["growth_gib"] > VERIFY_LAB["verify_band_gib"]


CHECKPOINT_DIR = "/srv/sparkops/models/tiny-llama"   # serve_model_path = checkpoint_dir (spark_model_name)
RELEASES = "/srv/lab-releases"
RELEASE_PORT = 8089
R2_GROWTH = 4 << 20
REPORT = "/var/lib/sparkops/serve/plan-vs-actual.json"


def completion_text(host):
    status, body = request("http://%s:8000/v1/completions" % address(host),
                           {"model": "tiny-llama", "prompt": "hello world", "max_tokens": 8, "temperature": 0})
    assert status == 200, body
    return json.loads(body)["choices"][0]["text"]


def digest(host, path):
    """sha256, inode and mtime of every file under path, one line each, sorted."""
    return sh(host, "cd %s && find . -type f -printf '%%i %%T@ ' -exec sha256sum {} \\; | sort -k3" % path).stdout


def ansible_module(host, module, args):
    env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
    proc = subprocess.run(["ansible", "-i", inventory(), host, "-m", module, "-a", json.dumps(args)],
                          capture_output=True, text=True, env=env, cwd=PROJECT, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def publish_releases(host):
    """Two releases of the tiny model on an HTTP server inside the lab Spark (the checkpoint role's
    Range-capable stand-in): r1, the bytes it serves; r2, the same but lm_head's rows in reverse
    order (valid weights, other tokens) and 4 MiB more (a file the memory plan counts with the
    weights), each with its publisher's manifest."""
    reverse = ("import json, struct; p = '%s/r2/model.safetensors'; f = open(p, 'r+b'); "
               "n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); a, b = h['lm_head.weight']['data_offsets']; "
               "rows, cols = h['lm_head.weight']['shape']; f.seek(8 + n + a); d = f.read(b - a); w = len(d) // rows; "
               "f.seek(8 + n + a); f.write(b''.join(d[i * w:(i + 1) * w] for i in reversed(range(rows)))); f.close()" % RELEASES)
    assert sh(host, "rm -rf %s && mkdir -p %s/r1 && cp -a %s/. %s/r1/ && rm -f %s/r1/.sparkops-* && cp -a %s/r1 %s/r2 && python3 -c \"%s\" "
              "&& head -c %d /dev/urandom > %s/r2/notes.bin"
              % (RELEASES, RELEASES, CHECKPOINT_DIR, RELEASES, RELEASES, RELEASES, RELEASES, reverse, R2_GROWTH, RELEASES)).returncode == 0
    for revision in ("r1", "r2"):
        ansible_module(host, "sparkops.appliance.checkpoint_verify",
                       {"path": "%s/%s" % (RELEASES, revision), "create": True, "revision": revision})
    src = os.path.join(PROJECT, "tests", "support", "range_http_server.py")
    assert docker("cp", src, "%s:/usr/local/bin/range_http_server.py" % host).returncode == 0
    sh(host, "systemctl stop lab-releases-http; systemctl reset-failed lab-releases-http")
    assert sh(host, "systemd-run --unit=lab-releases-http python3 /usr/local/bin/range_http_server.py --root %s "
                    "--bind 127.0.0.1 --port %d" % (RELEASES, RELEASE_PORT)).returncode == 0


def release_vars(revision):
    return {"checkpoint_source": "http", "checkpoint_allow_http": True,   # the stand-in inside the Spark has no TLS
            "checkpoint_url": "http://127.0.0.1:%d/%s" % (RELEASE_PORT, revision), "checkpoint_revision": revision}


def site_model_phase(host, name, extra):
    proc, out = site(name, extra, "--limit", host, "--tags", "model")
    assert proc.returncode == 0, out[-6000:]
    return out


def test_a_checkpoint_revision_is_staged_by_site_yml_and_served_only_after_the_rollout_switches_it(lb_dir):
    """A serving host's checkpoint pinned at r1, then r2 published. site.yml fetches and verifies r2
    beside the serving copy: checkpoint_dir is byte-, inode- and mtime-identical, and a restart of
    the server before the switch still loads r1 (the same tokens as before). rollout.yml then drains
    the host, switches r2 in, restarts onto it and gates it: other tokens, the served copy is r2, the
    old one is released, and the plan served is r2's (measured from the staged copy before the
    switch). Before staging, r2 was fetched over the serving copy in place."""
    host = HOSTS[0]
    publish_releases(host)
    # Earlier runs recorded the copy from the lab's path source at the example's pin: pinning r1 now
    # would stage r1 beside it (docs/checkpoint.md). A host pinned at r1 from its first fetch is the
    # case here: the record goes, the bytes stay (r1 refetches none).
    assert sh(host, "rm -f %s/.sparkops-manifest.json %s/.sparkops-fingerprint.json" % (CHECKPOINT_DIR, CHECKPOINT_DIR)).returncode == 0
    site_model_phase(host, "checkpoint-r1", release_vars("r1"))   # the bytes served, now pinned at r1
    assert json.loads(sh(host, "cat %s/.sparkops-manifest.json" % CHECKPOINT_DIR).stdout)["revision"] == "r1"
    before_text, before_files = completion_text(host), digest(host, CHECKPOINT_DIR)
    weights_r1 = json.loads(sh(host, "cat %s" % REPORT).stdout)["plan"]["inputs"]["weight_bytes"]

    out = site_model_phase(host, "checkpoint-r2-staged", release_vars("r2"))
    assert "Revision r2 staged beside %s, which serves revision r1 and was not changed" % CHECKPOINT_DIR in out, out[-4000:]
    assert digest(host, CHECKPOINT_DIR) == before_files
    assert json.loads(sh(host, "cat %s.staged/.sparkops-manifest.json" % CHECKPOINT_DIR).stdout)["revision"] == "r2"
    # a restart before the switch (a crash, the recycle, memwatch would do the same) loads r1 again
    invocation_before = invocation(host)
    assert sh(host, "systemctl restart sparkops-serve.service").returncode == 0
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            if request("http://%s:8000/health" % address(host), timeout=5)[0] == 200:
                break
        except OSError:
            pass
        time.sleep(2)
    assert invocation(host) != invocation_before
    assert completion_text(host) == before_text
    assert digest(host, CHECKPOINT_DIR) == before_files

    proc, _prober, summary = rollout(lb_dir, "checkpoint-r2", release_vars("r2"), limit=host)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert json.loads(sh(host, "cat %s/.sparkops-manifest.json" % CHECKPOINT_DIR).stdout)["revision"] == "r2"
    assert sh(host, "test -e %s.staged || test -e %s.previous" % (CHECKPOINT_DIR, CHECKPOINT_DIR)).returncode != 0
    assert completion_text(host) != before_text
    # the plan it serves was measured from r2 (the staged copy), not from the copy served before the switch
    assert json.loads(sh(host, "cat %s" % REPORT).stdout)["plan"]["inputs"]["weight_bytes"] >= weights_r1 + R2_GROWTH
    assert lb_state(lb_dir, host) == "in"
    assert summary["failed"] == 0, summary
    assert gateway_status()[host] == "UP"


ENGINE_STOP = ("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^VLLM::EngineCore' "
               "&& kill -STOP ${p#/proc/} && echo stopped ${p#/proc/}; done")


def gateway_row(host):
    """The gateway's stats row of one server (status, check_status, last_agt: the agent's last word)."""
    url = "http://%s:%d/stats;csv" % (address(GATEWAY), GATEWAY_STATS_PORT)
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (lab address)
        rows = resp.read().decode().lstrip("# ").splitlines()
    header = rows[0].split(",")
    for line in rows[1:]:
        row = dict(zip(header, next(csv.reader([line]))))
        if row.get("pxname") == BACKEND and row.get("svname") == host:
            return row
    raise AssertionError("no %s/%s on the gateway's stats page" % (BACKEND, host))


def out_of_rotation(row):
    """The row when the gateway does not route to that server (DOWN, DRAIN, MAINT), else None. "UP 2/3"
    is still in rotation: a check failed, fewer than fall in a row."""
    return row if not row["status"].startswith("UP") else None


def until(what, timeout, poll=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(poll)
    return what()


def test_a_server_killed_hard_or_stalled_leaves_the_gateway_and_comes_back(lb_dir):
    """Through the gateway, three clients: one server's vLLM container killed hard (docker kill), then
    the same server's engine stopped with SIGSTOP (its completions hanging). The gateway stops routing
    to the killed one within its check bound (inter 2 s x fall 3; the requests it had are sent again to
    another server) and to the stalled one within liveness's bound (its agent check says so, or /health
    stops answering first under this load); both times systemd starts it again and the
    gateway puts it back. The failed client requests are counted; at most those in flight when the server
    died (the gateway sends a request whose connection was refused or closed unanswered again)."""
    host = HOSTS[2]
    container = "sparkops-vllm-%s" % host
    reset_lb(lb_dir)
    log_path = evidence("gateway-drills-prober.jsonl")
    if os.path.exists(log_path):
        os.remove(log_path)
    measured = {}
    with Prober(lb_dir, log_path) as prober:
        time.sleep(5)
        assert gateway_status() == dict((h, "UP") for h in HOSTS)
        killed = time.monotonic()
        assert docker("kill", container).returncode == 0
        assert until(lambda: gateway_status()[host] != "UP", 60)
        measured["killed_out_s"] = round(time.monotonic() - killed, 1)
        assert until(lambda: gateway_status()[host] == "UP", 900, poll=2)
        measured["killed_back_s"] = round(time.monotonic() - killed, 1)
        time.sleep(5)
        r = docker("exec", container, "sh", "-c", ENGINE_STOP)
        assert "stopped" in r.stdout, (r.stdout, r.stderr)
        stalled = time.monotonic()
        row = until(lambda: out_of_rotation(gateway_row(host)), 300)
        measured["stalled_out_s"] = round(time.monotonic() - stalled, 1)
        measured["stalled_out_by"] = row["last_agt"]
        measured["stalled_out_status"] = row["status"]
        # Out by the agent's word (liveness's verdict: "DOWN (agent)") or by /health: under the prober's
        # load a stopped engine may stop the API server's /health too, and then the health checks can
        # come first; the unit test proves the agent alone takes a server with a good /health out.
        # Either way within liveness's bound (serve_liveness_stall_s 45 + probe 30) and a margin.
        assert measured["stalled_out_s"] <= 45 + 30 + 45, measured
        assert until(lambda: gateway_status()[host] == "UP", 900, poll=2)
        measured["stalled_back_s"] = round(time.monotonic() - stalled, 1)
        time.sleep(3)
    summary = dict(prober.summary(), **measured)
    print("gateway drills: %s" % json.dumps(summary))
    assert summary["failed"] <= CLIENTS, summary
    assert measured["killed_out_s"] <= 2 * 3 + 5, measured       # inter x fall, plus the stats poll and a busy machine


def test_zz_two_models_behind_the_one_url_and_batches_that_keep_each_model_served():
    """site.yml (its serve and gateway phases, the whole fleet) with the third Spark serving the same
    weights as another model, tiny-llama-b: only that server restarts, the gateway gets a backend for
    it, and through the one URL each model is answered by its own Sparks, /v1/models lists both, an
    unknown model gets the JSON 404. Then rollout.yml's first play with batches of two: it never puts
    tiny-llama's two servers in one batch, and names tiny-llama-b's lone server (docs/rollout.md#batches);
    and it refuses to move the third Spark back to tiny-llama (a change of the gateway's configuration:
    docs/gateway.md#another-model-on-a-server). Last: it leaves the third Spark on another model."""
    first, second, third = HOSTS
    serving = dict((h, unit_image(h)) for h in HOSTS)
    extra = {"serve_image": "{{ %s[inventory_hostname] }}" % json.dumps(serving),
             "serve_served_model_name": "{{ 'tiny-llama-b' if inventory_hostname == '%s' else 'tiny-llama' }}" % third}
    before = dict((h, invocation(h)) for h in HOSTS)
    proc, out = site("two-models", extra, "--tags", "serve,gateway")
    assert proc.returncode == 0, out[-6000:]
    assert [h for h in HOSTS if invocation(h) != before[h]] == [third]

    url = "http://%s:%d" % (address(GATEWAY), GATEWAY_PORT)
    key = {"Authorization": "Bearer %s" % gateway_key()}
    with urllib.request.urlopen(urllib.request.Request(url + "/v1/models", headers=key), timeout=10) as resp:  # noqa: S310
        assert sorted(m["id"] for m in json.loads(resp.read())["data"]) == ["tiny-llama", "tiny-llama-b"]
    answered = {"tiny-llama": set(), "tiny-llama-b": set()}
    for _n in range(8):
        for model, seen in answered.items():
            status, body, server = through_gateway({"model": model, "prompt": "hello", "max_tokens": 4})
            assert status == 200 and json.loads(body)["model"] == model, body
            seen.add(server)
    assert answered == {"tiny-llama": {first, second}, "tiny-llama-b": {third}}, answered
    try:
        through_gateway({"model": "tiny-llama-c", "prompt": "hello", "max_tokens": 4})
        raise AssertionError("an unknown model was answered")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404 and json.loads(exc.read())["error"]["type"] == "NotFoundError"

    def first_play(name, extra_vars):
        env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
        proc = subprocess.run(["ansible-playbook", "-i", inventory(), ROLLOUT, "--skip-tags", "rollout",
                               "-e", json.dumps(extra_vars)],
                              capture_output=True, text=True, env=env, cwd=PROJECT, timeout=900, check=False)
        with open(evidence(name + "-ansible.log"), "w") as handle:
            handle.write(proc.stdout + proc.stderr)
        return proc.returncode, " ".join((proc.stdout + proc.stderr).split())

    rc, text = first_play("two-models-batches", dict(extra, rollout_serial=[2]))
    assert rc == 0, text[-4000:]
    # batches of two without the models would be [first, second], [third]: tiny-llama with no server
    assert "msg: - %s - %s, %s " % (first, second, third) in text, text[-4000:]   # the batches, as listed
    assert "tiny-llama-b is served by %s alone" % third in text, text[-4000:]
    # a rollout does not move a server to another model's backend: refused before any change
    served = dict((h, invocation(h)) for h in HOSTS)
    rc, text = first_play("two-models-move-refused", dict(extra, serve_served_model_name="tiny-llama"))
    assert rc != 0, text[-4000:]
    assert ("%s: the gateway %s routes it as model_tiny-llama-b, and this run would serve it as tiny-llama "
            "(serve_served_model_name)" % (third, GATEWAY)) in text, text[-4000:]
    assert dict((h, invocation(h)) for h in HOSTS) == served
