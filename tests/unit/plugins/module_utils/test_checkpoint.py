"""Manifests, parallel verification, fingerprints and resumable transfers (module_utils)."""
import hashlib
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from support_checkpoint import SHARDS, flip_byte, http_server, src_dir  # noqa: E402,F401  pylint: disable=unused-import

from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_manifest_lists_every_file_with_size_and_sha256(src_dir):
    m = ck.build_manifest(src_dir, workers=3)
    assert [e["path"] for e in m["files"]] == sorted(SHARDS)
    for e in m["files"]:
        p = os.path.join(src_dir, e["path"])
        assert e["size"] == SHARDS[e["path"]] == os.path.getsize(p)
        assert e["sha256"] == sha(p)


def test_manifest_skips_metadata_partials_and_hf_cache(src_dir):
    for rel in (ck.MANIFEST_NAME, ck.FINGERPRINT_NAME, "x.safetensors.part", ".cache/huggingface/a"):
        p = os.path.join(src_dir, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        open(p, "w").close()
    assert ck.list_files(src_dir) == sorted(SHARDS)


@pytest.mark.parametrize("workers", [1, 2, 8])
def test_parallel_hash_equals_sequential(src_dir, workers):
    rels = sorted(SHARDS)
    got = ck.hash_files(src_dir, rels, workers)
    assert got == dict((r, (SHARDS[r], sha(os.path.join(src_dir, r)))) for r in rels)


def test_auto_workers_is_min_of_files_and_cpus():
    cpus = len(os.sched_getaffinity(0))
    assert ck.auto_workers(1) == 1
    assert ck.auto_workers(1000) == cpus
    assert ck.auto_workers(5, workers=3) == 3
    assert ck.auto_workers(2, workers=16) == 2


def test_corrupted_byte_is_detected_and_named(src_dir):
    m = ck.build_manifest(src_dir)
    victim = "model-00002-of-00002.safetensors"
    before = sha(os.path.join(src_dir, victim))
    flip_byte(os.path.join(src_dir, victim), 1234567)
    problems = ck.verify_tree(src_dir, m)
    assert len(problems) == 1
    rel, what, expected, actual = problems[0]
    assert (rel, what, expected) == (victim, "sha256", before)
    assert actual == sha(os.path.join(src_dir, victim)) != before
    msg = ck.describe_problems(src_dir, problems)
    assert os.path.join(src_dir, victim) in msg and before in msg and actual in msg


def test_missing_and_truncated_files_are_named(src_dir):
    m = ck.build_manifest(src_dir)
    os.unlink(os.path.join(src_dir, "config.json"))
    with open(os.path.join(src_dir, "tokenizer", "tokenizer.json"), "r+b") as f:
        f.truncate(100)
    problems = sorted(ck.verify_tree(src_dir, m))
    assert problems == [("config.json", "missing", 321, None),
                        ("tokenizer/tokenizer.json", "size", 70001, 100)]


@pytest.mark.parametrize("bad, needle", [
    ({"files": [{"path": "../etc/passwd", "size": 1, "sha256": "a" * 64}]}, "'..'"),
    ({"files": [{"path": "/abs", "size": 1, "sha256": "a" * 64}]}, "relative"),
    ({"files": [{"path": "a", "size": -1, "sha256": "a" * 64}]}, "size"),
    ({"files": [{"path": "a", "size": 1, "sha256": "xyz"}]}, "64 hex"),
    ({"files": [{"path": "a", "size": 1, "sha256": "a" * 64}] * 2}, "twice"),
    ({"files": []}, "empty"),
    ([], "object"),
])
def test_bad_manifests_are_rejected_with_the_reason(bad, needle):
    with pytest.raises(ck.CheckpointError, match=needle):
        ck.parse_manifest(json.dumps(bad), "m.json")


def test_fingerprint_changes_with_mtime_size_and_manifest(src_dir):
    m = ck.build_manifest(src_dir)
    fp = ck.fingerprint(src_dir, m)
    assert ck.fingerprint(src_dir, m) == fp
    p = os.path.join(src_dir, "config.json")
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert ck.fingerprint(src_dir, m) != fp
    m2 = json.loads(json.dumps(m))
    m2["files"][0]["sha256"] = "0" * 64
    assert ck.fingerprint(src_dir, m2)["manifest_sha256"] != fp["manifest_sha256"]
    os.unlink(p)
    assert ck.fingerprint(src_dir, m) is None


def test_http_fetch_uses_range_to_resume_after_a_drop(src_dir, http_server, tmp_path):
    """A drop midway with retries=0 leaves a .part; the next call requests only the rest."""
    m = ck.build_manifest(src_dir)
    rel = "model-00001-of-00002.safetensors"
    e = [x for x in m["files"] if x["path"] == rel][0]
    dest = str(tmp_path / "dest")
    os.makedirs(dest)
    http_server.state.drops[rel] = 1000000
    src = ck.HttpSource(http_server.base, allow_http=True)
    with pytest.raises(ck.CheckpointError, match="interrupted at 1000000 of %d bytes" % e["size"]):
        ck.fetch_file(src, rel, dest, e["size"], e["sha256"], retries=0)
    assert os.path.getsize(os.path.join(dest, rel + ".part")) == 1000000
    assert not os.path.exists(os.path.join(dest, rel))
    got = ck.fetch_file(src, rel, dest, e["size"], e["sha256"], retries=0)
    assert got == e["size"] - 1000000
    assert http_server.state.bytes[rel] == e["size"]  # every byte served exactly once
    assert http_server.state.requests == [[rel, None], [rel, "bytes=1000000-"]]
    assert sha(os.path.join(dest, rel)) == e["sha256"]
    assert not os.path.exists(os.path.join(dest, rel + ".part"))


def test_http_fetch_retries_within_one_call(src_dir, http_server, tmp_path):
    m = ck.build_manifest(src_dir)
    rel = "model-00002-of-00002.safetensors"
    e = [x for x in m["files"] if x["path"] == rel][0]
    http_server.state.drops[rel] = 4096
    sleeps = []
    got = ck.fetch_file(ck.HttpSource(http_server.base, allow_http=True), rel, str(tmp_path), e["size"], e["sha256"],
                        retries=1, sleep=sleeps.append)
    assert got == e["size"] and sleeps == [1.0]
    assert http_server.state.bytes[rel] == e["size"]
    assert http_server.state.requests[-1] == [rel, "bytes=4096-"]


def test_server_that_ignores_range_restarts_from_zero(src_dir, http_server, tmp_path):
    m = ck.build_manifest(src_dir)
    rel = "tokenizer/tokenizer.json"
    e = [x for x in m["files"] if x["path"] == rel][0]
    part = os.path.join(str(tmp_path), "tokenizer", "tokenizer.json.part")
    os.makedirs(os.path.dirname(part))
    with open(part, "wb") as f:
        f.write(b"\0" * 500)  # garbage that a 200 answer must replace, not extend
    http_server.state.norange.add(rel)
    got = ck.fetch_file(ck.HttpSource(http_server.base, allow_http=True), rel, str(tmp_path), e["size"], e["sha256"])
    assert got == e["size"]
    assert sha(os.path.join(str(tmp_path), rel)) == e["sha256"]


def test_corrupted_source_byte_fails_naming_the_file_and_removes_the_part(src_dir, http_server, tmp_path):
    m = ck.build_manifest(src_dir)
    rel = "model-00002-of-00002.safetensors"
    e = [x for x in m["files"] if x["path"] == rel][0]
    flip_byte(os.path.join(src_dir, rel), 99)
    with pytest.raises(ck.CheckpointError) as err:
        ck.fetch_file(ck.HttpSource(http_server.base, allow_http=True), rel, str(tmp_path), e["size"], e["sha256"])
    msg = str(err.value)
    assert rel in msg and "sha256 mismatch" in msg and e["sha256"] in msg
    assert sha(os.path.join(src_dir, rel)) in msg
    assert not os.path.exists(os.path.join(str(tmp_path), rel + ".part"))
    assert not os.path.exists(os.path.join(str(tmp_path), rel))


def test_http_404_fails_at_once_without_retries(src_dir, http_server, tmp_path):
    sleeps = []
    with pytest.raises(ck.CheckpointError, match="HTTP 404"):
        ck.fetch_file(ck.HttpSource(http_server.base, allow_http=True), "nope.bin", str(tmp_path), 10, "a" * 64,
                      retries=3, sleep=sleeps.append)
    assert sleeps == []


def test_file_source_resumes_from_part(src_dir, tmp_path):
    m = ck.build_manifest(src_dir)
    rel = "model-00001-of-00002.safetensors"
    e = [x for x in m["files"] if x["path"] == rel][0]
    with open(os.path.join(src_dir, rel), "rb") as f:
        head = f.read(777777)
    with open(os.path.join(str(tmp_path), rel + ".part"), "wb") as f:
        f.write(head)
    got = ck.fetch_file(ck.FileSource(src_dir), rel, str(tmp_path), e["size"], e["sha256"])
    assert got == e["size"] - 777777
    assert sha(os.path.join(str(tmp_path), rel)) == e["sha256"]


def test_progress_file_reports_bytes_done_of_total(tmp_path):
    now = [0.0]
    path = str(tmp_path / "progress.json")
    pr = ck.Progress(path, total=4 * ck.GIB, interval=1.0, clock=lambda: now[0])
    pr.file = "a.safetensors"
    now[0] = 2.0
    pr.add(ck.GIB)
    data = json.load(open(path))
    assert data["done"] == ck.GIB and data["total"] == 4 * ck.GIB and data["state"] == "running"
    assert data["text"].startswith("1.00 GiB of 4.00 GiB (25.0%), 512.0 MiB/s, now a.safetensors")
    now[0] = 2.5
    pr.add(ck.GIB)  # within the interval: not written
    assert json.load(open(path))["done"] == ck.GIB
    pr.finish()
    assert json.load(open(path))["done"] == 2 * ck.GIB
    assert json.load(open(path))["state"] == "done"


def test_free_space_check_uses_nearest_existing_parent(tmp_path):
    ok, free, probe = ck.free_space_check(str(tmp_path / "a" / "b"), 1, 0)
    assert ok and probe == str(tmp_path) and free > 0
    ok, free, probe = ck.free_space_check(str(tmp_path), free + 1, 0)
    assert not ok


# --- credentials and redirects ---------------------------------------------------------------

class _Recorder(object):
    """A local server: /r/<n> answers 302 to redirects[n] (an absolute URL), any other path 200 with
    the request's headers recorded."""

    def __init__(self, host="127.0.0.1"):
        import http.server
        import threading
        self.seen = []
        self.redirects = {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args):
                pass

            def do_GET(self):
                outer.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                if self.path.startswith("/r/"):
                    self.send_response(302)
                    self.send_header("Location", outer.redirects[self.path[3:]])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"payload"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.base = "http://%s:%d" % (host, self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


CREDENTIALS = {"Authorization": "Bearer tok-SECRET", "X-Api-Token": "custom-SECRET", "Cookie": "s=SECRET"}


@pytest.fixture
def recorders():
    made = []

    def make(host="127.0.0.1"):
        made.append(_Recorder(host))
        return made[-1]
    yield make
    for rec in made:
        rec.close()


@pytest.mark.parametrize("target_host", ["127.0.0.2", "127.0.0.1"])
def test_a_redirect_to_another_host_or_port_gets_no_credentials(recorders, target_host):
    """A 302 from the checkpoint server to another address (127.0.0.2), or to another port of the
    same address, is another origin: the request there carries none of the credentials (Authorization,
    Cookie, the headers of checkpoint_http_headers), as requests does."""
    origin, target = recorders(), recorders(target_host)
    origin.redirects["1"] = target.base + "/file"
    src = ck.HttpSource(origin.base, dict(CREDENTIALS), allow_http=True)
    assert src.read_text(origin.base + "/r/1") == "payload"
    assert [p for p, _h in origin.seen] == ["/r/1"] and origin.seen[0][1]["authorization"] == "Bearer tok-SECRET"
    ((path, headers),) = target.seen
    assert path == "/file"
    assert not [v for v in headers.values() if "SECRET" in v], headers


def test_a_redirect_on_the_same_origin_keeps_the_credentials(recorders):
    origin = recorders()
    origin.redirects["1"] = origin.base + "/file"
    src = ck.HttpSource(origin.base, dict(CREDENTIALS), allow_http=True)
    assert src.read_text(origin.base + "/r/1") == "payload"
    assert [p for p, _h in origin.seen] == ["/r/1", "/file"]
    for name, value in CREDENTIALS.items():
        assert origin.seen[1][1][name.lower()] == value


def test_a_redirect_keeps_range_and_chains_are_bounded(recorders):
    origin, target = recorders(), recorders("127.0.0.2")
    origin.redirects["1"] = target.base + "/r/2"
    target.redirects["2"] = target.base + "/r/2"   # a loop
    origin.redirects["3"] = target.base + "/file"
    src = ck.HttpSource(origin.base, dict(CREDENTIALS), allow_http=True)
    with pytest.raises(ck.CheckpointError, match="redirects"):
        src.read_text(origin.base + "/r/1")
    assert len(target.seen) == ck.MAX_REDIRECTS
    resp = src.get(origin.base + "/r/3", offset=3)   # a resumed transfer: Range is no credential
    resp.close()
    assert target.seen[-1][0] == "/file" and target.seen[-1][1]["range"] == "bytes=3-"
    assert not [h for _p, hs in target.seen for h in hs.values() if "SECRET" in h]


@pytest.mark.parametrize("old, new, keep", [
    ("https://a.example/x", "https://a.example/y", True),
    ("https://a.example/x", "https://a.example:443/y", True),
    ("https://a.example/x", "https://b.example/y", False),
    ("https://a.example/x", "http://a.example/y", False),     # https -> http: never
    ("http://a.example/x", "https://a.example/y", False),     # another scheme is another origin
    ("http://a.example:8080/x", "http://a.example:8081/y", False),
    ("https://A.example/x", "https://a.EXAMPLE/y", True),
])
def test_credentials_follow_only_within_one_origin(old, new, keep):
    assert ck.same_origin(old, new) is keep


def test_http_is_refused_unless_allowed(recorders):
    origin = recorders()
    with pytest.raises(ck.CheckpointError, match="allow_http"):
        ck.HttpSource(origin.base, allow_http=False)
    assert ck.HttpSource(origin.base, allow_http=True).read_text(origin.base + "/file") == "payload"


def test_a_downgrade_redirect_to_http_is_refused_unless_allowed(recorders):
    """An https source redirected to http:// (stands in: the check reads only the URLs)."""
    target = recorders()
    with pytest.raises(ck.CheckpointError, match="allow_http"):
        ck.check_redirect("https://a.example/x", target.base + "/file", allow_http=False)
    ck.check_redirect("https://a.example/x", target.base + "/file", allow_http=True)
