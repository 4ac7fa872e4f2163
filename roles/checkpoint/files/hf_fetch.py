# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan or download a pinned Hugging Face snapshot into a directory (run in the role's venv).

  hf_fetch.py plan     --repo R --revision SHA [--endpoint URL] [--token-file F] [--allow-pattern P ...]
      prints {"total_bytes": N, "files": n, "revision": SHA, "expected": [{"path", "size", "sha256"}]}
      from the Hub's own file list (GET <endpoint>/api/models/R/tree/SHA?recursive=true, every page):
      "sha256" is the Hub's lfs.oid for an LFS file (the sha256 of its content), null for a file
      kept in git (only its size is known). The role verifies the download against this list
      before it writes the manifest.
  hf_fetch.py download --repo R --revision SHA --local-dir D [--endpoint URL] [--token-file F]
                       [--progress-file F] [--allow-pattern P ...]
      snapshot_download (resumes its own partial files), writing bytes done / total to F

With --token-file the token is read from that file (the role writes it 0600 to /run and removes
it afterwards): it is never on a command line (`ps`) nor in an environment (/proc/PID/environ).
"""
import argparse
import fnmatch
import json
import os
import re
import sys
import threading
import time
import urllib.parse
import urllib.request

GIB = 1 << 30
HUB = "https://huggingface.co"


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["plan", "download"])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--revision", required=True)
    ap.add_argument("--endpoint", default=HUB)
    ap.add_argument("--token-file")
    ap.add_argument("--local-dir")
    ap.add_argument("--allow-pattern", action="append", default=[])
    ap.add_argument("--progress-file")
    a = ap.parse_args(argv)
    if a.action == "download" and not a.local_dir:
        ap.error("download needs --local-dir")
    a.endpoint = a.endpoint.rstrip("/")
    a.token = None
    if a.token_file:
        with open(a.token_file) as f:
            a.token = f.read().strip() or None
    return a


def allowed(path, patterns):
    return not patterns or any(fnmatch.fnmatch(path, p) for p in patterns)


def hub_tree(a):
    """Every file entry of the Hub's tree of the pinned revision, following the Link pagination."""
    url = "%s/api/models/%s/tree/%s?recursive=true" % (a.endpoint, a.repo, urllib.parse.quote(a.revision, safe=""))
    entries = []
    while url:
        req = urllib.request.Request(url, headers={"Authorization": "Bearer " + a.token} if a.token else {})
        with urllib.request.urlopen(req, timeout=60) as resp:  # nosec B310 - the endpoint is https or a configured mirror
            entries.extend(json.loads(resp.read().decode("utf-8")))
            nxt = re.search(r'<([^>]+)>;\s*rel="next"', resp.headers.get("Link", "") or "")
        url = nxt.group(1) if nxt else None
    return [e for e in entries if e.get("type") == "file"]


def plan(a):
    expected = []
    for e in hub_tree(a):
        if not allowed(e["path"], a.allow_pattern):
            continue
        lfs = e.get("lfs") or None
        expected.append({"path": e["path"], "size": int(lfs["size"] if lfs else e["size"]),
                         "sha256": lfs["oid"].lower() if lfs else None})
    expected.sort(key=lambda x: x["path"])
    return {"total_bytes": sum(x["size"] for x in expected), "files": len(expected), "revision": a.revision,
            "expected": expected}


def dir_bytes(root):
    n = 0
    for dirpath, _d, names in os.walk(root):
        for name in names:
            try:
                n += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass
    return n


def progress_loop(path, root, total, stop):
    start = time.monotonic()
    while True:
        # Whether the download ended is read BEFORE the folder is measured: read after, a download
        # that ends during the measurement would be recorded as done with the bytes of before.
        finished = stop.is_set()
        done = dir_bytes(root)
        rate = done / max(time.monotonic() - start, 1e-9)
        state = "done" if finished else "running"
        text = "%.2f GiB of %.2f GiB (%.1f%%), %.1f MiB/s%s" % (
            done / GIB, total / GIB, 100.0 * done / total if total else 100.0, rate / (1 << 20),
            "" if state == "running" else ", " + state)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"done": done, "total": total, "file": None, "state": state, "text": text}, f)
        os.replace(tmp, path)
        if stop.wait(2.0) and state == "done":
            return


def download(a):
    from huggingface_hub import snapshot_download
    stop = threading.Event()
    t = None
    if a.progress_file:
        total = plan(a)["total_bytes"]
        t = threading.Thread(target=progress_loop, args=(a.progress_file, a.local_dir, total, stop), daemon=True)
        t.start()
    try:
        path = snapshot_download(repo_id=a.repo, revision=a.revision, local_dir=a.local_dir,
                                 allow_patterns=a.allow_pattern or None, token=a.token, endpoint=a.endpoint)
    finally:
        stop.set()
        if t is not None:
            t.join(10)
    return {"path": path, "revision": a.revision}


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    out = plan(a) if a.action == "plan" else download(a)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
