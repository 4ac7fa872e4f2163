"""Build small real safetensors checkpoints for the PLE tests (safetensors + numpy).

BF16 and F8 have no numpy dtype: their bytes come from uint16/uint8 arrays and the shards are
written by safetensors' own serializer (serialize_file with TensorSpec), so every shard here is
produced by the reference library, not by our code.
"""
import json
import os

import numpy as np
from safetensors import TensorSpec, serialize_file

_NP_TO_ST = {
    np.dtype("float32"): "float32",
    np.dtype("float16"): "float16",
    np.dtype("float64"): "float64",
    np.dtype("int8"): "int8",
    np.dtype("uint8"): "uint8",
    np.dtype("int32"): "int32",
    np.dtype("int64"): "int64",
}


def tensor(kind, shape, seed):
    """(safetensors dtype name, array holding the raw bytes) for kind in bf16/f8/numpy names."""
    rng = np.random.default_rng(seed)
    if kind == "bf16":
        return "bfloat16", rng.integers(0, 2 ** 16, size=shape, dtype=np.uint16)
    if kind == "f8":
        return "float8_e4m3fn", rng.integers(0, 2 ** 8, size=shape, dtype=np.uint8)
    arr = (rng.standard_normal(size=shape) * 100).astype(kind)
    return _NP_TO_ST[arr.dtype], arr


def write_shard(path, tensors, metadata=None):
    """tensors: {name: (st_dtype, array)} -> shard at path; returns {name: raw bytes}."""
    specs = {}
    keep = []
    raw = {}
    for name, (st_dtype, arr) in tensors.items():
        arr = np.ascontiguousarray(arr)
        keep.append(arr)
        specs[name] = TensorSpec(dtype=st_dtype, shape=list(arr.shape), data_ptr=arr.ctypes.data,
                                 data_len=arr.nbytes)
        raw[name] = arr.tobytes()
    serialize_file(specs, str(path), metadata=metadata or {"format": "pt"})
    return raw


PLE = "model.language_model.embed_tokens_per_layer.weight"
PLE_AUDIO = "model.audio_tower.embed_tokens_per_layer.weight"

DEFAULT_LAYOUT = [
    {   # shard 1: the main PLE table (bf16) among ordinary weights
        "model.language_model.embed_tokens.weight": ("float32", (64, 24)),
        PLE: ("bf16", (97, 40)),
        "model.language_model.layers.0.self_attn.q_proj.weight": ("float16", (16, 24)),
    },
    {   # shard 2: no PLE at all
        "model.language_model.layers.1.mlp.up_proj.weight": ("bf16", (48, 24)),
        "model.language_model.layers.1.mlp.scale": ("f8", (48,)),
        "model.language_model.norm.weight": ("float32", (24,)),
    },
    {   # shard 3: a second PLE table (f16) and integer tensors
        PLE_AUDIO: ("float16", (33, 17)),
        "model.lm_head.qweight": ("int8", (31, 24)),
        "model.lm_head.zeros": ("uint8", (7,)),
        "model.rope.inv_freq": ("int32", (5,)),
    },
]


def build_checkpoint(directory, layout=None, seed=0, extra_files=True):
    """Write a checkpoint of several shards; returns {name: raw bytes} of every tensor."""
    layout = DEFAULT_LAYOUT if layout is None else layout
    os.makedirs(str(directory), exist_ok=True)
    raw = {}
    weight_map = {}
    n = len(layout)
    for i, shard in enumerate(layout):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        tensors = {}
        for j, (name, (kind, shape)) in enumerate(shard.items()):
            tensors[name] = tensor(kind, shape, seed * 1000 + i * 100 + j)
            weight_map[name] = fname
        raw.update(write_shard(os.path.join(str(directory), fname), tensors))
    if extra_files:
        with open(os.path.join(str(directory), "config.json"), "w") as f:
            json.dump({"model_type": "gemma3n"}, f)
        with open(os.path.join(str(directory), "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return raw


def write_raw_shard(path, header, data):
    """A shard written by hand (for malformed cases): header dict or bytes, then data bytes."""
    blob = header if isinstance(header, bytes) else json.dumps(header).encode("utf-8")
    with open(str(path), "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        f.write(data)


def doc_digest(data, chunk_bytes=16 * 1024 * 1024):
    """A table's digest as docs/ple-format.md defines it (sha256-chunks), written independently."""
    import hashlib
    chunks = [hashlib.sha256(data[i:i + chunk_bytes]).digest() for i in range(0, len(data), chunk_bytes)]
    return hashlib.sha256(b"".join(chunks)).hexdigest()
