"""The streaming safetensors reader against shards written by the safetensors library."""
import hashlib
import json
import os

import numpy as np
import pytest
from safetensors import safe_open

from ansible_collections.sparkops.appliance.plugins.module_utils import _safetensors as st
from ple_checkpoints import DEFAULT_LAYOUT, PLE, build_checkpoint, write_raw_shard, write_shard, tensor


def _shards(directory):
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".safetensors"))


def test_header_matches_the_library_and_ranges_hold_the_tensor_bytes(tmp_path):
    raw = build_checkpoint(tmp_path)
    headers, by_name = st.read_shards(_shards(str(tmp_path)))
    assert len(headers) == 3
    assert set(by_name) == set(raw)
    dtypes = {info.dtype for info in by_name.values()}
    assert {"BF16", "F16", "F32", "F8_E4M3", "I8", "U8", "I32"} <= dtypes
    for hdr in headers:
        with safe_open(hdr.path, framework="numpy") as f:
            assert sorted(f.keys()) == sorted(t.name for t in hdr.tensors)
        with open(hdr.path, "rb") as f:
            for info in hdr.tensors:
                f.seek(info.begin)
                assert f.read(info.nbytes) == raw[info.name], info.name
    shape = list(DEFAULT_LAYOUT[0][PLE][1])
    assert by_name[PLE].shape == shape and by_name[PLE].dtype == "BF16"
    assert by_name[PLE].nbytes == shape[0] * shape[1] * 2


def test_numpy_saved_shard_parses(tmp_path):
    from safetensors.numpy import save_file
    arrs = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones((2,), dtype=np.int64)}
    save_file(arrs, str(tmp_path / "m.safetensors"))
    hdr = st.read_header(str(tmp_path / "m.safetensors"))
    got = {t.name: (t.dtype, t.shape) for t in hdr.tensors}
    assert got == {"a": ("F32", [3, 4]), "b": ("I64", [2])}


def test_hash_range_equals_hashlib(tmp_path):
    raw = build_checkpoint(tmp_path)
    by_name = st.read_shards(_shards(str(tmp_path)))[1]
    info = by_name[PLE]
    assert st.hash_range(info.shard, info.begin, info.end, buffer_bytes=1000) == \
        hashlib.sha256(raw[PLE]).hexdigest()


@pytest.mark.parametrize("method", ["copy_file_range", "sendfile", "readwrite"])
def test_range_copier_methods_copy_exact_bytes(tmp_path, method):
    src = tmp_path / "src"
    payload = os.urandom(3 * 1024 * 1024 + 17)
    src.write_bytes(payload)
    dst = tmp_path / "dst"
    copier = st.RangeCopier(buffer_bytes=64 * 1024)
    copier._method = method
    sfd = os.open(str(src), os.O_RDONLY)
    dfd = os.open(str(dst), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(dfd, 8192 + len(payload) - 100)
        copier.copy(sfd, 100, dfd, 8192, len(payload) - 100)
    finally:
        os.close(sfd)
        os.close(dfd)
    data = dst.read_bytes()
    assert data[8192:] == payload[100:]
    assert data[:8192] == b"\0" * 8192
    assert copier.method == method


def _valid_header():
    return {"x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "y": {"dtype": "U8", "shape": [4], "data_offsets": [16, 20]}}


@pytest.mark.parametrize("case,expect", [
    ("short", "not a safetensors file"),
    ("not_json", "not a safetensors file"),
    ("json_array", "not a JSON object"),
    ("header_past_end", "runs past the end of the file"),
    ("header_too_big", "above the"),
    ("truncated", "truncated"),
    ("overlap", "overlap"),
    ("begin_after_end", "out of range"),
    ("size_mismatch", "needs 16 bytes"),
    ("bad_shape", "not a list of non-negative integers"),
    ("bad_offsets", "not a pair of integers"),
    ("no_dtype", "dtype missing"),
])
def test_malformed_shards_fail_with_a_named_reason(tmp_path, case, expect):
    path = tmp_path / "bad.safetensors"
    hdr = _valid_header()
    data = bytes(20)
    if case == "short":
        path.write_bytes(b"\x01\x02")
    elif case == "not_json":
        write_raw_shard(path, b"{this is not json", data)
    elif case == "json_array":
        write_raw_shard(path, b"[1, 2]", data)
    elif case == "header_past_end":
        path.write_bytes((10 ** 6).to_bytes(8, "little") + b"{}")
    elif case == "header_too_big":
        path.write_bytes((st.MAX_HEADER_BYTES + 1).to_bytes(8, "little") + b"{}")
    elif case == "truncated":
        write_raw_shard(path, hdr, data[:18])
    elif case == "overlap":
        hdr["y"]["data_offsets"] = [12, 16]
        hdr["y"]["shape"] = [4]
        write_raw_shard(path, hdr, data)
    elif case == "begin_after_end":
        hdr["y"]["data_offsets"] = [20, 16]
        write_raw_shard(path, hdr, data)
    elif case == "size_mismatch":
        hdr["x"]["data_offsets"] = [0, 12]
        write_raw_shard(path, hdr, data)
    elif case == "bad_shape":
        hdr["x"]["shape"] = [2, -2]
        write_raw_shard(path, hdr, data)
    elif case == "bad_offsets":
        hdr["x"]["data_offsets"] = [0, "16"]
        write_raw_shard(path, hdr, data)
    elif case == "no_dtype":
        del hdr["x"]["dtype"]
        write_raw_shard(path, hdr, data)
    with pytest.raises(st.SafetensorsError) as err:
        st.read_header(str(path))
    assert expect in str(err.value)
    assert str(path) in str(err.value)


def test_unknown_dtype_is_parsed_but_flagged(tmp_path):
    path = tmp_path / "m.safetensors"
    write_raw_shard(path, {"q": {"dtype": "F4", "shape": [8], "data_offsets": [0, 4]}}, bytes(4))
    info = st.read_header(str(path)).tensors[0]
    assert info.dtype == "F4" and not info.supported


def test_duplicate_names_across_shards_fail(tmp_path):
    write_shard(tmp_path / "a.safetensors", {"w": tensor("float32", (2,), 1)})
    write_shard(tmp_path / "b.safetensors", {"w": tensor("float16", (2,), 2)})
    with pytest.raises(st.SafetensorsError) as err:
        st.read_shards([str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")])
    msg = str(err.value)
    assert "'w'" in msg and "a.safetensors" in msg and "b.safetensors" in msg


def test_metadata_must_be_an_object(tmp_path):
    path = tmp_path / "m.safetensors"
    write_raw_shard(path, json.dumps({"__metadata__": [1]}).encode(), b"")
    with pytest.raises(st.SafetensorsError, match="__metadata__"):
        st.read_header(str(path))


def test_hash_range_gives_up_when_asked(tmp_path):
    import threading
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(1 << 20))
    stop = threading.Event()
    assert st.hash_range(str(path), 0, 1 << 20, stop=stop) == hashlib.sha256(path.read_bytes()).hexdigest()
    stop.set()
    assert st.hash_range(str(path), 0, 1 << 20, stop=stop) is None
