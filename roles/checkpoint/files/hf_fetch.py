# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan or download a pinned Hugging Face snapshot into a directory (run in the role's venv).

  hf_fetch.py plan     --repo R --revision SHA [--allow-pattern P ...]
      prints {"total_bytes": N, "files": n, "revision": SHA} (sizes from the Hub's file metadata)
  hf_fetch.py download --repo R --revision SHA --local-dir D [--progress-file F] [--allow-pattern P ...]
      snapshot_download (resumes its own partial files), writing bytes done / total to F

The token comes from the environment (HF_TOKEN), never from the command line, so it does not
show in `ps` or in Ansible's registered command.
"""
import argparse
import fnmatch
import json
import os
import sys
import threading
import time

GIB = 1 << 30


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["plan", "download"])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--revision", required=True)
    ap.add_argument("--local-dir")
    ap.add_argument("--allow-pattern", action="append", default=[])
    ap.add_argument("--progress-file")
    a = ap.parse_args(argv)
    if a.action == "download" and not a.local_dir:
        ap.error("download needs --local-dir")
    return a


def token():
    return os.environ.get("HF_TOKEN") or None


def plan(a):
    from huggingface_hub import HfApi
    info = HfApi().model_info(a.repo, revision=a.revision, files_metadata=True, token=token())
    files = [s for s in info.siblings
             if not a.allow_pattern or any(fnmatch.fnmatch(s.rfilename, p) for p in a.allow_pattern)]
    return {"total_bytes": sum(s.size or 0 for s in files), "files": len(files), "revision": info.sha}


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
        done = dir_bytes(root)
        rate = done / max(time.monotonic() - start, 1e-9)
        state = "done" if stop.is_set() else "running"
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
                                 allow_patterns=a.allow_pattern or None, token=token())
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
