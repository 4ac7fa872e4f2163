"""Write a small safetensors checkpoint by hand (stdlib only) for the ple lab scenario.

usage: make_checkpoint.py DIR [--ple-mib N]

Three shards: BF16 and F16 PLE tables (Gemma-3n-style names) among F32/BF16/I8 ordinary
tensors. Bytes are deterministic (sha256 counter stream), so a rerun writes the same files.
"""
import argparse
import hashlib
import json
import os

ROW = 256  # elements per row


def stream(seed, nbytes):
    out = bytearray()
    counter = 0
    while len(out) < nbytes:
        block = hashlib.sha256(("%s:%d" % (seed, counter)).encode()).digest() * 2048  # 64 KiB
        out += block[:nbytes - len(out)]
        counter += 1
    return bytes(out)


def write_shard(path, tensors, chunk=16 << 20):
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, size in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, dummy, dummy2, size in tensors:
            left = size
            part = 0
            while left:
                n = min(left, chunk)
                f.write(stream("%s/%d" % (name, part), n))
                left -= n
                part += 1
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--ple-mib", type=int, default=4)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    ple_rows = args.ple_mib * (1 << 20) // (ROW * 2)
    shards = [
        [("model.language_model.embed_tokens.weight", "F32", [64, ROW], 64 * ROW * 4),
         ("model.language_model.embed_tokens_per_layer.weight", "BF16", [ple_rows, ROW], ple_rows * ROW * 2),
         ("model.language_model.layers.0.self_attn.q_proj.weight", "BF16", [96, ROW], 96 * ROW * 2)],
        [("model.language_model.layers.1.mlp.up_proj.weight", "BF16", [128, ROW], 128 * ROW * 2),
         ("model.language_model.norm.weight", "F32", [ROW], ROW * 4)],
        [("model.audio_tower.embed_tokens_per_layer.weight", "F16", [33, 17], 33 * 17 * 2),
         ("model.lm_head.qweight", "I8", [31, ROW], 31 * ROW)],
    ]
    for i, tensors in enumerate(shards):
        write_shard(os.path.join(args.dir, "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))), tensors)
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump({"model_type": "gemma3n", "ple_mib": args.ple_mib}, f)


if __name__ == "__main__":
    main()
