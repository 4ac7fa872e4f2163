# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint role's Hugging Face source, end to end on the local host against a STAND-IN of
the Hub's HTTP API (hub_standin.py; the Hub is not reachable here) and a stand-in huggingface_hub:

- a good snapshot is accepted, its manifest holding the Hub's own sha256 of each LFS file;
- one corrupted byte in an LFS file (and one extra byte in a file kept in git) is caught against
  the Hub's sha256 (and size) and nothing is accepted into the manifest;
- the token never appears in any process's command line or environment while the role runs
  (every /proc/PID/cmdline and /proc/PID/environ sampled in a loop: what `ps -eo args` and
  `ps e` read), nor in the play's output or Ansible's files on the host, and its file is gone
  afterwards, also when the run fails.
"""
import contextlib
import glob
import hashlib
import json
import os
import secrets
import sys
import threading

import pytest

from ansible_json import stdout_json
from harness import ansible_env, batch_inventory, host_failure, run_playbook
from hub_standin import REPO, REVISION, Hub, make_standin_venv

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reads every process's /proc/PID/environ and writes /run: needs root")


class ProcSampler(threading.Thread):
    """Reads every process's cmdline and environ over and over until stopped, recording any that
    holds one of the needles (per needle); also records which download helpers were ever seen
    running (by the endpoint on their command line: each case has its own stand-in Hub)."""

    def __init__(self, needles, endpoints):
        super().__init__(daemon=True)
        self.needles = {n: n.encode() for n in needles}
        self.endpoints = {e: e.encode() for e in endpoints}
        self.hits = {n: [] for n in needles}
        self.samples, self.saw_helper = 0, set()
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            for proc in glob.glob("/proc/[0-9]*"):
                try:
                    with open(proc + "/cmdline", "rb") as f:
                        cmdline = f.read()
                    with open(proc + "/environ", "rb") as f:
                        environ = f.read()
                except OSError:
                    continue
                if b"sparkops-hf-fetch\0download" in cmdline:
                    self.saw_helper.update(e for e, raw in self.endpoints.items() if raw in cmdline)
                for needle, raw in self.needles.items():
                    if raw in cmdline or raw in environ:
                        self.hits[needle].append(cmdline.replace(b"\0", b" ")[:300])
            self.samples += 1


def token_files(tokens):
    """The /run/sparkops-hf-token.* files, less those that hold a token other than these: another run
    of the role on this machine (a second test suite beside this one) has files of its own there."""
    found = set()
    for path in glob.glob("/run/sparkops-hf-token.*"):
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        if data and not any(token.encode() in data for token in tokens):
            continue
        found.add(path)
    return found


def ansible_files_holding(token):
    found = []
    for base in (os.path.expanduser("~/.ansible_async"), os.path.expanduser("~/.ansible/tmp")):
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                try:
                    with open(os.path.join(dirpath, name), "rb") as f:
                        if token.encode() in f.read():
                            found.append(os.path.join(dirpath, name))
                except OSError:
                    pass
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "venv"
    make_standin_venv(path, sys.executable)
    return path


def host_vars(tmp_path, venv, hub, token):
    return {
        "checkpoint_source": "huggingface", "checkpoint_hf_repo": REPO, "checkpoint_revision": REVISION,
        "checkpoint_hf_token": token, "checkpoint_hf_endpoint": hub.url, "checkpoint_hf_venv": str(venv),
        "checkpoint_allow_http": True,  # the stand-in Hub is local, without TLS
        "checkpoint_hf_packages": [], "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_progress_file": str(tmp_path / "progress.json"),
        "checkpoint_ple_pack_gib": 0, "checkpoint_min_free_margin_gib": 0, "checkpoint_progress_interval_s": 1,
        "checkpoint_fetch_timeout_s": 120}


def corrupt(hub):
    """One bit of one byte of an LFS file (same size), and one byte more of a file kept in git."""
    good = hub.files["model.safetensors"][0]
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    hub.served["model.safetensors"] = bytes(bad)
    hub.served["config.json"] = hub.files["config.json"][0] + b" "  # a git-kept file: only its size is known
    return bytes(bad)


class Case(object):
    pass


@pytest.fixture(scope="module")
def converged(tmp_path_factory, venv):
    """Both cases (a good snapshot, a corrupted one) in ONE ansible-playbook start: each a host of a
    batch inventory (this machine, local connection) with its own stand-in Hub, token, checkpoint
    dir and progress file. The variables, the token among them, are in the inventory file (on no
    command line; the role's vars/ names none of them and the play sets none, so the host vars reach the role as
    the -e @file did). One sampler watches every process for either token all the while."""
    tmp = tmp_path_factory.mktemp("hub")
    cases = {}
    with contextlib.ExitStack() as stack:
        for host in ("good", "corrupted"):
            case = cases[host] = Case()
            case.token = "hf_UNITtok_" + secrets.token_hex(12)
            case.hub = stack.enter_context(Hub(case.token))
            case.hub.slow_s = 0.5
            case.tmp = tmp / host
            case.tmp.mkdir()
            case.ckpt = case.tmp / "ckpt"
        cases["corrupted"].bad = corrupt(cases["corrupted"].hub)
        inventory = batch_inventory(tmp, {h: host_vars(c.tmp, venv, c.hub, c.token) for h, c in cases.items()})
        (tmp / "pb.yml").write_text(json.dumps([{"hosts": "sparks", "gather_facts": False, "roles": ["sparkops.appliance.checkpoint"]}]))
        env = ansible_env()
        env.pop("HF_TOKEN", None)
        tokens = [c.token for c in cases.values()]
        before = token_files(tokens)
        sampler = ProcSampler([c.token for c in cases.values()], [c.hub.url for c in cases.values()])
        sampler.start()
        try:
            proc = run_playbook(tmp / "pb.yml", inventory=inventory, env=env, timeout=600, connection=None)
        finally:
            sampler.stop.set()
            sampler.join(30)
    doc = stdout_json(proc)
    left = token_files(tokens) - before
    for host, case in cases.items():
        case.proc, case.doc, case.sampler, case.left = proc, doc, sampler, left
        case.stats = doc["stats"][host]
        case.failure = host_failure(doc, host)
    return cases


def assert_token_never_showed(case):
    proc, sampler, left, hub, token = case.proc, case.sampler, case.left, case.hub, case.token
    assert sampler.samples > 10 and hub.url in sampler.saw_helper, "the sampler must have watched the download run"
    assert sampler.hits[token] == [], "the token was in a process's command line or environment: %r" % sampler.hits[token][:3]
    assert token not in proc.stdout + proc.stderr
    assert left == set(), "the token file was left behind"
    assert ansible_files_holding(token) == []
    # ...and yet the token did reach the Hub, on the tree listing and on every download
    assert hub.auth_seen and all(auth == "Bearer " + token for _path, auth in hub.auth_seen)
    assert any(path.startswith("/%s/resolve/" % REPO) for path, _auth in hub.auth_seen)


def test_a_good_snapshot_is_accepted_with_the_hubs_own_sha256(converged):
    case = converged["good"]
    hub, ckpt = case.hub, case.ckpt
    # the host's own run succeeded (what returncode 0 said when it ran alone)
    assert case.failure is None and case.stats["failures"] == 0 and case.stats["unreachable"] == 0, (
        case.failure, case.proc.stdout[-4000:] + case.proc.stderr[-2000:])
    manifest = json.loads((ckpt / ".sparkops-manifest.json").read_text())
    assert manifest["revision"] == REVISION
    assert {e["path"]: e["sha256"] for e in manifest["files"]} == {
        p: hashlib.sha256(data).hexdigest() for p, (data, _lfs) in hub.files.items()}
    assert manifest["files"][[e["path"] for e in manifest["files"]].index("model.safetensors")]["sha256"] == hub.sha256("model.safetensors")
    assert_token_never_showed(case)


def test_a_corrupted_byte_is_caught_against_the_hubs_sha256_and_not_accepted(converged):
    case = converged["corrupted"]
    hub, ckpt, bad = case.hub, case.ckpt, case.bad
    # the host's own run failed (what a non-zero returncode said when it ran alone), and what it
    # said is read from this host's own failed result
    assert case.failure is not None and case.stats["failures"] != 0
    out = case.failure.get("msg", "")
    assert "model.safetensors: sha256 mismatch: expected %s, actual %s" % (
        hub.sha256("model.safetensors"), hashlib.sha256(bytes(bad)).hexdigest()) in out, out[-4000:]
    assert "config.json: size mismatch: expected %d bytes, actual %d" % (
        len(hub.files["config.json"][0]), len(hub.files["config.json"][0]) + 1) in out
    assert "Nothing was accepted into the manifest" in out
    assert not (ckpt / ".sparkops-manifest.json").exists()
    assert not (ckpt / ".sparkops-fingerprint.json").exists()
    assert (ckpt / "model.safetensors").read_bytes() == bytes(bad)  # it was downloaded, and refused
    assert_token_never_showed(case)
