# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Hugging Face revision bump is staged, not downloaded over the served copy: the checkpoint role
through Ansible on the local host against a STAND-IN Hub serving two revisions (the Hub is not
reachable here) and a stand-in huggingface_hub that keeps, replaces and writes files in a local_dir
as huggingface_hub does (an LFS file whose sha256 is the Hub's is kept; any other file is unlinked
first, then the download renamed in).

Revision 2 changes model.safetensors at the same size and config.json; extra/adapter.safetensors
is unchanged: only the two changed files are served, the adapter is hard-linked from the served
copy, and every byte, size, mtime and inode under checkpoint_dir stays as it was."""
import hashlib
import json
import os
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from harness import batch_inventory, host_results, play_json
from hub_standin import REPO, make_standin_venv
from support_checkpoint import snapshot

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402

REV1 = "1111111111111111111111111111111111111111"
REV2 = "2222222222222222222222222222222222222222"
HOST = "spark"


def revisions():
    weights = bytes((i * 7919) % 251 for i in range(96 * 1024))
    changed = bytes(b ^ 0x33 for b in weights)          # same size, other bytes
    adapter = weights[:4096]
    return {
        REV1: {"config.json": (b'{"v": 1}\n', False), "model.safetensors": (weights, True),
               "extra/adapter.safetensors": (adapter, True)},
        REV2: {"config.json": (b'{"v": 2, "x": 0}\n', False), "model.safetensors": (changed, True),
               "extra/adapter.safetensors": (adapter, True)},
    }


class TwoRevisionHub(object):
    """The Hub's tree API (one page) and resolve URLs for two revisions; records what it served."""

    def __init__(self, files):
        self.files, self.served = files, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                path = urllib.parse.urlsplit(self.path).path
                for rev, files in hub.files.items():
                    if path == "/api/models/%s/tree/%s" % (REPO, rev):
                        body = json.dumps([dict({"type": "file", "path": p, "size": len(d), "oid": "0" * 40},
                                                **({"lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d)}} if lfs else {}))
                                           for p, (d, lfs) in sorted(files.items())]).encode()
                        return self.reply(200, body)
                    prefix = "/%s/resolve/%s/" % (REPO, rev)
                    if path.startswith(prefix) and urllib.parse.unquote(path[len(prefix):]) in files:
                        rel = urllib.parse.unquote(path[len(prefix):])
                        hub.served.append((rev, rel))
                        return self.reply(200, files[rel][0])
                return self.reply(404, b"{}")

            def reply(self, code, body):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


# What huggingface_hub does with a local_dir (file_download._hf_hub_download_to_local_dir): an LFS file
# already there whose sha256 is the Hub's etag is kept; otherwise the outdated file is unlinked first
# and the download renamed into place (never written into an existing file).
LOCAL_DIR_HF_HUB = '''"""STAND-IN for huggingface_hub (tests only): snapshot_download into a local_dir."""
import hashlib, json, os, urllib.request

__version__ = "0.36.2"


def snapshot_download(repo_id, revision, local_dir, allow_patterns=None, token=None, endpoint=None):
    with urllib.request.urlopen("%s/api/models/%s/tree/%s?recursive=true" % (endpoint, repo_id, revision)) as r:
        entries = json.loads(r.read())
    for e in entries:
        dest = os.path.join(local_dir, e["path"])
        lfs = e.get("lfs")
        if lfs and os.path.isfile(dest):
            with open(dest, "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() == lfs["oid"]:
                    continue
        with urllib.request.urlopen("%s/%s/resolve/%s/%s" % (endpoint, repo_id, revision, e["path"])) as r:
            data = r.read()
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.lexists(dest):
            os.unlink(dest)
        with open(dest + ".incomplete", "wb") as f:
            f.write(data)
        os.replace(dest + ".incomplete", dest)
    return local_dir
'''


def play(name, revision):
    return {"name": name, "hosts": HOST, "gather_facts": False, "vars": {"checkpoint_revision": revision},
            "tasks": [{"name": "the role", "ansible.builtin.include_role": {"name": "sparkops.appliance.checkpoint"}}]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt-staged-hub")
    venv = tmp / "venv"
    make_standin_venv(venv, sys.executable)
    init = next(venv.glob("lib/python*/site-packages/huggingface_hub/__init__.py"))
    init.write_text(LOCAL_DIR_HF_HUB)
    hub = TwoRevisionHub(revisions())
    d = str(tmp / "models" / "m")
    inventory = batch_inventory(tmp, {HOST: {
        "checkpoint_source": "huggingface", "checkpoint_hf_repo": REPO, "checkpoint_hf_endpoint": hub.url,
        "checkpoint_allow_http": True,  # the stand-in Hub is local, without TLS
        "checkpoint_hf_venv": str(venv), "checkpoint_hf_packages": [], "checkpoint_dir": d,
        "checkpoint_progress_file": str(tmp / "progress.json"), "checkpoint_ple_pack_gib": 0,
        "checkpoint_min_free_margin_gib": 0, "checkpoint_progress_interval_s": 1, "checkpoint_fetch_timeout_s": 120}})
    w = {"d": d, "hub": hub}
    for name, revision in (("fresh", REV1), ("stage", REV2)):
        path = tmp / (name + ".yml")
        path.write_text(yaml.safe_dump([play(name, revision)]))
        before = snapshot(d) if os.path.isdir(d) else None
        start = len(hub.served)
        doc = play_json(path, inventory=inventory)
        w[name] = {"results": [(t.split(" : ", 1)[-1], r) for _p, t, r in host_results(doc, HOST)],
                   "failures": doc["stats"][HOST]["failures"], "served": hub.served[start:],
                   "before": before, "after": snapshot(d)}
    w["staged_intact"] = ck.intact(d + ".staged", REV2)
    w["served_intact"] = ck.intact(d, REV1)
    w["inodes"] = {rel: tuple(os.stat(os.path.join(p, rel)).st_ino if os.path.exists(os.path.join(p, rel)) else None
                              for p in (d, d + ".staged")) for rel in revisions()[REV1]}
    hub.server.shutdown()
    hub.server.server_close()
    return w


def failed_msgs(step):
    return [r.get("msg") for _t, r in step["results"] if r.get("failed")]


def test_the_first_revision_lands_in_checkpoint_dir(world):
    fresh = world["fresh"]
    assert fresh["failures"] == 0, failed_msgs(fresh)
    assert sorted(rel for _rev, rel in fresh["served"]) == sorted(revisions()[REV1])


def test_a_revision_bump_is_staged_beside_the_served_copy(world):
    stage = world["stage"]
    assert stage["failures"] == 0, failed_msgs(stage)
    assert stage["after"] == stage["before"]          # the served copy: bytes, sizes, mtimes, inodes
    assert world["served_intact"] and world["staged_intact"]
    # the same-size changed weights and the changed config came from the Hub; the adapter did not
    assert sorted(stage["served"]) == [(REV2, "config.json"), (REV2, "model.safetensors")]
    d_ino, s_ino = world["inodes"]["extra/adapter.safetensors"]
    assert d_ino == s_ino
    assert world["inodes"]["model.safetensors"][0] != world["inodes"]["model.safetensors"][1]
    facts = [r for t, r in stage["results"] if t == "Checkpoint | export the checkpoint's size for the memory plan"][0]["ansible_facts"]
    assert facts["spark_checkpoint_staged"] is True and facts["spark_checkpoint_staged_dir"] == world["d"] + ".staged"
    assert int(facts["spark_checkpoint_bytes"]) == sum(len(b) for b, _l in revisions()[REV2].values())
