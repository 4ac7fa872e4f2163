# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoint manifests, parallel verification, fingerprints and resumable transfers.

Shared by the checkpoint_verify and checkpoint_fetch modules (private: the API may change).

A manifest is JSON: {"version": 1, "revision": str|null, "files": [{"path", "size", "sha256"}]}
with POSIX relative paths. A fingerprint records the manifest's digest and every file's size and
mtime after a successful full verification, so a later run that finds the same sizes, mtimes and
manifest can skip re-hashing.
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import hashlib
import json
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.sparkops.appliance.plugins.module_utils._disk import filesystem_space

MANIFEST_VERSION = 1
MANIFEST_NAME = ".sparkops-manifest.json"
FINGERPRINT_NAME = ".sparkops-fingerprint.json"
PART_SUFFIX = ".part"
CHUNK = 8 * 1024 * 1024
GIB = 1 << 30
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
# Never part of a checkpoint: our own metadata, partial transfers, Hugging Face's local cache.
_SKIP_DIRS = (".cache",)


class CheckpointError(Exception):
    """A checkpoint problem with a message fit for the user."""


def fmt_bytes(n):
    if n >= GIB:
        return "%.2f GiB" % (n / GIB)
    if n >= 1 << 20:
        return "%.1f MiB" % (n / (1 << 20))
    return "%d B" % n


def auto_workers(n_files, workers=0):
    """Threads for hashing: one per file up to the CPU count (hashlib releases the GIL)."""
    if workers and workers > 0:
        return max(1, min(workers, max(n_files, 1)))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, max(n_files, 1)))


def safe_join(root, rel):
    """Join a manifest path to root, refusing absolute paths and escapes."""
    if not rel or rel.startswith("/") or "\\" in rel:
        raise CheckpointError("manifest path %r is not a relative POSIX path" % rel)
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise CheckpointError("manifest path %r must not contain empty, '.' or '..' parts" % rel)
    return os.path.join(root, *parts)


def sha256_file(path, chunk=CHUNK, on_bytes=None):
    """Return (size, hex sha256) of a file, read in large chunks into one reused buffer."""
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            size += n
            if on_bytes is not None:
                on_bytes(n)
    return size, h.hexdigest()


def hash_files(root, rel_paths, workers=0, on_bytes=None):
    """Hash files in parallel threads; return {rel: (size, sha256)}. Largest files start first."""
    paths = list(rel_paths)
    if not paths:
        return {}
    sized = sorted(paths, key=lambda r: -os.path.getsize(safe_join(root, r)))
    n = auto_workers(len(sized), workers)
    if n == 1:
        return dict((r, sha256_file(safe_join(root, r), on_bytes=on_bytes)) for r in sized)
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [(r, pool.submit(sha256_file, safe_join(root, r), CHUNK, on_bytes)) for r in sized]
        return dict((r, fut.result()) for r, fut in futures)


def list_files(root, exclude=()):
    """Relative POSIX paths of the regular files under root, without our metadata and partials."""
    skip = set([MANIFEST_NAME, FINGERPRINT_NAME]) | set(exclude)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
            rel_dir = ""
        dirnames.sort()
        for name in filenames:
            rel = (rel_dir.replace(os.sep, "/") + "/" + name) if rel_dir else name
            if rel in skip or name.endswith(PART_SUFFIX):
                continue
            if os.path.isfile(os.path.join(dirpath, name)):
                out.append(rel)
    return sorted(out)


def build_manifest(root, workers=0, revision=None, on_bytes=None):
    rels = list_files(root)
    if not rels:
        raise CheckpointError("no files under %s to build a manifest from" % root)
    hashed = hash_files(root, rels, workers, on_bytes)
    files = [{"path": r, "size": hashed[r][0], "sha256": hashed[r][1]} for r in rels]
    return {"version": MANIFEST_VERSION, "revision": revision, "files": files}


def validate_expected(expected, origin="expected"):
    """Check a list of {path, size, sha256 or None} (what a source such as the Hugging Face Hub says
    a checkpoint holds) and return it normalised, sorted by path."""
    if not isinstance(expected, list) or not expected:
        raise CheckpointError("%s: expected a non-empty list of {path, size, sha256}" % origin)
    seen = set()
    out = [_file_entry(e if isinstance(e, dict) else {}, origin, "%s[%d]: path" % (origin, i), seen, sha_optional=True)
           for i, e in enumerate(expected)]
    return sorted(out, key=lambda x: x["path"])


def _file_entry(entry, origin, path_label, seen, sha_optional=False):
    """One {path, size, sha256} entry of a manifest or an expected list, checked and normalised
    (sha256 lower-case; None only where sha_optional). path_label names the entry's path in the
    message when it is not a string; seen collects the paths, so a path listed twice is refused."""
    rel, size, sha = entry.get("path"), entry.get("size"), entry.get("sha256")
    if not isinstance(rel, str):
        raise CheckpointError("%s must be a string" % path_label)
    safe_join("/", rel)
    if rel in seen:
        raise CheckpointError("%s: %s is listed twice" % (origin, rel))
    seen.add(rel)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise CheckpointError("%s: %s: size must be a non-negative integer, got %r" % (origin, rel, size))
    if sha_optional and sha is None:
        return {"path": rel, "size": size, "sha256": None}
    if not isinstance(sha, str) or not _SHA_RE.match(sha.lower()):
        raise CheckpointError("%s: %s: sha256 must be 64 hex digits%s, got %r" % (origin, rel, " or null" if sha_optional else "", sha))
    return {"path": rel, "size": size, "sha256": sha.lower()}


def build_checked_manifest(root, expected, workers=0, revision=None, on_bytes=None):
    """Build a manifest from exactly the files `expected` lists, each checked first against the
    source's word: present, of the listed size, and of the listed sha256 where one is given.
    Returns (manifest, []) or (None, problems) -- nothing unchecked is ever accepted."""
    problems, hashed = check_entries(root, expected, workers, on_bytes)
    if problems:
        return None, problems
    files = [{"path": e["path"], "size": e["size"], "sha256": hashed[e["path"]][1]} for e in expected]
    return {"version": MANIFEST_VERSION, "revision": revision, "files": files}, []


def compare_with_expected(manifest, expected):
    """Problems where a manifest disagrees with the source's list (no hashing: the manifest's own
    sizes and sha256 against the listed ones)."""
    have = dict((e["path"], e) for e in manifest["files"])
    problems = []
    for e in expected:
        m = have.get(e["path"])
        if m is None:
            problems.append((e["path"], "missing", e["size"], None))
        elif m["size"] != e["size"]:
            problems.append((e["path"], "size", e["size"], m["size"]))
        elif e["sha256"] and m["sha256"] != e["sha256"]:
            problems.append((e["path"], "sha256", e["sha256"], m["sha256"]))
    return problems


def validate_manifest(data, origin="manifest"):
    """Check a parsed manifest and return it normalised; raise CheckpointError naming the problem."""
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise CheckpointError("%s: expected a JSON object with a 'files' list" % origin)
    if data.get("version", MANIFEST_VERSION) != MANIFEST_VERSION:
        raise CheckpointError("%s: unsupported manifest version %r" % (origin, data.get("version")))
    seen = set()
    files = []
    for i, entry in enumerate(data["files"]):
        if not isinstance(entry, dict):
            raise CheckpointError("%s: files[%d] is not an object" % (origin, i))
        files.append(_file_entry(entry, origin, "%s: files[%d].path" % (origin, i), seen))
    if not files:
        raise CheckpointError("%s: the 'files' list is empty" % origin)
    revision = data.get("revision")
    return {"version": MANIFEST_VERSION, "revision": revision, "files": sorted(files, key=lambda e: e["path"])}


def parse_manifest(text, origin="manifest"):
    try:
        data = json.loads(text)
    except ValueError as e:
        raise CheckpointError("%s is not valid JSON: %s" % (origin, e))
    return validate_manifest(data, origin)


def dump_manifest(manifest):
    return json.dumps(manifest, indent=1, sort_keys=True) + "\n"


def manifest_digest(manifest):
    canon = json.dumps(manifest["files"], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def total_bytes(manifest):
    return sum(e["size"] for e in manifest["files"])


def verify_tree(root, manifest, workers=0, on_bytes=None):
    """Compare root to the manifest. Sizes are checked first (cheap), then only files of the right
    size are hashed, in parallel. Returns a list of problems: (path, what, expected, actual)."""
    return check_entries(root, manifest["files"], workers, on_bytes)[0]


def check_entries(root, entries, workers=0, on_bytes=None):
    """Check files under root against entries ({path, size, sha256 or None}): sizes first (cheap),
    then only files of the right size are hashed, in parallel; an entry without a sha256 is
    checked by size only. Returns (problems, hashed): problems as (path, what, expected, actual),
    hashed as hash_files returns it."""
    problems, to_hash = [], []
    for e in entries:
        p = safe_join(root, e["path"])
        if not os.path.isfile(p):
            problems.append((e["path"], "missing", e["size"], None))
            continue
        size = os.path.getsize(p)
        if size != e["size"]:
            problems.append((e["path"], "size", e["size"], size))
        else:
            to_hash.append(e["path"])
    hashed = hash_files(root, to_hash, workers, on_bytes)
    for e in entries:
        if e["sha256"] and e["path"] in hashed and hashed[e["path"]][1] != e["sha256"]:
            problems.append((e["path"], "sha256", e["sha256"], hashed[e["path"]][1]))
    return problems, hashed


def describe_problems(root, problems, limit=10):
    lines = []
    for rel, what, expected, actual in problems[:limit]:
        path = os.path.join(root, rel)
        if what == "missing":
            lines.append("%s: missing (expected %d bytes)" % (path, expected))
        elif what == "size":
            lines.append("%s: size mismatch: expected %d bytes, actual %d" % (path, expected, actual))
        else:
            lines.append("%s: sha256 mismatch: expected %s, actual %s" % (path, expected, actual))
    if len(problems) > limit:
        lines.append("... and %d more" % (len(problems) - limit))
    return "; ".join(lines)


def fingerprint(root, manifest):
    """Sizes and mtimes (ns) of the manifest's files plus the manifest digest; None if a file is gone."""
    files = []
    for e in manifest["files"]:
        try:
            st = os.stat(safe_join(root, e["path"]))
        except OSError:
            return None
        files.append([e["path"], st.st_size, st.st_mtime_ns])
    return {"version": 1, "manifest_sha256": manifest_digest(manifest), "files": files}


def dump_fingerprint(fp):
    return json.dumps(fp, indent=1, sort_keys=True) + "\n"


def intact(root, revision=None):
    """Whether root holds a copy whose fingerprint is the one its last full verification wrote
    (sizes, mtimes and manifest unchanged since), at `revision` when given: what the quick check of
    checkpoint_verify answers, without writing anything. A malformed manifest is not intact."""
    try:
        manifest = read_manifest_at(root)
    except CheckpointError:
        return False
    if manifest is None:
        return False
    if revision and manifest.get("revision") and manifest["revision"] != revision:
        return False
    fp_before = read_text(os.path.join(root, FINGERPRINT_NAME)) or ""
    fp_now = fingerprint(root, manifest)
    return bool(fp_before) and fp_now is not None and dump_fingerprint(fp_now) == fp_before


def read_manifest_at(root):
    """The manifest in root, parsed, or None when root has none (a malformed one raises)."""
    path = os.path.join(root, MANIFEST_NAME)
    text = read_text(path)
    return parse_manifest(text, path) if text is not None else None


def vouched(root, manifest=None):
    """{path: sha256} of the files of root that its last full verification vouches for: listed in its
    manifest, and the fingerprint written after that verification names the same manifest and the
    file's current size and mtime. Nothing else is vouched for (no manifest, no or another
    fingerprint, a file written since)."""
    try:
        manifest = manifest if manifest is not None else read_manifest_at(root)
    except CheckpointError:
        return {}
    if manifest is None:
        return {}
    try:
        fp = json.loads(read_text(os.path.join(root, FINGERPRINT_NAME)) or "null")
    except ValueError:
        return {}
    if not isinstance(fp, dict) or fp.get("manifest_sha256") != manifest_digest(manifest):
        return {}
    recorded = dict((f[0], (f[1], f[2])) for f in fp.get("files") or [] if isinstance(f, list) and len(f) == 3)
    out = {}
    for e in manifest["files"]:
        try:
            st = os.stat(safe_join(root, e["path"]))
        except OSError:
            continue
        if st.st_size == e["size"] and recorded.get(e["path"]) == (st.st_size, st.st_mtime_ns):
            out[e["path"]] = e["sha256"]
    return out


def known_sha256(root, entries, workers=0, on_bytes=None):
    """{path: sha256} for the entries (those with a sha256) of which root holds a file of the entry's
    size: from root's last verification where it vouches for the file, else hashed here. A file of
    another size is left out (it is not the entry's file, whatever its bytes)."""
    vouch = vouched(root)
    out, to_hash = {}, []
    for e in entries:
        if not e.get("sha256"):
            continue
        p = safe_join(root, e["path"])
        if not os.path.isfile(p) or os.path.getsize(p) != e["size"]:
            continue
        if e["path"] in vouch:
            out[e["path"]] = vouch[e["path"]]
        else:
            to_hash.append(e["path"])
    for rel, (_size, sha) in hash_files(root, to_hash, workers, on_bytes).items():
        out[rel] = sha
    return out


def plan_dest(dest, entries, reuse_root=None, workers=0, on_bytes=None):
    """What dest needs to hold the entries ({path, size, sha256 or None}), never judged by size
    alone: returns (good, stale, reuse).

    good: the entries whose file dest already holds (the entry's size and sha256, the sha256 known
    from dest's last verification or hashed here; an entry without a sha256 is not judged).
    stale: paths of files dest holds that are not the entry's (longer, or of the entry's size and
    another sha256): to be removed before anything is fetched.
    reuse: the entries, not good in dest, that reuse_root (the copy being served) holds: listed in
    its manifest with the same size and sha256, and its file of that size vouched for by its last
    verification or hashed here and found equal."""
    checkable = [e for e in entries if e.get("sha256")]
    have = known_sha256(dest, checkable, workers, on_bytes)
    good, stale, rest = [], [], []
    for e in checkable:
        p = safe_join(dest, e["path"])
        if have.get(e["path"]) == e["sha256"]:
            good.append(e)
            continue
        # A shorter file may be a transfer cut short (rsync --append-verify resumes it and checks
        # the whole file); a longer one, or one of the right size with another sha256, is not it.
        if os.path.isfile(p) and os.path.getsize(p) >= e["size"]:
            stale.append(e["path"])
        rest.append(e)
    reuse = []
    if reuse_root and rest and os.path.isdir(reuse_root):
        try:
            old = read_manifest_at(reuse_root)
        except CheckpointError:
            old = None
        listed = dict((e["path"], e) for e in (old or {"files": []})["files"])
        candidates = [e for e in rest if e["path"] in listed and listed[e["path"]]["size"] == e["size"]
                      and listed[e["path"]]["sha256"] == e["sha256"]]
        held = known_sha256(reuse_root, candidates, workers, on_bytes) if candidates else {}
        reuse = [e for e in candidates if held.get(e["path"]) == e["sha256"]]
    return good, stale, reuse


def link_or_copy(src, dest):
    """Put src's file at dest: a hard link (no bytes written, the inode shared: nothing here ever
    writes into a file in place, every write goes to a new file renamed over the old name), or a
    copy where the file system refuses a link; through <dest>.part and a rename either way.
    Returns "link" or "copy"."""
    part = dest + PART_SUFFIX
    d = os.path.dirname(dest)
    if not os.path.isdir(d):
        os.makedirs(d)
    if os.path.lexists(part):
        os.unlink(part)
    how = "link"
    try:
        os.link(src, part)
    except OSError:
        import shutil
        shutil.copyfile(src, part)
        how = "copy"
    os.replace(part, dest)
    return how


def read_text(path):
    try:
        with open(path, "r") as f:
            return f.read()
    except (IOError, OSError):
        return None


def _replace_progress(path, text):
    """Rewrite the progress file through a temp file and a rename. Not module.atomic_move: this runs
    about once a second inside a transfer, on a status file in /run that is no managed
    configuration (no owner, mode or SELinux context to keep), and it must never fail the transfer."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Progress(object):
    """Bytes done / total, written (atomically, at most every `interval` s) to a JSON file that a
    polling task can read while the transfer runs, e.g. {"done":..,"total":..,"text":"1.0 GiB of ..."}."""

    def __init__(self, path, total, interval=1.0, clock=time.monotonic):
        self.path = path
        self.total = total
        self.done = 0
        self.file = None
        self.interval = interval
        self.clock = clock
        self.start = clock()
        self._last = None
        self.state = "running"

    def text(self):
        pct = (100.0 * self.done / self.total) if self.total else 100.0
        el = max(self.clock() - self.start, 1e-9)
        rate = self.done / el
        s = "%s of %s (%.1f%%), %s/s" % (fmt_bytes(self.done), fmt_bytes(self.total), pct, fmt_bytes(rate))
        if self.file and self.state == "running":
            s += ", now %s" % self.file
        if self.state != "running":
            s += ", " + self.state
        return s

    def write(self, force=False):
        if not self.path:
            return
        now = self.clock()
        if not force and self._last is not None and now - self._last < self.interval:
            return
        self._last = now
        data = {"done": self.done, "total": self.total, "file": self.file, "state": self.state,
                "text": self.text()}
        try:
            _replace_progress(self.path, json.dumps(data) + "\n")
        except (IOError, OSError):
            pass  # progress is best effort; never fail a transfer because of it

    def add(self, n):
        self.done += n
        self.write()

    def finish(self, state="done"):
        self.state = state
        self.write(force=True)


def free_space_check(dest, need_bytes, reserve_bytes):
    """Return (ok, free, nearest existing ancestor of dest)."""
    free, _total, probe = filesystem_space(dest)
    return free >= need_bytes + reserve_bytes, free, probe


# --- sources -----------------------------------------------------------------------------------

class FileSource(object):
    """A local or NFS directory."""

    def __init__(self, root):
        self.root = root

    def describe(self, rel):
        return os.path.join(self.root, rel)

    def open(self, rel, offset):
        """Return (stream, start): the stream yields bytes from `start` (offset when it can seek)."""
        path = safe_join(self.root, rel)
        if not os.path.isfile(path):
            raise CheckpointError("%s is listed in the manifest but missing in the source" % path)
        f = open(path, "rb")
        f.seek(offset)
        return f, offset


MAX_REDIRECTS = 10
REDIRECT_CODES = (301, 302, 303, 307, 308)
# Dropped, with every header the caller gave (checkpoint_http_headers: any of them may be a
# credential, e.g. X-Api-Key or Private-Token), when a redirect leaves the origin.
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")


def _origin(url):
    from ansible.module_utils.six.moves.urllib.parse import urlsplit
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


def same_origin(old, new):
    """True when new has the scheme, host and port of old: only then do credentials follow a
    redirect (another host, another port, https -> http or http -> https drop them, as requests
    drops Authorization)."""
    return _origin(old) == _origin(new)


def check_url(url, allow_http, what="the URL"):
    """Refuse anything but https:// (http:// only with allow_http)."""
    scheme = _origin(url)[0]
    if scheme == "https" or (scheme == "http" and allow_http):
        return
    if scheme == "http":
        raise CheckpointError("%s %s is plain http:// (no TLS: its bytes and any credential can be read and changed on the way); "
                              "use https://, or set checkpoint_allow_http: true (the module's allow_http) for a trusted network"
                              % (what, url))
    raise CheckpointError("%s %s is not an http(s):// URL" % (what, url))


def check_redirect(old, new, allow_http):
    """A redirect from old to new may be followed (new is https, or http with allow_http)."""
    check_url(new, allow_http, "%s redirects to" % old)


class HttpSource(object):
    """An HTTP(S) base URL; resumes with Range requests (falls back to a full GET on 200).

    Redirects are followed here (at most MAX_REDIRECTS), not by urllib, which copies every header
    to wherever it is sent: on a redirect to another scheme, host or port the caller's headers and
    Authorization, Proxy-Authorization and Cookie are dropped for the rest of the chain; a redirect
    to http:// is refused unless allow_http."""

    def __init__(self, base_url, headers=None, timeout=60, validate_certs=True, allow_http=False):
        check_url(base_url, allow_http, "the source")
        self.base = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.validate_certs = validate_certs
        self.allow_http = allow_http

    def url(self, rel):
        from ansible.module_utils.six.moves.urllib.parse import quote
        return self.base + "/" + quote(rel)

    def describe(self, rel):
        return self.url(rel)

    def get(self, url, offset=0):
        from ansible.module_utils.urls import open_url
        from ansible.module_utils.six.moves.urllib.error import HTTPError
        from ansible.module_utils.six.moves.urllib.parse import urljoin
        check_url(url, self.allow_http)
        headers = dict(self.headers)
        if offset:
            headers["Range"] = "bytes=%d-" % offset
        drop = set(CREDENTIAL_HEADERS) | set(k.lower() for k in self.headers)
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                return open_url(url, headers=headers, timeout=self.timeout, validate_certs=self.validate_certs,
                                follow_redirects="none")
            except HTTPError as e:
                location = e.headers.get("Location") if e.code in REDIRECT_CODES and e.headers is not None else None
                if not location:
                    raise
                e.close()
                new = urljoin(url, location.strip())
                check_redirect(url, new, self.allow_http)
                if not same_origin(url, new):
                    headers = dict((k, v) for k, v in headers.items() if k.lower() not in drop)
                url = new
        raise CheckpointError("more than %d redirects, the last to %s" % (MAX_REDIRECTS, url))

    def open(self, rel, offset):
        from ansible.module_utils.six.moves.urllib.error import HTTPError
        try:
            resp = self.get(self.url(rel), offset)
        except HTTPError as e:
            if e.code in (408, 429) or e.code >= 500:
                raise ConnectionError("HTTP %d from %s" % (e.code, self.url(rel)))
            raise CheckpointError("HTTP %d %s from %s" % (e.code, e.reason, self.url(rel)))
        status = resp.getcode()
        if offset and status == 206:
            cr = resp.headers.get("Content-Range", "")
            m = re.match(r"bytes (\d+)-", cr)
            if not m or int(m.group(1)) != offset:
                resp.close()
                raise CheckpointError("%s: bad Content-Range %r for a request from byte %d" % (self.url(rel), cr, offset))
            return resp, offset
        return resp, 0

    def read_text(self, url):
        resp = self.get(url)
        try:
            return resp.read().decode("utf-8")
        finally:
            resp.close()


def _interruptions():
    import http.client
    errs = [socket.timeout, socket.error, ConnectionError, http.client.HTTPException, OSError]
    try:
        from ansible.module_utils.six.moves.urllib.error import URLError
        errs.insert(0, URLError)
    except ImportError:
        pass
    return tuple(errs)


def fetch_file(source, rel, dest_root, size, sha256, progress=None, retries=3, retry_delay=1.0,
               sleep=time.sleep):
    """Transfer one file into <dest>.part, resuming from what the .part holds, then rename it into
    place when size and sha256 match. The existing .part is hashed from disk, not fetched again.
    Returns the number of bytes transferred from the source."""
    dest = safe_join(dest_root, rel)
    part = dest + PART_SUFFIX
    d = os.path.dirname(dest)
    if not os.path.isdir(d):
        os.makedirs(d)
    transferred = 0
    attempt = 0
    interrupts = _interruptions()
    if progress is not None:
        progress.file = rel
    counted = 0  # bytes of this file already counted in progress
    while True:
        h = hashlib.sha256()
        have = os.path.getsize(part) if os.path.exists(part) else 0
        if have > size:
            os.unlink(part)
            have = 0
        if have:
            # hash what we already hold (read from local disk, not from the source)
            with open(part, "rb") as f:
                while True:
                    b = f.read(CHUNK)
                    if not b:
                        break
                    h.update(b)
        if progress is not None and have > counted:
            progress.add(have - counted)
            counted = have
        try:
            if have < size:
                stream, start = source.open(rel, have)
                try:
                    if start != have:  # the source ignored the Range request: start over
                        h = hashlib.sha256()
                        if progress is not None:
                            progress.done -= counted
                            counted = 0
                        have = 0
                    with open(part, "r+b" if have else "wb") as out:
                        out.seek(have)
                        out.truncate()
                        while have < size:
                            b = stream.read(min(CHUNK, size - have))
                            if not b:
                                break
                            out.write(b)
                            h.update(b)
                            have += len(b)
                            transferred += len(b)
                            counted += len(b)
                            if progress is not None:
                                progress.add(len(b))
                        out.flush()
                        os.fsync(out.fileno())
                finally:
                    stream.close()
                if have < size:
                    raise ConnectionError("the source closed after %d of %d bytes" % (have, size))
        except CheckpointError:
            raise
        except interrupts as e:
            attempt += 1
            if attempt > retries:
                raise CheckpointError(
                    "transfer of %s interrupted at %d of %d bytes after %d attempt(s) (%s); the "
                    "bytes so far are kept in %s: run again to resume" % (
                        source.describe(rel), have, size, attempt, e, part))
            sleep(retry_delay)
            continue
        actual = h.hexdigest()
        if actual != sha256:
            os.unlink(part)
            raise CheckpointError("%s: sha256 mismatch after transfer from %s: expected %s, actual %s "
                                  "(the partial file was removed)" % (dest, source.describe(rel), sha256, actual))
        if not os.path.exists(part):  # an empty file: nothing was written
            open(part, "wb").close()
        os.replace(part, dest)
        return transferred
