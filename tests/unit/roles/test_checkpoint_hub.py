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
import glob
import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading

import pytest
import yaml

from hub_standin import REPO, REVISION, Hub, make_standin_venv

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reads every process's /proc/PID/environ and writes /run: needs root")


class ProcSampler(threading.Thread):
    """Reads every process's cmdline and environ over and over until stopped, recording any that
    holds the needle; also records whether the download helper was ever seen running."""

    def __init__(self, needle):
        super().__init__(daemon=True)
        self.needle = needle.encode()
        self.hits, self.samples, self.saw_helper = [], 0, False
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
                self.saw_helper = self.saw_helper or b"sparkops-hf-fetch\0download" in cmdline
                if self.needle in cmdline or self.needle in environ:
                    self.hits.append(cmdline.replace(b"\0", b" ")[:300])
            self.samples += 1


def token_files():
    return set(glob.glob("/run/sparkops-hf-token.*"))


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


def converge(tmp_path, venv, hub, token):
    ckpt = tmp_path / "ckpt"
    variables = {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "checkpoint_source": "huggingface", "checkpoint_hf_repo": REPO, "checkpoint_revision": REVISION,
        "checkpoint_hf_token": token, "checkpoint_hf_endpoint": hub.url, "checkpoint_hf_venv": str(venv),
        "checkpoint_hf_packages": [], "checkpoint_dir": str(ckpt), "checkpoint_progress_file": str(tmp_path / "progress.json"),
        "checkpoint_ple_pack_gib": 0, "checkpoint_min_free_margin_gib": 0, "checkpoint_progress_interval_s": 1,
        "checkpoint_fetch_timeout_s": 120}
    (tmp_path / "vars.json").write_text(json.dumps(variables))  # on no command line either
    play = {"hosts": "localhost", "gather_facts": False, "roles": ["sparkops.appliance.checkpoint"]}
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([play]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env.pop("HF_TOKEN", None)
    before = token_files()
    sampler = ProcSampler(token)
    sampler.start()
    try:
        proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-e", "@" + str(tmp_path / "vars.json"), str(tmp_path / "pb.yml")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    finally:
        sampler.stop.set()
        sampler.join(30)
    return proc, ckpt, sampler, token_files() - before


def assert_token_never_showed(proc, sampler, left, hub, token):
    assert sampler.samples > 10 and sampler.saw_helper, "the sampler must have watched the download run"
    assert sampler.hits == [], "the token was in a process's command line or environment: %r" % sampler.hits[:3]
    assert token not in proc.stdout + proc.stderr
    assert left == set(), "the token file was left behind"
    assert ansible_files_holding(token) == []
    # ...and yet the token did reach the Hub, on the tree listing and on every download
    assert hub.auth_seen and all(auth == "Bearer " + token for _path, auth in hub.auth_seen)
    assert any(path.startswith("/%s/resolve/" % REPO) for path, _auth in hub.auth_seen)


def test_a_good_snapshot_is_accepted_with_the_hubs_own_sha256(tmp_path, venv):
    token = "hf_UNITtok_" + secrets.token_hex(12)
    with Hub(token) as hub:
        hub.slow_s = 0.5
        proc, ckpt, sampler, left = converge(tmp_path, venv, hub, token)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        manifest = json.loads((ckpt / ".sparkops-manifest.json").read_text())
        assert manifest["revision"] == REVISION
        assert {e["path"]: e["sha256"] for e in manifest["files"]} == {
            p: hashlib.sha256(data).hexdigest() for p, (data, _lfs) in hub.files.items()}
        assert manifest["files"][[e["path"] for e in manifest["files"]].index("model.safetensors")]["sha256"] == hub.sha256("model.safetensors")
        assert_token_never_showed(proc, sampler, left, hub, token)


def test_a_corrupted_byte_is_caught_against_the_hubs_sha256_and_not_accepted(tmp_path, venv):
    token = "hf_UNITtok_" + secrets.token_hex(12)
    with Hub(token) as hub:
        hub.slow_s = 0.5
        good = hub.files["model.safetensors"][0]
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0x01  # one bit of one byte, same size
        hub.served["model.safetensors"] = bytes(bad)
        hub.served["config.json"] = hub.files["config.json"][0] + b" "  # a git-kept file: only its size is known
        proc, ckpt, sampler, left = converge(tmp_path, venv, hub, token)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0
        assert "model.safetensors: sha256 mismatch: expected %s, actual %s" % (
            hub.sha256("model.safetensors"), hashlib.sha256(bytes(bad)).hexdigest()) in out, out[-4000:]
        assert "config.json: size mismatch: expected %d bytes, actual %d" % (
            len(hub.files["config.json"][0]), len(hub.files["config.json"][0]) + 1) in out
        assert "Nothing was accepted into the manifest" in out
        assert not (ckpt / ".sparkops-manifest.json").exists()
        assert not (ckpt / ".sparkops-fingerprint.json").exists()
        assert (ckpt / "model.safetensors").read_bytes() == bytes(bad)  # it was downloaded, and refused
        assert_token_never_showed(proc, sampler, left, hub, token)
