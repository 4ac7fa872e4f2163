"""Benchmark of sparkops.appliance.ple_pack: pack throughput vs cp, and peak RSS of the pack.

Generates a synthetic safetensors checkpoint of a chosen size (several shards, PLE tables and
ordinary tensors), then, in the same run and on the same disk:

  * cp      `cp --reflink=never` of every shard into a scratch directory, plus fsync of the
            copies (the pack fsyncs its file before the rename, so cp gets the same durability);
  * pack    the module's pack() in a child process (the bytes of the PLE tables, with the
            chunked sha256 digest of every table computed for the index, its chunks on all
            cores), peak RSS read from wait4's rusage;
  * sha256  one thread hashing the PLE bytes, the bound of a pack on few cores.

Throughput is bytes moved per second: the pack moves the PLE bytes, cp moves the shard bytes.
Before each timed run the page cache of the benchmark's own files is dropped
(posix_fadvise DONTNEED after fsync), so both read from the disk; --warm keeps them cached.

Targets (the PLE pack of SPEC §5): pack >= 0.8 x cp; peak RSS of the pack < 256 MiB whatever the size.

Usage: python benchmarks/ple_pack_bench.py --size-gib 4 [--shards 4] [--dir /var/tmp]
       (--dir /dev/shm: tmpfs, where no disk bounds either side)
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, ".collections")
GIB = float(1 << 30)
MIB = float(1 << 20)
BLOCK = 64 * 1024 * 1024

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.sparkops.appliance.plugins.modules import ple_pack
t0 = time.perf_counter()
res = ple_pack.pack(sys.argv[2], sys.argv[3], alignment=int(sys.argv[4]),
                    name_patterns=["embed_tokens_per_layer"])
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "ple_bytes": res["ple_bytes"], "copy_method": res["copy_method"],
                  "tables": len(res["tables"])}))
"""


def write_shard(path, tensors, payload):
    """tensors: list of (name, dtype, shape, nbytes). Writes header + data from a random block."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        left = offset
        turn = 0
        while left:
            n = min(left, len(payload))
            # rotate the block so that no two chunks are equal
            start = (turn * 4093) % len(payload)
            chunk = (payload[start:] + payload[:start])[:n]
            f.write(chunk)
            left -= n
            turn += 1
        f.flush()
        os.fsync(f.fileno())
    return offset


def generate(directory, size_bytes, shards, ple_fraction, ple_tables):
    """A checkpoint of about size_bytes: ple_tables BF16 PLE tables, the rest ordinary tensors."""
    os.makedirs(directory)
    payload = os.urandom(BLOCK)
    hidden = 2048  # row width of the synthetic tables (BF16 -> 4 KiB rows)
    row = hidden * 2
    ple_total = int(size_bytes * ple_fraction) // (ple_tables * row) * (ple_tables * row)
    other_total = size_bytes - ple_total
    per_shard_other = other_total // shards // row * row
    ple_rows = ple_total // ple_tables // row
    layout = [[] for dummy in range(shards)]
    for t in range(ple_tables):  # spread the PLE tables over the shards
        name = "model.group%d.embed_tokens_per_layer.weight" % t if t else \
            "model.language_model.embed_tokens_per_layer.weight"
        layout[t % shards].append((name, "BF16", [ple_rows, hidden], ple_rows * row))
    for s in range(shards):
        rows = per_shard_other // row
        n_t = 4
        for k in range(n_t):
            r = rows // n_t if k < n_t - 1 else rows - (rows // n_t) * (n_t - 1)
            dtype, width = ("F32", hidden // 2) if k % 2 else ("BF16", hidden)
            layout[s].insert(k, ("model.layers.%d.block%d.weight" % (s, k), dtype, [r, width], r * row))
    total = 0
    for s, tensors in enumerate(layout):
        path = os.path.join(directory, "model-%05d-of-%05d.safetensors" % (s + 1, shards))
        total += write_shard(path, tensors, payload)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump({"model_type": "synthetic-ple"}, f)
    return total, ple_rows * row * ple_tables


def drop_cache(paths):
    for path in paths:
        if not os.path.isfile(path):
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def shard_paths(directory):
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".safetensors"))


def run_cp(src_dir, scratch):
    if os.path.isdir(scratch):
        shutil.rmtree(scratch)
    os.makedirs(scratch)
    shards = shard_paths(src_dir)
    t0 = time.perf_counter()
    subprocess.run(["cp", "--reflink=never"] + shards + [scratch], check=True)
    for f in os.listdir(scratch):
        fd = os.open(os.path.join(scratch, f), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    dt = time.perf_counter() - t0
    copied = sum(os.path.getsize(os.path.join(scratch, f)) for f in os.listdir(scratch))
    shutil.rmtree(scratch)
    return dt, copied


def run_pack_rss(src_dir, dest, alignment):
    """Start the child and reap it with wait4 ourselves (subprocess would reap it first)."""
    if os.path.exists(dest):
        os.unlink(dest)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: exec the pack with stdout on the pipe
        os.close(rfd)
        os.dup2(wfd, 1)
        os.execv(sys.executable, [sys.executable, "-c", CHILD, COLLECTIONS, src_dir, dest, str(alignment)])
    os.close(wfd)
    chunks = []
    while True:
        data = os.read(rfd, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(rfd)
    status, usage = os.wait4(pid, 0)[1:]
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit("pack failed with status %d" % os.waitstatus_to_exitcode(status))
    res = json.loads(b"".join(chunks).decode().strip().splitlines()[-1])
    res["maxrss_mib"] = usage.ru_maxrss / 1024.0  # KiB on Linux
    os.unlink(dest)
    return res


def hash_speed(src_dir, limit_bytes):
    """Single-thread sha256 throughput over the first limit_bytes of the shards (from cache)."""
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    done = 0
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for path in shard_paths(src_dir):
        with open(path, "rb", buffering=0) as f:
            while done < limit_bytes:
                n = f.readinto(buf)
                if not n:
                    break
                h.update(view[:n])
                done += n
    return done / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--size-gib", type=float, default=4.0, help="checkpoint size (default 4)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--ple-fraction", type=float, default=0.75, help="share of PLE bytes (0.75)")
    ap.add_argument("--ple-tables", type=int, default=2)
    ap.add_argument("--alignment", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=2, help="timed rounds (cp and pack alternate)")
    ap.add_argument("--dir", default="/var/tmp", help="where the synthetic data goes (same disk for all)")
    ap.add_argument("--warm", action="store_true", help="keep the source in the page cache")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic checkpoint")
    args = ap.parse_args()

    size = int(args.size_gib * GIB)
    st = os.statvfs(args.dir)
    free = st.f_bavail * st.f_frsize
    need = int(size * (2 + args.ple_fraction) + 2 * GIB)  # source + cp copy + pack + margin
    print("disk: %s free %.1f GiB, this run needs %.1f GiB" % (args.dir, free / GIB, need / GIB))
    if free < need:
        raise SystemExit("not enough free disk in %s" % args.dir)

    work = tempfile.mkdtemp(prefix="ple-bench-", dir=args.dir)
    src = os.path.join(work, "ckpt")
    dest = os.path.join(work, "out.ple")
    scratch = os.path.join(work, "cp")
    try:
        t0 = time.perf_counter()
        total, ple_bytes = generate(src, size, args.shards, args.ple_fraction, args.ple_tables)
        print("generated %d shards, %.2f GiB (PLE %.2f GiB in %d tables) in %.1f s"
              % (args.shards, total / GIB, ple_bytes / GIB, args.ple_tables, time.perf_counter() - t0))
        print("cpus: %d, page cache: %s, load average at start: %.2f %.2f %.2f"
              % ((os.cpu_count(), "warm" if args.warm else "dropped before each run") + os.getloadavg()))
        cp_rates, pack_rates, rss, methods = [], [], [], set()
        for i in range(args.repeat):
            if not args.warm:
                drop_cache(shard_paths(src))
            dt, copied = run_cp(src, scratch)
            cp_rates.append(copied / dt)
            print("round %d  cp   %.2f GiB in %6.2f s = %.3f GiB/s" % (i + 1, copied / GIB, dt, copied / dt / GIB))
            if not args.warm:
                drop_cache(shard_paths(src))
            res = run_pack_rss(src, dest, args.alignment)
            rate = res["ple_bytes"] / res["seconds"]
            pack_rates.append(rate)
            rss.append(res["maxrss_mib"])
            methods.add(res["copy_method"])
            print("round %d  pack %.2f GiB in %6.2f s = %.3f GiB/s  (peak RSS %.1f MiB, %s, %d tables)"
                  % (i + 1, res["ple_bytes"] / GIB, res["seconds"], rate / GIB, res["maxrss_mib"],
                     res["copy_method"], res["tables"]))
        hs = hash_speed(src, min(ple_bytes, int(GIB)))
        cp_rate = statistics.median(cp_rates)
        pack_rate = statistics.median(pack_rates)
        ratio = pack_rate / cp_rate
        peak = max(rss)
        print("")
        print("cp    median %.3f GiB/s" % (cp_rate / GIB))
        print("pack  median %.3f GiB/s (copy + sha256 of every table, fsync, rename)" % (pack_rate / GIB))
        print("sha256 one thread %.3f GiB/s (reading the shards)" % (hs / GIB))
        print("ratio pack/cp = %.2f  target >= 0.80: %s" % (ratio, "PASS" if ratio >= 0.8 else "FAIL"))
        print("peak RSS of the pack = %.1f MiB  target < 256 MiB: %s" % (peak, "PASS" if peak < 256 else "FAIL"))
        print("load average at the end: %.2f %.2f %.2f (the machine's other work competes for the cores)" % os.getloadavg())
    finally:
        if args.keep:
            print("kept %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
