"""checkpoint_fetch and checkpoint_verify: check mode with diff, for real, and again (in this
process, harness.run_module; once through ansible-playbook for the wiring)."""
import json
import os
import sys
import textwrap
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from support_checkpoint import SHARDS, flip_byte, src_dir  # noqa: E402,F401  pylint: disable=unused-import
from range_http_server import make_server  # noqa: E402  (support_checkpoint put it on sys.path)

from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402
from ansible_collections.sparkops.appliance.plugins.modules import checkpoint_fetch, checkpoint_verify  # noqa: E402
from harness import ansible_env, host_results, play_json  # noqa: E402
from harness import run_module as run_in_process  # noqa: E402


@pytest.fixture
def http_server(src_dir):
    """support_checkpoint's server, serving with a short poll interval: shutdown() at teardown
    waits for the serving loop to notice (0.5 s a test with the default)."""
    server = make_server(src_dir)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    server.base = "http://127.0.0.1:%d" % server.server_address[1]
    yield server
    server.shutdown()
    server.server_close()


class Exit:
    """A module's end: failed (fail_json) or not (exit_json), and its result."""

    def __init__(self, result):
        self.failed = bool(result.get("failed"))
        self.result = result


def run_module(mod, args, check=False, diff=True):
    return Exit(run_in_process(mod, args, check=check, diff=diff))


def ok(mod, args, **kw):
    e = run_module(mod, args, **kw)
    assert not e.failed, e.result.get("msg")
    return e.result


def publish_manifest(src_dir):
    """What a publisher does: a manifest beside the files."""
    m = ck.build_manifest(src_dir, revision="r1")
    with open(os.path.join(src_dir, ck.MANIFEST_NAME), "w") as f:
        f.write(ck.dump_manifest(m))
    return m


def tree(root):
    out = {}
    for dirpath, _d, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out


@pytest.mark.parametrize("kind", ["http", "path"])
def test_fetch_check_real_again(kind, src_dir, http_server, tmp_path):
    manifest = publish_manifest(src_dir)
    dest = str(tmp_path / "dest" / "model")
    progress = str(tmp_path / "progress.json")
    args = {"src": http_server.base if kind == "http" else src_dir, "dest": dest, "allow_http": True,  # a local stand-in without TLS
            "progress_file": progress, "reserve_gib": 0.001}

    check = ok(checkpoint_fetch, args, check=True)
    assert check["changed"] and sorted(check["missing"]) == sorted(SHARDS)
    assert check["total_bytes"] == sum(SHARDS.values())
    assert check["diff"]["before"] == {"files": "", "manifest": ""}
    assert "model-00001-of-00002.safetensors %d\n" % SHARDS["model-00001-of-00002.safetensors"] \
        in check["diff"]["after"]["files"]
    assert not os.path.exists(dest) and not os.path.exists(progress)

    real = ok(checkpoint_fetch, args)
    assert real["changed"] and real["diff"] == check["diff"]
    assert real["transferred_bytes"] == sum(SHARDS.values())
    assert tree(dest) == tree(src_dir)  # same files, same bytes, and the manifest
    assert json.load(open(os.path.join(dest, ck.MANIFEST_NAME))) == manifest
    prog = json.load(open(progress))
    assert prog["done"] == prog["total"] == sum(SHARDS.values()) and prog["state"] == "done"
    if kind == "http":
        served = dict(http_server.state.bytes)
        assert served.pop(ck.MANIFEST_NAME) == 2 * os.path.getsize(  # check run + real run
            os.path.join(src_dir, ck.MANIFEST_NAME))
        assert served == dict((k, v) for k, v in SHARDS.items() if v)

    again = ok(checkpoint_fetch, args)
    assert not again["changed"] and again["missing"] == [] and again["transferred_bytes"] == 0
    assert again["diff"]["before"] == again["diff"]["after"]
    again_check = ok(checkpoint_fetch, args, check=True)
    assert not again_check["changed"]


def test_fetch_from_path_without_manifest_builds_one_and_leaves_source_alone(src_dir, tmp_path):
    dest = str(tmp_path / "dest")
    before = tree(src_dir)
    r = ok(checkpoint_fetch, {"src": src_dir, "dest": dest})
    assert r["changed"] and r["manifest_built"]
    assert tree(src_dir) == before
    m = json.load(open(os.path.join(dest, ck.MANIFEST_NAME)))
    assert sorted(e["path"] for e in m["files"]) == sorted(SHARDS)
    assert ok(checkpoint_verify, {"path": dest})["verified"]


def test_fetch_interrupted_then_resumed_without_refetching(src_dir, http_server, tmp_path):
    publish_manifest(src_dir)
    rel = "model-00001-of-00002.safetensors"
    dest = str(tmp_path / "dest")
    http_server.state.drops[rel] = 2 * 1024 * 1024
    args = {"src": http_server.base, "dest": dest, "allow_http": True, "retries": 0, "progress_file": str(tmp_path / "p.json")}
    first = run_module(checkpoint_fetch, args)
    assert first.failed
    assert "interrupted at %d of %d bytes" % (2 * 1024 * 1024, SHARDS[rel]) in first.result["msg"]
    assert rel + ".part" in first.result["msg"]
    assert json.load(open(str(tmp_path / "p.json")))["state"] == "failed"
    assert not os.path.exists(os.path.join(dest, ck.MANIFEST_NAME))  # not complete: no manifest yet
    second = ok(checkpoint_fetch, args)
    assert second["changed"] and second["resumed_bytes"] == 2 * 1024 * 1024
    assert http_server.state.bytes[rel] == SHARDS[rel]  # the first 2 MiB were not served twice
    assert [q for q in http_server.state.requests if q[0] == rel][-1] == [rel, "bytes=2097152-"]
    assert ok(checkpoint_verify, {"path": dest})["verified"]


def test_fetch_fails_before_writing_when_disk_is_short(src_dir, http_server, tmp_path):
    publish_manifest(src_dir)
    dest = str(tmp_path / "dest")
    e = run_module(checkpoint_fetch, {"src": http_server.base, "dest": dest, "allow_http": True, "reserve_gib": 1e9,
                                      "space_hint": "Lower checkpoint_min_free_margin_gib."})
    assert e.failed and "not enough free disk" in e.result["msg"]
    assert "Lower checkpoint_min_free_margin_gib." in e.result["msg"]
    assert not os.path.exists(dest)
    assert set(http_server.state.bytes) == {ck.MANIFEST_NAME}  # only the manifest was read


def test_fetch_space_state(tmp_path):
    r = ok(checkpoint_fetch, {"dest": str(tmp_path / "x"), "state": "space", "expected_bytes": 1024})
    assert not r["changed"] and r["free_bytes"] > 1024
    e = run_module(checkpoint_fetch, {"dest": str(tmp_path / "x"), "state": "space",
                                      "expected_bytes": 1 << 62, "space_hint": "HINT"})
    assert e.failed and "HINT" in e.result["msg"]


def test_fetch_missing_manifest_on_http_is_named(src_dir, http_server, tmp_path):
    e = run_module(checkpoint_fetch, {"src": http_server.base, "dest": str(tmp_path / "d"), "allow_http": True})
    assert e.failed and "cannot read the manifest %s/%s" % (http_server.base, ck.MANIFEST_NAME) in e.result["msg"]
    assert "404" in e.result["msg"]


def test_verify_check_real_again_and_fingerprint_skips_hashing(src_dir):
    publish_manifest(src_dir)
    check = ok(checkpoint_verify, {"path": src_dir}, check=True)
    assert check["changed"] and check["verified"] and check["hashed"]
    assert check["diff"]["before"]["fingerprint"] == ""
    assert not os.path.exists(os.path.join(src_dir, ck.FINGERPRINT_NAME))
    real = ok(checkpoint_verify, {"path": src_dir})
    assert real["changed"] and real["hashed"] and real["diff"] == check["diff"]
    assert real["total_bytes"] == sum(SHARDS.values()) and real["files"] == len(SHARDS)
    again = ok(checkpoint_verify, {"path": src_dir})
    assert not again["changed"] and again["verified"] and not again["hashed"]
    assert again["diff"]["before"] == again["diff"]["after"]
    re = ok(checkpoint_verify, {"path": src_dir, "reverify": True})
    assert not re["changed"] and re["hashed"]


def test_verify_names_a_corrupted_byte_only_when_reverifying_if_mtime_kept(src_dir):
    """The documented trade-off: a byte changed behind the file system's back (same size and mtime)
    passes the fingerprint; reverify hashes and names it."""
    publish_manifest(src_dir)
    ok(checkpoint_verify, {"path": src_dir})
    rel = "model-00001-of-00002.safetensors"
    good = json.load(open(os.path.join(src_dir, ck.MANIFEST_NAME)))
    expected = [e["sha256"] for e in good["files"] if e["path"] == rel][0]
    flip_byte(os.path.join(src_dir, rel), 5)
    assert ok(checkpoint_verify, {"path": src_dir})["verified"]
    e = run_module(checkpoint_verify, {"path": src_dir, "reverify": True})
    assert e.failed
    assert "%s: sha256 mismatch: expected %s" % (os.path.join(src_dir, rel), expected) in e.result["msg"]
    assert e.result["problems"][0]["path"] == rel


def test_verify_create_check_real_again(src_dir):
    before = tree(src_dir)
    check = ok(checkpoint_verify, {"path": src_dir, "create": True, "revision": "r9"}, check=True)
    assert check["changed"] and check["manifest_created"] and check["verified"]
    assert tree(src_dir) == before  # check mode wrote nothing
    assert check["diff"]["before"] == {"manifest": "", "fingerprint": ""}
    real = ok(checkpoint_verify, {"path": src_dir, "create": True, "revision": "r9"})
    assert real["changed"] and real["diff"]["after"]["manifest"] == check["diff"]["after"]["manifest"]
    m = json.load(open(os.path.join(src_dir, ck.MANIFEST_NAME)))
    assert m["revision"] == "r9" and len(m["files"]) == len(SHARDS)
    assert os.path.exists(os.path.join(src_dir, ck.FINGERPRINT_NAME))
    again = ok(checkpoint_verify, {"path": src_dir, "create": True, "revision": "r9"})
    assert not again["changed"] and not again["hashed"] and not again["manifest_created"]
    assert again["diff"]["before"] == again["diff"]["after"]


def test_verify_notices_a_touched_file_without_reverify(src_dir):
    publish_manifest(src_dir)
    ok(checkpoint_verify, {"path": src_dir})
    rel = "config.json"
    with open(os.path.join(src_dir, rel), "r+b") as f:
        f.write(b"X")  # a normal write moves the mtime
    e = run_module(checkpoint_verify, {"path": src_dir})
    assert e.failed and os.path.join(src_dir, rel) in e.result["msg"]
    q = ok(checkpoint_verify, {"path": src_dir, "quick": True})
    assert not q["verified"] and not q["changed"]


def test_verify_without_manifest_and_wrong_revision(src_dir):
    e = run_module(checkpoint_verify, {"path": src_dir})
    assert e.failed and "no manifest" in e.result["msg"]
    publish_manifest(src_dir)
    e = run_module(checkpoint_verify, {"path": src_dir, "revision": "r2"})
    assert e.failed and "revision r1, not the requested r2" in e.result["msg"]
    assert not ok(checkpoint_verify, {"path": src_dir, "revision": "r2", "quick": True})["verified"]


def test_verify_records_the_pinned_revision_in_a_manifest_that_names_none(src_dir):
    """A copy published (or fetched) without a revision is accepted at the pinned one, and the full
    verification writes it into the manifest, so that a later run can tell a new revision from it;
    the quick check only reads, and a copy that records it is no longer taken for another one."""
    m = ck.build_manifest(src_dir, revision=None)
    with open(os.path.join(src_dir, ck.MANIFEST_NAME), "w") as f:
        f.write(ck.dump_manifest(m))
    ok(checkpoint_verify, {"path": src_dir})
    q = ok(checkpoint_verify, {"path": src_dir, "revision": "r5", "quick": True})
    assert q["verified"] and q["revision"] is None and not q["changed"]
    check = ok(checkpoint_verify, {"path": src_dir, "revision": "r5"}, check=True)
    assert check["changed"] and check["revision_recorded"]
    assert json.load(open(os.path.join(src_dir, ck.MANIFEST_NAME)))["revision"] is None  # check mode wrote nothing
    real = ok(checkpoint_verify, {"path": src_dir, "revision": "r5"})
    assert real["changed"] and real["revision_recorded"] and real["revision"] == "r5" and not real["hashed"]
    written = json.load(open(os.path.join(src_dir, ck.MANIFEST_NAME)))
    assert written["revision"] == "r5" and written["files"] == m["files"]
    again = ok(checkpoint_verify, {"path": src_dir, "revision": "r5"})
    assert not again["changed"] and not again["revision_recorded"] and not again["hashed"]
    assert ok(checkpoint_verify, {"path": src_dir, "revision": "r5", "quick": True})["verified"]
    assert ck.intact(src_dir, "r5") and not ck.intact(src_dir, "r6")
    assert not ok(checkpoint_verify, {"path": src_dir, "revision": "r6", "quick": True})["verified"]


def test_fetch_through_ansible_cli(src_dir, http_server, tmp_path):
    """The modules run through ansible itself (module_utils shipped with the module): fetch,
    verify, verify again, as three tasks of one ansible-playbook run."""
    publish_manifest(src_dir)
    dest = str(tmp_path / "dest")
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent("""
        - name: Checkpoint modules
          hosts: localhost
          gather_facts: false
          tasks:
            - name: fetch
              sparkops.appliance.checkpoint_fetch: {src: "%(src)s", dest: "%(dest)s", allow_http: true}
            - name: verify
              sparkops.appliance.checkpoint_verify: {path: "%(dest)s"}
            - name: verify again
              sparkops.appliance.checkpoint_verify: {path: "%(dest)s"}
        """) % {"src": http_server.base, "dest": dest})
    doc = play_json(str(play), extra_vars={"ansible_python_interpreter": sys.executable},
                    env=ansible_env(ANSIBLE_LOCALHOST_WARNING="0"), timeout=120)
    results = {task: res for _play, task, res in host_results(doc, "localhost")}
    assert list(results) == ["fetch", "verify", "verify again"], results

    r = results["fetch"]
    assert r.get("changed") is True, r
    r = results["verify"]
    assert r.get("changed") is True and r["verified"] and r["total_bytes"] == sum(SHARDS.values()), r
    r = results["verify again"]
    assert r.get("changed") is False and r["hashed"] is False, r


def test_fetch_refuses_plain_http_unless_allowed(src_dir, http_server, tmp_path):
    """https:// only by default; the message names the way out."""
    publish_manifest(src_dir)
    e = run_module(checkpoint_fetch, {"src": http_server.base, "dest": str(tmp_path / "d")})
    assert e.failed and "plain http://" in e.result["msg"] and "checkpoint_allow_http" in e.result["msg"], e.result
    assert http_server.state.requests == []   # nothing was asked of it
