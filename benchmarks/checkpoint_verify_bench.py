"""Checkpoint verification throughput: the collection's parallel sha256 vs `sha256sum`.

Generates SHARDS files of TOTAL bytes in a scratch directory (deleted at the end), warms the page
cache with one read, then times, in the same run and alternating, `sha256sum` over all shards
(one process, the usual baseline; also `xargs -P<threads> sha256sum` for reference) and module_utils._checkpoint.verify_tree (threads, one per shard
up to the CPU count). Both read the same cached files, so this compares hashing, not the disk.
Checks that both produce the same digests. Prints throughput and the ratio (target >= 1.0).

  python benchmarks/checkpoint_verify_bench.py --total-gib 4 --shards 8 [--dir /var/tmp] [--rounds 2]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".collections"))

from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402

GIB = 1 << 30


def generate(root, total, shards):
    """Incompressible-looking data, cheap to make: a 64 MiB random block, each copy made distinct."""
    block = os.urandom(64 << 20)
    per = total // shards
    names = []
    for i in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        with open(os.path.join(root, name), "wb") as f:
            left = per
            n = 0
            while left > 0:
                chunk = block[: min(len(block), left)]
                f.write(i.to_bytes(4, "little") + n.to_bytes(4, "little") + chunk[8:])
                left -= len(chunk)
                n += 1
        names.append(name)
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-gib", type=float, default=4.0)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--dir", default=None, help="scratch parent directory (default: TMPDIR)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=0)
    a = ap.parse_args()
    total = int(a.total_gib * GIB)
    parent = a.dir or tempfile.gettempdir()
    st = os.statvfs(parent)
    if st.f_bavail * st.f_frsize < total + GIB:
        sys.exit("not enough free space in %s for %.1f GiB of shards" % (parent, a.total_gib))
    root = tempfile.mkdtemp(prefix="ckpt-bench-", dir=parent)
    try:
        t0 = time.monotonic()
        names = generate(root, total, a.shards)
        size = sum(os.path.getsize(os.path.join(root, n)) for n in names)
        print("generated %d shards, %.2f GiB, in %.1f s (%s)" % (len(names), size / GIB, time.monotonic() - t0, root))
        for n in names:  # warm the page cache once for both contenders
            with open(os.path.join(root, n), "rb") as f:
                while f.read(64 << 20):
                    pass
        workers = ck.auto_workers(len(names), a.workers)
        print("cpus usable: %d, hashing threads: %d" % (ck.auto_workers(10 ** 6), workers))
        base_t, ours_t, xargs_t = [], [], []
        manifest = None
        for r in range(a.rounds):
            t = time.monotonic()
            out = subprocess.run(["sha256sum"] + names, cwd=root, check=True, capture_output=True, text=True).stdout
            base_t.append(time.monotonic() - t)
            sums = dict((line.split()[1], line.split()[0]) for line in out.splitlines())
            if manifest is None:
                manifest = {"version": 1, "revision": None, "files": sorted(
                    ({"path": n, "size": os.path.getsize(os.path.join(root, n)), "sha256": sums[n]} for n in names),
                    key=lambda e: e["path"])}
            t = time.monotonic()
            subprocess.run("printf '%%s\\0' %s | xargs -0 -n1 -P%d sha256sum >/dev/null" % (" ".join(names), workers),
                           shell=True, cwd=root, check=True)
            xargs_t.append(time.monotonic() - t)
            t = time.monotonic()
            problems = ck.verify_tree(root, manifest, a.workers)
            ours_t.append(time.monotonic() - t)
            if problems:
                sys.exit("digests differ from sha256sum: %r" % problems[:3])
            print("round %d: sha256sum %.2f s (%.0f MiB/s) | xargs -P%d sha256sum %.2f s (%.0f MiB/s) | "
                  "parallel verify %.2f s (%.0f MiB/s)" % (
                      r + 1, base_t[-1], size / base_t[-1] / 2 ** 20, workers, xargs_t[-1],
                      size / xargs_t[-1] / 2 ** 20, ours_t[-1], size / ours_t[-1] / 2 ** 20))
        b, o = min(base_t), min(ours_t)
        x = min(xargs_t)
        print("best: sha256sum %.0f MiB/s, xargs -P%d sha256sum %.0f MiB/s, parallel verify %.0f MiB/s" % (
            size / b / 2 ** 20, workers, size / x / 2 ** 20, size / o / 2 ** 20))
        print("ratio vs sha256sum: %.2fx, vs xargs -P%d sha256sum: %.2fx (target >= 1.0; digests equal)" % (
            b / o, workers, x / o))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
