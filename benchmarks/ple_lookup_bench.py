# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark of the PLE lookup: rows read from the mmap'd packed file vs an in-memory table.

Writes a checkpoint holding one BF16 per-layer embedding table (safetensors library), packs it
with sparkops.appliance.ple_pack, finds the table with the runtime plugin's own reader
(roles/runtime_image/files/sparkops_vllm_ple/sparkops_vllm_ple/pack.py), and then, in one run,
gathers the rows of random token ids (batches of --batch tokens, ids uniform over the vocabulary,
the same ids for every path) three ways:

  * memory  the table as an ordinary in-memory array (what stock vLLM holds, here in host memory);
  * warm    the mmap'd pack with its pages in the page cache (after one full read);
  * cold    the mmap'd pack after madvise(MADV_DONTNEED) of the mapping and posix_fadvise(DONTNEED)
            of the file before every batch (no root needed; a page still mapped is not dropped by
            fadvise alone), so the rows come from the disk again; MADV_RANDOM like the plugin.

The gather is numpy `take` on the mapping (the plugin does torch `index_select` on
torch.frombuffer of the same mapping: no torch on this host). Reported: ns per token per path
and the ratios warm/memory and cold/memory. Performance is this script's business, not a test's.

Usage: python benchmarks/ple_lookup_bench.py [--vocab 32768] [--cols 8960] [--batch 256]
       [--batches 200] [--dir /var/tmp]
"""

import argparse
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from safetensors import TensorSpec, serialize_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".collections"))
sys.path.insert(0, os.path.join(ROOT, "roles", "runtime_image", "files", "sparkops_vllm_ple"))
from ansible_collections.sparkops.appliance.plugins.modules import ple_pack  # noqa: E402  pylint: disable=wrong-import-position
from sparkops_vllm_ple import pack as ple_reader  # noqa: E402  pylint: disable=wrong-import-position

NAME = "model.language_model.embed_tokens_per_layer.weight"


def write_checkpoint(directory, vocab, cols, seed):
    rng = np.random.default_rng(seed)
    table = rng.integers(0, 1 << 16, size=(vocab, cols), dtype=np.uint16)
    other = rng.integers(0, 1 << 16, size=(64, 64), dtype=np.uint16)
    specs = {
        NAME: TensorSpec(dtype="bfloat16", shape=[vocab, cols], data_ptr=table.ctypes.data, data_len=table.nbytes),
        "model.language_model.norm.weight": TensorSpec(dtype="bfloat16", shape=[64, 64], data_ptr=other.ctypes.data,
                                                       data_len=other.nbytes),
    }
    os.makedirs(directory)
    serialize_file(specs, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return table


def drop_cache(path, mapping):
    """Evict the file's pages: unmap them from this process first (fadvise keeps mapped pages)."""
    mapping.madvise(mmap.MADV_DONTNEED)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def time_batches(gather, batches, before=None):
    """ns per token of gather(ids) over the batches (before() runs untimed before each one)."""
    per_token = []
    for ids in batches:
        if before is not None:
            before()
        t0 = time.perf_counter_ns()
        rows = gather(ids)
        rows.sum()  # touch the result so nothing is left lazy
        per_token.append((time.perf_counter_ns() - t0) / len(ids))
    return statistics.median(per_token)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--cols", type=int, default=8960, help="num_hidden_layers x hidden_size_per_layer_input")
    parser.add_argument("--batch", type=int, default=256, help="tokens per lookup")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--dir", default=None, help="scratch directory (on the disk to measure)")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="ple-lookup-bench.", dir=args.dir)
    try:
        ckpt = os.path.join(work, "ckpt")
        table = write_checkpoint(ckpt, args.vocab, args.cols, seed=7)
        dest = os.path.join(work, "model.ple")
        ple_pack.pack(ckpt, dest)
        shutil.rmtree(ckpt)
        index = ple_reader.read_index(dest)
        entry = ple_reader.text_table(index, dest)
        with open(dest, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        mapping.madvise(mmap.MADV_RANDOM)
        mapped = np.frombuffer(mapping, dtype="<u2", count=args.vocab * args.cols,
                               offset=entry["offset"]).reshape(args.vocab, args.cols)
        memory = np.array(table)  # the in-memory table (a private copy, anonymous memory)
        rng = np.random.default_rng(11)
        batches = [rng.integers(0, args.vocab, size=args.batch) for _batch in range(args.batches)]
        assert all((mapped[b[:4]] == memory[b[:4]]).all() for b in batches[:8]), "mapped rows differ"

        mem_ns = time_batches(lambda ids: memory.take(ids, axis=0), batches)
        mapped.sum()  # every page of the table into the page cache
        warm_ns = time_batches(lambda ids: mapped.take(ids, axis=0), batches)
        cold_ns = time_batches(lambda ids: mapped.take(ids, axis=0), batches[: max(1, args.batches // 4)],
                               before=lambda: drop_cache(dest, mapping))
        del mapped
        mapping.close()
        row_bytes = args.cols * 2
        out = {
            "table_mib": round(args.vocab * row_bytes / 2 ** 20, 1), "row_bytes": row_bytes, "batch": args.batch,
            "ns_per_token": {"memory": round(mem_ns), "mmap_warm": round(warm_ns), "mmap_cold": round(cold_ns)},
            "ratio_warm_vs_memory": round(warm_ns / mem_ns, 2),
            "ratio_cold_vs_memory": round(cold_ns / mem_ns, 2),
            "cold_mib_per_s": round(row_bytes / (cold_ns / 1e9) / 2 ** 20, 1),
        }
        print(json.dumps(out))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
