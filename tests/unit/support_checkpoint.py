"""Shared fixtures of the checkpoint tests: a generated checkpoint and a real HTTP server."""
import hashlib
import os
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))

from range_http_server import make_server  # noqa: E402
from harness import host_results  # noqa: E402
from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402

# Deliberately uneven sizes, one in a subdirectory, one empty.
SHARDS = {
    "model-00001-of-00002.safetensors": 3 * 1024 * 1024 + 17,
    "model-00002-of-00002.safetensors": 2 * 1024 * 1024 + 5,
    "config.json": 321,
    "tokenizer/tokenizer.json": 70001,
    "empty.txt": 0,
}


def write_checkpoint(root, seed=1):
    import random
    rnd = random.Random(seed)
    for rel, size in SHARDS.items():
        p = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(rnd.randbytes(size))
    return root


@pytest.fixture
def src_dir(tmp_path):
    return write_checkpoint(str(tmp_path / "src"))


@pytest.fixture
def http_server(src_dir):
    server = make_server(src_dir)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    server.base = "http://127.0.0.1:%d" % server.server_address[1]
    yield server
    server.shutdown()
    server.server_close()


def flip_byte(path, offset):
    """Change one byte in place, keeping size and mtime (what a disk error would do)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def snapshot(root):
    """Every entry under root: bytes' sha256, size, mtime, inode (what 'untouched' means)."""
    out = {}
    for dirpath, dirnames, names in os.walk(root):
        for n in names + dirnames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            digest = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else None
            out[os.path.relpath(p, root)] = (digest, st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def publish(root, revision):
    """Write the manifest of the checkpoint in root, as revision (what a release publishes)."""
    m = ck.build_manifest(root, revision=revision)
    with open(os.path.join(root, ck.MANIFEST_NAME), "w") as f:
        f.write(ck.dump_manifest(m))
    return m


# --- the role's results, per play (the role tests run one play a step, each on one host) ----------

def steps_by_play(doc, *hosts):
    """{play name: [(task name without its role prefix, result)]} of the hosts in a JSON-callback document."""
    steps = {}
    for host in hosts:
        for play, task, result in host_results(doc, host):
            steps.setdefault(play, []).append((task.split(" : ", 1)[-1], result))
    return steps


def changed(steps):
    return [t for t, r in steps if r.get("changed")]


def failures(steps):
    return [(t, r.get("msg")) for t, r in steps if r.get("failed") and not r.get("ignored")]


def result_of(steps, name):
    found = [r for t, r in steps if t == name]
    assert found, "no task %r in %s" % (name, [t for t, _r in steps])
    return found[-1]


def revision_at(path):
    """The revision the manifest in path names (None: none named, or no manifest there)."""
    manifest = ck.read_manifest_at(path) if os.path.isdir(path) else None
    return manifest and manifest.get("revision")
