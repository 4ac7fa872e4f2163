# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Staged checkpoint updates, module by module (in this process, harness.run_module):

- checkpoint_fetch keeps a file only when it is known to hold the manifest's sha256, never for its
  size alone: a new release whose changed file kept its size is fetched (a real Range-capable HTTP
  server on 127.0.0.1 counts the bytes it served);
- with reuse_from it hard-links, into a staging directory, the served copy's files whose sha256 in
  the old manifest equals the new one's (and only those), writing nothing under the served copy;
- state=prepare readies a directory for huggingface_hub or rsync the same way;
- checkpoint_switch: switched, switched_back, released, each idempotent and check-mode aware, and a
  switch cut between its two renames finished (or undone) by the next run.
"""
import json
import os
import shutil
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from support_checkpoint import SHARDS, publish, snapshot, write_checkpoint  # noqa: E402
from range_http_server import make_server  # noqa: E402  (support_checkpoint put it on sys.path)

from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402
from ansible_collections.sparkops.appliance.plugins.modules import checkpoint_fetch, checkpoint_switch, checkpoint_verify  # noqa: E402
from harness import run_module  # noqa: E402

SAME_SIZE = "model-00001-of-00002.safetensors"   # changes, keeps its size
GROWS = "config.json"                             # changes and grows
KEPT = ("model-00002-of-00002.safetensors", "tokenizer/tokenizer.json", "empty.txt")


def ok(mod, args, check=False):
    r = run_module(mod, args, check=check, diff=True)
    assert not r.get("failed"), r.get("msg")
    return r


def failed(mod, args, check=False):
    r = run_module(mod, args, check=check)
    assert r.get("failed"), r
    return r["msg"]


def release_two(src):
    """r2 of the checkpoint in src: one shard changed in place at the same size, config.json changed
    and grown, the rest as in r1."""
    p = os.path.join(src, SAME_SIZE)
    data = bytearray(open(p, "rb").read())
    for i in range(0, len(data), 4096):
        data[i] ^= 0x5A
    with open(p, "wb") as f:
        f.write(bytes(data))
    with open(os.path.join(src, GROWS), "ab") as f:
        f.write(b"  ")
    return publish(src, "r2")


@pytest.fixture
def server(tmp_path):
    """A Range-capable server over tmp_path/www, which holds the releases r1/ and r2/."""
    www = tmp_path / "www"
    www.mkdir()
    srv = make_server(str(www))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    srv.base = "http://127.0.0.1:%d" % srv.server_address[1]
    srv.www = str(www)
    yield srv
    srv.shutdown()
    srv.server_close()


def two_releases(server):
    r1 = write_checkpoint(os.path.join(server.www, "r1"))
    m1 = publish(r1, "r1")
    r2 = os.path.join(server.www, "r2")
    shutil.copytree(r1, r2)
    m2 = release_two(r2)
    return m1, m2


def fetch_args(server, rel, dest, **kw):
    args = {"src": server.base + "/" + rel, "dest": dest, "allow_http": True, "reserve_gib": 0.001}
    args.update(kw)
    return args


def served_bytes(server, release):
    return dict((k.split("/", 1)[1], v) for k, v in server.state.bytes.items()
                if k.startswith(release + "/") and not k.endswith(ck.MANIFEST_NAME))


def test_a_same_size_changed_file_is_fetched_not_skipped(server, tmp_path):
    """In place (no staging): what the old code skipped file by file (0 bytes), then failed every verify on."""
    m1, m2 = two_releases(server)
    dest = str(tmp_path / "m")
    ok(checkpoint_fetch, fetch_args(server, "r1", dest))
    ok(checkpoint_verify, {"path": dest, "revision": "r1"})
    server.state.reset()

    check = ok(checkpoint_fetch, fetch_args(server, "r2", dest), check=True)
    assert sorted(check["missing"]) == sorted([SAME_SIZE, GROWS]) and check["stale"] == [SAME_SIZE]
    real = ok(checkpoint_fetch, fetch_args(server, "r2", dest))
    assert real["changed"] and sorted(real["missing"]) == sorted([SAME_SIZE, GROWS])
    assert served_bytes(server, "r2") == {SAME_SIZE: SHARDS[SAME_SIZE], GROWS: SHARDS[GROWS] + 2}
    assert ok(checkpoint_verify, {"path": dest, "revision": "r2"})["verified"]
    assert ck.intact(dest, "r2") and not ck.intact(dest, "r1")
    assert m1 != m2


def test_without_a_fingerprint_a_file_of_the_right_size_is_hashed_kept_or_fetched(server, tmp_path):
    """An interrupted first fetch leaves complete files and no manifest: each is hashed, a right one kept
    (no byte served again), a wrong one of the same size fetched."""
    two_releases(server)
    dest = str(tmp_path / "m")
    shutil.copytree(os.path.join(server.www, "r1"), dest)
    os.unlink(os.path.join(dest, ck.MANIFEST_NAME))   # no manifest, no fingerprint: nothing vouched for
    server.state.reset()
    r = ok(checkpoint_fetch, fetch_args(server, "r2", dest))
    assert r["stale"] == [SAME_SIZE]
    assert served_bytes(server, "r2") == {SAME_SIZE: SHARDS[SAME_SIZE], GROWS: SHARDS[GROWS] + 2}
    assert ok(checkpoint_verify, {"path": dest, "revision": "r2"})["verified"]


def test_staging_links_what_did_not_change_and_never_writes_the_served_copy(server, tmp_path):
    two_releases(server)
    served = str(tmp_path / "m")
    staged = served + ".staged"
    ok(checkpoint_fetch, fetch_args(server, "r1", served))
    ok(checkpoint_verify, {"path": served, "revision": "r1"})
    before = snapshot(served)
    server.state.reset()

    check = ok(checkpoint_fetch, fetch_args(server, "r2", staged, reuse_from=served), check=True)
    assert sorted(check["reused"]) == sorted(KEPT) and sorted(check["missing"]) == sorted([SAME_SIZE, GROWS])
    assert not os.path.exists(staged)
    real = ok(checkpoint_fetch, fetch_args(server, "r2", staged, reuse_from=served))
    assert sorted(real["reused"]) == sorted(KEPT) and real["linked"] == len(KEPT)
    assert real["reused_bytes"] == sum(SHARDS[k] for k in KEPT)
    # only the two changed files came over the wire, the same-size one whole
    assert served_bytes(server, "r2") == {SAME_SIZE: SHARDS[SAME_SIZE], GROWS: SHARDS[GROWS] + 2}
    assert ok(checkpoint_verify, {"path": staged, "revision": "r2"})["verified"]
    assert snapshot(served) == before   # every byte, size, mtime and inode of the served copy
    for rel in KEPT:
        assert os.stat(os.path.join(staged, rel)).st_ino == os.stat(os.path.join(served, rel)).st_ino
    for rel in (SAME_SIZE, GROWS):
        assert os.stat(os.path.join(staged, rel)).st_ino != os.stat(os.path.join(served, rel)).st_ino
    again = ok(checkpoint_fetch, fetch_args(server, "r2", staged, reuse_from=served))
    assert not again["changed"] and again["reused"] == [] and again["missing"] == []


def test_staging_never_links_a_file_the_served_copy_holds_with_other_bytes(server, tmp_path):
    """The old manifest says the same sha256, but the file was written since its verification: it is
    hashed, found different, and fetched instead of linked."""
    two_releases(server)
    served = str(tmp_path / "m")
    ok(checkpoint_fetch, fetch_args(server, "r1", served))
    ok(checkpoint_verify, {"path": served})
    rel = KEPT[0]
    with open(os.path.join(served, rel), "r+b") as f:   # a normal write: the mtime moves
        f.write(b"\0\1\2\3")
    server.state.reset()
    r = ok(checkpoint_fetch, fetch_args(server, "r2", served + ".staged", reuse_from=served))
    assert rel not in r["reused"] and rel in r["missing"]
    assert served_bytes(server, "r2")[rel] == SHARDS[rel]


def test_reuse_from_must_not_be_dest(server, tmp_path):
    two_releases(server)
    dest = str(tmp_path / "m")
    msg = failed(checkpoint_fetch, fetch_args(server, "r1", dest, reuse_from=dest + "/"))
    assert "reuse_from" in msg and "dest itself" in msg


def expected_of(manifest, drop_sha=()):
    return [dict(e, sha256=None if e["path"] in drop_sha else e["sha256"]) for e in manifest["files"]]


def test_prepare_for_another_tool(server, tmp_path):
    """What huggingface_hub or rsync (which skips a file of the right size) finds: the old staged
    revision's file of the same size and its manifest gone, the unchanged files linked in."""
    m1, m2 = two_releases(server)
    served = str(tmp_path / "m")
    staged = served + ".staged"
    shutil.copytree(os.path.join(server.www, "r1"), served)
    ok(checkpoint_verify, {"path": served})
    shutil.copytree(os.path.join(server.www, "r1"), staged)       # an earlier staged revision, r1's bytes
    before = snapshot(served)
    args = {"dest": staged, "state": "prepare", "expected": expected_of(m2, drop_sha=[GROWS]),
            "revision": "r2", "reuse_from": served}
    check = ok(checkpoint_fetch, args, check=True)
    assert check["changed"] and check["stale"] == [SAME_SIZE] and check["manifest_removed"]
    assert os.path.exists(os.path.join(staged, SAME_SIZE))
    real = ok(checkpoint_fetch, args)
    assert real["stale"] == [SAME_SIZE] and real["manifest_removed"]
    assert not os.path.exists(os.path.join(staged, SAME_SIZE))
    assert not os.path.exists(os.path.join(staged, ck.MANIFEST_NAME))
    assert os.path.exists(os.path.join(staged, GROWS))            # no sha256 listed: left to the tool
    for rel in KEPT:  # r1's copies of the kept files were hashed and found right: kept, not re-linked
        assert rel not in real["reused"]
    assert snapshot(served) == before
    again = ok(checkpoint_fetch, args)
    assert not again["changed"]
    # a fresh staging directory gets the links
    fresh = ok(checkpoint_fetch, dict(args, dest=str(tmp_path / "other.staged")))
    assert sorted(fresh["reused"]) == sorted(KEPT) and fresh["linked"] == len(KEPT)
    assert m1 != m2


# --- checkpoint_switch ---------------------------------------------------------------------------

def verified_copy(path, revision, server_www):
    shutil.copytree(os.path.join(server_www, revision), path)
    ok(checkpoint_verify, {"path": path, "revision": revision})


def revision_at(path):
    return json.load(open(os.path.join(path, ck.MANIFEST_NAME)))["revision"]


def switch(path, state, check=False, **kw):
    return ok(checkpoint_switch, dict({"path": path, "state": state}, **kw), check=check)


def test_switch_switch_back_switch_release_each_idempotent(server, tmp_path):
    two_releases(server)
    d = str(tmp_path / "m")
    verified_copy(d, "r1", server.www)
    verified_copy(d + ".staged", "r2", server.www)

    check = switch(d, "switched", check=True, revision="r2")
    assert check["changed"] and check["actions"] == ["rename %s -> %s.previous" % (d, d), "rename %s.staged -> %s" % (d, d)]
    assert revision_at(d) == "r1" and os.path.isdir(d + ".staged")      # check mode moved nothing
    for state, at_d, at_staged, at_previous in (("switched", "r2", None, "r1"), ("switched_back", "r1", "r2", None),
                                                ("switched", "r2", None, "r1"), ("released", "r2", None, None)):
        first = switch(d, state, revision="r2")
        second = switch(d, state, revision="r2")
        assert first["changed"] and not second["changed"], (state, first, second)
        assert second["actions"] == [] and second["diff"]["before"] == second["diff"]["after"]
        assert revision_at(d) == at_d and ck.intact(d, at_d)   # a rename keeps the fingerprint valid
        assert (revision_at(d + ".staged") if os.path.exists(d + ".staged") else None) == at_staged
        assert (revision_at(d + ".previous") if os.path.exists(d + ".previous") else None) == at_previous
        assert first["switched"] == (state == "switched") and first["staged"] == (at_staged is not None)
    assert sorted(os.listdir(str(tmp_path))) == ["m", "www"]


@pytest.mark.parametrize("placeholder", [False, True])
def test_a_switch_cut_between_its_renames_is_finished_or_undone(server, tmp_path, placeholder):
    """The first rename done, the second not: checkpoint_dir missing (or the empty directory docker
    --volume makes of a missing source when the server restarted meanwhile)."""
    two_releases(server)
    d = str(tmp_path / "m")
    verified_copy(d, "r1", server.www)
    verified_copy(d + ".staged", "r2", server.www)
    os.rename(d, d + ".previous")
    if placeholder:
        os.mkdir(d)
    assert "switch was interrupted" not in json.dumps(switch(d, "switched", check=True))
    r = switch(d, "switched", revision="r2")
    assert r["actions"] == ["rename %s.staged -> %s" % (d, d)]
    assert revision_at(d) == "r2" and revision_at(d + ".previous") == "r1" and not os.path.exists(d + ".staged")
    assert not switch(d, "switched", revision="r2")["changed"]
    # the same cut, undone
    os.rename(d, d + ".staged")
    if placeholder:
        os.mkdir(d)
    back = switch(d, "switched_back")
    assert back["actions"] == ["rename %s.previous -> %s" % (d, d)]
    assert revision_at(d) == "r1" and revision_at(d + ".staged") == "r2"
    # release refuses while checkpoint_dir is missing
    os.rename(d, d + ".previous")
    msg = failed(checkpoint_switch, {"path": d, "state": "released"})
    assert "switch" in msg and "switch_back" in msg and os.path.isdir(d + ".previous")


def test_switch_refuses_an_unfinished_staged_copy_and_an_unreleased_previous(server, tmp_path):
    two_releases(server)
    d = str(tmp_path / "m")
    verified_copy(d, "r1", server.www)
    shutil.copytree(os.path.join(server.www, "r2"), d + ".staged")     # not verified: no fingerprint
    msg = failed(checkpoint_switch, {"path": d, "state": "switched"})
    assert "not verified" in msg and "site.yml" in msg and revision_at(d) == "r1"
    ok(checkpoint_verify, {"path": d + ".staged"})
    msg = failed(checkpoint_switch, {"path": d, "state": "switched", "revision": "r3"})
    assert "checkpoint_revision" in msg and revision_at(d) == "r1"
    os.mkdir(d + ".previous")
    with open(os.path.join(d + ".previous", "x"), "w") as f:
        f.write("old")
    msg = failed(checkpoint_switch, {"path": d, "state": "switched"})
    assert "tasks_from: release" in msg and revision_at(d) == "r1"


def test_nothing_staged_nothing_switched(tmp_path):
    d = str(tmp_path / "m")
    os.mkdir(d)
    with open(os.path.join(d, "f"), "w") as f:
        f.write("x")
    os.mkdir(d + ".staged")                 # an empty staging directory is nothing staged
    for state in ("switched", "switched_back", "released"):
        r = switch(d, state)
        assert not r["changed"] and r["actions"] == [] and not r["switched"]
    assert os.listdir(str(tmp_path)) != [] and open(os.path.join(d, "f")).read() == "x"


def test_release_finishes_an_interrupted_removal(tmp_path):
    d = str(tmp_path / "m")
    for p in (d, d + ".previous.removing"):
        os.makedirs(os.path.join(p, "sub"))
    r = switch(d, "released")
    assert r["changed"] and not os.path.exists(d + ".previous.removing") and os.path.isdir(d)
    assert not switch(d, "released")["changed"]
