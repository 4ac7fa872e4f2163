"""The PLE pack's chunked digest (docs/ple-format.md, "The hash scheme") and its readers."""
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import threading

import pytest

from ansible_collections.sparkops.appliance.plugins.module_utils import _ple_hash, _safetensors
from ansible_collections.sparkops.appliance.plugins.modules import ple_pack
from harness import ROOT
from ple_checkpoints import PLE, build_checkpoint, doc_digest, tensor, write_shard
CHUNK = 4096


def _file(tmp_path, data, name="blob"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 7 * CHUNK + 5])
def test_digest_is_the_documented_two_level_sha256(tmp_path, size):
    data = os.urandom(size)
    path = _file(tmp_path, b"head" + data + b"tail")
    got = _ple_hash.digest_file_range(path, 4, 4 + size, chunk_bytes=CHUNK)
    assert got == doc_digest(data, CHUNK)
    assert len(_ple_hash.chunk_bounds(4, 4 + size, CHUNK)) == -(-size // CHUNK)


def test_the_digest_does_not_depend_on_the_threads(tmp_path):
    data = os.urandom(37 * CHUNK + 11)
    path = _file(tmp_path, data)
    digests = {_ple_hash.digest_file_range(path, 0, len(data), workers=w, chunk_bytes=CHUNK) for w in (1, 2, 5)}
    with _ple_hash.ChunkHasher(workers=3, chunk_bytes=CHUNK, max_pending=2) as hasher:
        digests.add(hasher.digest(hasher.add(path, 0, len(data))))
    assert digests == {doc_digest(data, CHUNK)}


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flipped_byte_in_any_one_chunk_changes_the_digest(tmp_path, where):
    data = bytearray(os.urandom(9 * CHUNK + 100))
    good = _ple_hash.digest_file_range(_file(tmp_path, bytes(data)), 0, len(data), chunk_bytes=CHUNK)
    pos = {"first": 0, "middle": 4 * CHUNK + 17, "last": len(data) - 1}[where]
    data[pos] ^= 0x01
    bad = _ple_hash.digest_file_range(_file(tmp_path, bytes(data), "bad"), 0, len(data), chunk_bytes=CHUNK)
    assert bad != good


def test_one_large_table_is_hashed_on_several_threads(tmp_path, monkeypatch):
    data = os.urandom(64 * CHUNK)
    path = _file(tmp_path, data)
    threads = set()
    real = _safetensors.hash_range
    gate = threading.Barrier(2, timeout=10)

    def recording(*args, **kwargs):
        threads.add(threading.get_ident())
        if len(threads) <= 2:
            try:
                gate.wait()  # two chunks of the one table are in flight at the same time
            except threading.BrokenBarrierError:
                pass
        return real(*args, **kwargs)
    monkeypatch.setattr(_safetensors, "hash_range", recording)
    assert _ple_hash.digest_file_range(path, 0, len(data), workers=2, chunk_bytes=CHUNK) == doc_digest(data, CHUNK)
    assert len(threads) == 2 and not gate.broken


@pytest.fixture
def small_chunks(monkeypatch):
    """Packs written with 4 KiB chunks, so that the test tables span many chunks."""
    monkeypatch.setattr(ple_pack, "HASH_CHUNK_BYTES", CHUNK)


def _one_table_checkpoint(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    raw = write_shard(src / "model.safetensors", {PLE: tensor("bf16", (100, 1000), 3)})  # 200 kB, 49 chunks
    return src, raw[PLE]


def test_verify_catches_a_flipped_byte_in_one_chunk_of_the_pack(tmp_path, small_chunks):
    src, raw = _one_table_checkpoint(tmp_path)
    dest = tmp_path / "m.ple"
    first = ple_pack.pack(str(src), str(dest), verify=True)
    table = first["tables"][0]
    assert first["verified"] is True and table["digest"] == doc_digest(raw, CHUNK)
    with open(str(dest), "r+b") as f:  # one bit of chunk 23 of 49
        f.seek(table["offset"] + 23 * CHUNK + 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    check = ple_pack.pack(str(src), str(dest), verify=True, check_mode=True)
    assert check["changed"] is True and check["verify_failed"] == [PLE] and check["source_changed"] == []
    fixed = ple_pack.pack(str(src), str(dest), verify=True)
    assert fixed["changed"] is True and fixed["verified"] is True
    with open(str(dest), "rb") as f:
        f.seek(table["offset"])
        assert f.read(table["nbytes"]) == raw


def test_verify_catches_a_flipped_byte_in_one_chunk_of_the_source(tmp_path, small_chunks):
    src, raw = _one_table_checkpoint(tmp_path)
    dest = tmp_path / "m.ple"
    ple_pack.pack(str(src), str(dest))
    shard = src / "model.safetensors"
    info = _safetensors.read_header(str(shard)).tensors[0]
    before = os.stat(str(shard))
    with open(str(shard), "r+b") as f:  # last byte of the last (short) chunk
        f.seek(info.end - 1)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x80]))
    os.utime(str(shard), ns=(before.st_atime_ns, before.st_mtime_ns))
    assert ple_pack.pack(str(src), str(dest))["changed"] is False  # the fingerprint cannot see it
    result = ple_pack.pack(str(src), str(dest), verify=True)
    assert result["source_changed"] == [{"table": PLE, "shard": "model.safetensors"}]
    assert result["verify_failed"] == [] and result["changed"] is True


def _as_old_pack(dest):
    """Rewrite a pack's index as the packer wrote it before sha256-chunks (whole-table sha256)."""
    with open(str(dest), "r+b") as f:
        magic, version, flags, n = struct.unpack("<8sIIQ", f.read(24))
        index = json.loads(f.read(n))
        for key in ("hash_scheme", "hash_chunk_bytes"):
            del index[key]
        for t in index["tables"]:
            f.seek(t["offset"])
            t["sha256"] = hashlib.sha256(f.read(t["nbytes"])).hexdigest()
            del t["digest"]
        blob = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
        assert 24 + len(blob) <= index["tables"][0]["offset"]
        f.seek(0)
        f.write(struct.pack("<8sIIQ", magic, version, flags, len(blob)) + blob)


@pytest.mark.parametrize("verify", [False, True])
def test_a_pack_with_the_old_whole_table_sha256_is_repacked(tmp_path, verify):
    build_checkpoint(tmp_path / "ckpt")
    src = tmp_path / "ckpt"
    dest = tmp_path / "m.ple"
    ple_pack.pack(str(src), str(dest))
    _as_old_pack(dest)
    check = ple_pack.pack(str(src), str(dest), verify=verify, check_mode=True)
    assert check["changed"] is True
    assert "whole-table sha256 (an older pack" in check["diff"]["before"]
    assert "hash: sha256-chunks, 16777216-byte chunks" in check["diff"]["after"]
    result = ple_pack.pack(str(src), str(dest), verify=verify)
    assert result["changed"] is True and all(t["digest"] for t in result["tables"])
    assert ple_pack.pack(str(src), str(dest), verify=verify)["changed"] is False


def _doc_check_script():
    """The 'Checking a pack by hand' script of docs/ple-format.md, as a user would paste it."""
    with open(os.path.join(ROOT, "docs", "ple-format.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Checking a pack by hand", 1)[1]
    return re.search(r"<<'EOF'\n(.*?)\nEOF\n", section, re.S).group(1)


def test_the_documented_check_verifies_new_packs_and_refuses_old_ones(tmp_path, small_chunks):
    src, _raw = _one_table_checkpoint(tmp_path)
    dest = tmp_path / "m.ple"
    ple_pack.pack(str(src), str(dest))
    script = _doc_check_script()
    ok = subprocess.run([sys.executable, "-", str(dest)], input=script, capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and ok.stdout.split()[-1] == "ok", ok.stdout + ok.stderr
    with open(str(dest), "r+b") as f:
        f.seek(ple_pack.read_pack_index(str(dest))[0]["tables"][0]["offset"] + 30 * CHUNK)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    bad = subprocess.run([sys.executable, "-", str(dest)], input=script, capture_output=True, text=True, check=False)
    assert bad.stdout.split()[-1] == "BAD", bad.stdout + bad.stderr
    _as_old_pack(dest)
    old = subprocess.run([sys.executable, "-", str(dest)], input=script, capture_output=True, text=True, check=False)
    assert old.returncode != 0 and "re-pack it with the ple role" in old.stderr
