"""sparkops.appliance.ple_pack on small real checkpoints written by the safetensors library."""
import fcntl
import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from ansible.module_utils.testing import patch_module_args
from ansible_collections.sparkops.appliance.plugins.modules import ple_pack
from ansible_json import stdout_json
from harness import ROOT, host_results, run_playbook
from ple_checkpoints import PLE, PLE_AUDIO, build_checkpoint, doc_digest, tensor, write_raw_shard, write_shard


def parse_pack(path):
    """An independent reader of the documented format (docs/ple-format.md)."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, flags, index_len = struct.unpack_from("<8sIIQ", data, 0)
    assert (magic, version, flags) == (b"SPARKPLE", 1, 0)
    index = json.loads(data[24:24 + index_len].decode("utf-8"))
    return data, index


def table_bytes(data, table):
    """The bytes of one table of a pack, located by its index entry."""
    return data[table["offset"]:table["offset"] + table["nbytes"]]


def leftovers(directory):
    return sorted(f for f in os.listdir(str(directory)) if f.endswith(".ple-tmp"))


@pytest.fixture
def ckpt(tmp_path):
    raw = build_checkpoint(tmp_path / "ckpt")
    return tmp_path / "ckpt", raw


@pytest.mark.parametrize("alignment", [4096, 2 * 1024 * 1024])
def test_packed_tables_equal_the_source_and_are_aligned(tmp_path, ckpt, alignment):
    src, raw = ckpt
    dest = tmp_path / "m.ple"
    result = ple_pack.pack(str(src), str(dest), alignment=alignment)
    assert result["changed"] is True
    data, index = parse_pack(str(dest))
    names = [t["name"] for t in index["tables"]]
    assert names == [PLE, PLE_AUDIO]  # shard order, then byte order
    assert index["alignment"] == alignment and index["byte_order"] == "little"
    assert (index["hash_scheme"], index["hash_chunk_bytes"]) == ("sha256-chunks", 16 * 1024 * 1024)
    assert 24 + len(json.dumps(index)) <= index["tables"][0]["offset"]
    previous_end = 0
    for t in index["tables"]:
        assert t["offset"] % alignment == 0
        assert t["offset"] >= previous_end
        previous_end = t["offset"] + t["nbytes"]
        assert table_bytes(data, t) == raw[t["name"]]
        assert t["digest"] == doc_digest(raw[t["name"]])
    assert len(data) == index["file_bytes"] == previous_end
    assert index["tables"][0]["dtype"] == "BF16" and index["tables"][0]["shape"] == [97, 40]
    assert index["tables"][1]["dtype"] == "F16" and index["tables"][1]["shape"] == [33, 17]
    # the index round-trips: the module's reader gives back what the module returned
    back, problem = ple_pack.read_pack_index(str(dest))
    assert problem is None and back == index and back["tables"] == result["tables"]
    # figures for the memory plan
    assert result["ple_bytes"] == len(raw[PLE]) + len(raw[PLE_AUDIO]) == index["ple_bytes"]
    assert result["ple_gib"] == round(result["ple_bytes"] / 2 ** 30, 6)
    files = [os.path.join(str(src), f) for f in os.listdir(str(src))]
    assert result["weight_bytes"] == sum(os.path.getsize(f) for f in files)
    assert leftovers(tmp_path) == []


def test_patterns_pick_other_tables_and_dtypes(tmp_path, ckpt):
    src, raw = ckpt
    dest = tmp_path / "m.ple"
    result = ple_pack.pack(str(src), str(dest), name_patterns=[r"mlp\.", r"lm_head\.qweight$"])
    data, index = parse_pack(str(dest))
    got = {t["name"]: t["dtype"] for t in index["tables"]}
    assert got == {"model.language_model.layers.1.mlp.up_proj.weight": "BF16",
                   "model.language_model.layers.1.mlp.scale": "F8_E4M3",
                   "model.lm_head.qweight": "I8"}
    for t in index["tables"]:
        assert table_bytes(data, t) == raw[t["name"]]
    assert result["ple_bytes"] == sum(len(raw[n]) for n in got)


def test_weight_bytes_skip_hidden_entries_and_the_pack_itself(tmp_path, ckpt):
    src, _raw = ckpt
    expected = sum(os.path.getsize(os.path.join(str(src), f)) for f in os.listdir(str(src)))
    (src / ".cache").mkdir()
    (src / ".cache" / "junk").write_bytes(b"x" * 5000)
    result = ple_pack.pack(str(src), str(src / "inside.ple"))
    assert os.path.exists(str(src / "inside.ple"))
    assert result["weight_bytes"] == expected
    again = ple_pack.pack(str(src), str(src / "inside.ple"))
    assert again["changed"] is False and again["weight_bytes"] == expected


def test_idempotent_until_the_source_changes(tmp_path, ckpt):
    src, _raw = ckpt
    dest = tmp_path / "m.ple"
    first = ple_pack.pack(str(src), str(dest))
    inode = os.stat(str(dest)).st_ino
    second = ple_pack.pack(str(src), str(dest))
    assert second["changed"] is False and second["tables"] == first["tables"]
    assert os.stat(str(dest)).st_ino == inode
    # a shard rewritten with other values (same layout, new mtime) -> repacked
    shard = src / "model-00001-of-00003.safetensors"
    build_checkpoint(src, seed=7, extra_files=False)
    os.utime(str(shard), ns=(os.stat(str(shard)).st_atime_ns, os.stat(str(shard)).st_mtime_ns + 10 ** 9))
    third = ple_pack.pack(str(src), str(dest))
    assert third["changed"] is True and third["fingerprint"] != first["fingerprint"]
    assert third["tables"][0]["digest"] != first["tables"][0]["digest"]
    # another alignment is another layout -> repacked
    fourth = ple_pack.pack(str(src), str(dest), alignment=8192)
    assert fourth["changed"] is True
    assert all(t["offset"] % 8192 == 0 for t in parse_pack(str(dest))[1]["tables"])


def test_verify_finds_a_corrupted_pack_and_rewrites_it(tmp_path, ckpt):
    src, raw = ckpt
    dest = tmp_path / "m.ple"
    first = ple_pack.pack(str(src), str(dest), verify=True)
    assert first["verified"] is True
    offset = first["tables"][1]["offset"] + 5
    with open(str(dest), "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    # without verify the fingerprint says "up to date"
    assert ple_pack.pack(str(src), str(dest))["changed"] is False
    check = ple_pack.pack(str(src), str(dest), verify=True, check_mode=True)
    assert check["changed"] is True and check["verify_failed"] == [PLE_AUDIO]
    assert PLE_AUDIO in check["diff"]["before"]
    fixed = ple_pack.pack(str(src), str(dest), verify=True)
    assert fixed["changed"] is True and fixed["verified"] is True
    data, index = parse_pack(str(dest))
    t = index["tables"][1]
    assert table_bytes(data, t) == raw[PLE_AUDIO]


def _rewrite_in_place_keeping_size_and_mtime(shard, name):
    """Flip every byte of one tensor inside its shard, in place, then restore the shard's times."""
    from ansible_collections.sparkops.appliance.plugins.module_utils._safetensors import read_header
    before = os.stat(str(shard))
    info = [t for t in read_header(str(shard)).tensors if t.name == name][0]
    with open(str(shard), "r+b") as f:
        f.seek(info.begin)
        old = f.read(info.nbytes)
        new = bytes(b ^ 0xFF for b in old)
        f.seek(info.begin)
        f.write(new)
    os.utime(str(shard), ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(str(shard))
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    return new


def test_verify_rereads_the_sources_and_repacks_a_shard_rewritten_in_place(tmp_path, ckpt):
    src, raw = ckpt
    dest = tmp_path / "m.ple"
    first = ple_pack.pack(str(src), str(dest))
    shard = src / "model-00003-of-00003.safetensors"
    new = _rewrite_in_place_keeping_size_and_mtime(shard, PLE_AUDIO)
    assert new != raw[PLE_AUDIO]
    # without verify: same size and mtime, same fingerprint, nothing read -> not noticed
    quiet = ple_pack.pack(str(src), str(dest))
    assert quiet["changed"] is False and quiet["fingerprint"] == first["fingerprint"]
    assert quiet.get("source_changed", []) == [] and quiet["verified"] is False
    data, index = parse_pack(str(dest))
    assert table_bytes(data, index["tables"][1]) == raw[PLE_AUDIO]  # the stale bytes stay
    # verify in check mode: reported, named (table and shard), nothing written
    stamp = os.stat(str(dest))
    check = ple_pack.pack(str(src), str(dest), verify=True, check_mode=True)
    assert check["changed"] is True and check["verified"] is False
    assert check["source_changed"] == [{"table": PLE_AUDIO, "shard": shard.name}]
    assert check["verify_failed"] == []  # the pack itself is intact
    assert "source changed since packed" in check["diff"]["before"] and PLE_AUDIO in check["diff"]["before"]
    assert (os.stat(str(dest)).st_ino, os.stat(str(dest)).st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)
    # verify for real: the pack is rebuilt from the checkpoint as it is now
    fixed = ple_pack.pack(str(src), str(dest), verify=True)
    assert fixed["changed"] is True and fixed["verified"] is True
    assert fixed["source_changed"] == [{"table": PLE_AUDIO, "shard": shard.name}]
    data, index = parse_pack(str(dest))
    assert table_bytes(data, index["tables"][1]) == new
    assert index["tables"][1]["digest"] == doc_digest(new)
    assert table_bytes(data, index["tables"][0]) == raw[PLE]
    assert leftovers(tmp_path) == []
    # and then it is up to date, with and without verify
    again = ple_pack.pack(str(src), str(dest), verify=True)
    assert again["changed"] is False and again["verified"] is True and again["source_changed"] == []
    assert ple_pack.pack(str(src), str(dest))["changed"] is False


def test_verify_streams_the_sources_through_a_bounded_buffer(tmp_path, monkeypatch):
    """A table larger than the hash buffer is read in buffer-sized pieces, never whole."""
    from ansible_collections.sparkops.appliance.plugins.module_utils import _safetensors as st
    src = tmp_path / "ckpt"
    src.mkdir()
    write_shard(src / "model.safetensors", {PLE: tensor("bf16", (512, 1024), 9)})  # 1 MiB
    dest = tmp_path / "m.ple"
    ple_pack.pack(str(src), str(dest))
    reads = []
    real_preadv = os.preadv

    def preadv(fd, buffers, offset):
        reads.append(sum(len(b) for b in buffers))
        return real_preadv(fd, buffers, offset)
    monkeypatch.setattr(st, "HASH_BUFFER_BYTES", 64 * 1024)
    monkeypatch.setattr(st.os, "preadv", preadv)
    result = ple_pack.pack(str(src), str(dest), verify=True)
    assert result["verified"] is True and result["changed"] is False
    assert len(reads) >= 2 * 16 and max(reads) <= 64 * 1024  # source and pack, 1 MiB each


def test_module_warns_naming_the_table_and_the_shard(tmp_path, ckpt, capsys, monkeypatch):
    from ansible.module_utils import _internal
    # a module process is never the controller; once another test in this process imported
    # controller code, ansible would print module warnings instead of returning them
    monkeypatch.setattr(_internal, "is_controller", False)
    src, _raw = ckpt
    dest = tmp_path / "m.ple"
    ple_pack.pack(str(src), str(dest))
    shard = src / "model-00001-of-00003.safetensors"
    _rewrite_in_place_keeping_size_and_mtime(shard, PLE)
    out = run_main(capsys, checkpoint_dir=str(src), dest=str(dest), verify=True)
    assert out["changed"] is True and out["source_changed"] == [{"table": PLE, "shard": shard.name}]
    # a warning is a string or (ansible-core 2.19, depending on the serialization profile) a
    # structured summary holding the text: look at the text wherever it sits
    texts = [w if isinstance(w, str) else json.dumps(w) for w in out["warnings"]]
    assert any(PLE in w and shard.name in w and "rebuilt" in w for w in texts), texts


def test_a_foreign_file_at_dest_is_replaced(tmp_path, ckpt):
    src, _raw = ckpt
    dest = tmp_path / "m.ple"
    dest.write_bytes(b"hello, this is not a PLE pack at all")
    result = ple_pack.pack(str(src), str(dest), check_mode=True)
    assert result["changed"] is True and "bad magic" in result["diff"]["before"]
    assert dest.read_bytes() == b"hello, this is not a PLE pack at all"
    ple_pack.pack(str(src), str(dest))
    parse_pack(str(dest))


# --- bad input: a clear error, nothing at dest, no temp file -------------------------------

def _bad_checkpoint(directory, case):
    directory.mkdir()
    good = {PLE: tensor("bf16", (8, 4), 1), "w": tensor("float32", (4,), 2)}
    if case == "not_safetensors":
        (directory / "model.safetensors").write_bytes(b"PK\x03\x04 this is a zip file, not a shard")
        return "not a safetensors file"
    if case == "truncated":
        write_shard(directory / "model.safetensors", good)
        path = directory / "model.safetensors"
        path.write_bytes(path.read_bytes()[:-10])
        return "truncated"
    if case == "header_past_end":
        write_shard(directory / "a.safetensors", good)
        (directory / "b.safetensors").write_bytes((4096).to_bytes(8, "little") + b'{"x":')
        return "runs past the end of the file"
    if case == "overlap":
        write_raw_shard(directory / "model.safetensors", {
            PLE: {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]},
            "w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}, bytes(32))
        return "overlap"
    if case == "out_of_range":
        write_raw_shard(directory / "model.safetensors", {
            PLE: {"dtype": "BF16", "shape": [4, 4], "data_offsets": [32, 64]}}, bytes(40))
        return "out of range"
    if case == "duplicate":
        write_shard(directory / "a.safetensors", good)
        write_shard(directory / "b.safetensors", {PLE: tensor("bf16", (8, 4), 3)})
        return "appears in two shards"
    if case == "unsupported_dtype":
        write_raw_shard(directory / "model.safetensors", {
            PLE: {"dtype": "F4", "shape": [8, 4], "data_offsets": [0, 16]}}, bytes(16))
        return "unsupported dtype 'F4'"
    if case == "no_match":
        write_shard(directory / "model.safetensors", {
            "model.embed_tokens.weight": tensor("float32", (4, 2), 1),
            "model.per_layer_embeddings.weight": tensor("bf16", (4, 2), 2)})
        return "'model.per_layer_embeddings.weight'"
    if case == "no_shards":
        (directory / "config.json").write_text("{}")
        return "holds no *.safetensors shard"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["not_safetensors", "truncated", "header_past_end", "overlap",
                                  "out_of_range", "duplicate", "unsupported_dtype", "no_match",
                                  "no_shards"])
def test_bad_input_fails_clearly_and_leaves_nothing(tmp_path, case):
    expect = _bad_checkpoint(tmp_path / "ckpt", case)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ple_pack.PackError) as err:
        ple_pack.pack(str(tmp_path / "ckpt"), str(out / "m.ple"))
    assert expect in str(err.value)
    if case == "no_match":
        assert "closest names:" in str(err.value)
    assert os.listdir(str(out)) == []


def test_bad_options_fail_before_reading(tmp_path, ckpt):
    src, _raw = ckpt
    for alignment in (1000, 2048, 4096 + 1, 1 << 31):
        with pytest.raises(ple_pack.PackError, match="power of two"):
            ple_pack.pack(str(src), str(tmp_path / "m.ple"), alignment=alignment)
    with pytest.raises(ple_pack.PackError, match="not a valid regular expression"):
        ple_pack.pack(str(src), str(tmp_path / "m.ple"), name_patterns=["embed[("])
    with pytest.raises(ple_pack.PackError, match="does not exist"):
        ple_pack.pack(str(src), str(tmp_path / "nodir" / "m.ple"))
    # in check mode the directory may still be due to an earlier task: report the pack
    check = ple_pack.pack(str(src), str(tmp_path / "nodir" / "m.ple"), check_mode=True)
    assert check["changed"] is True and not (tmp_path / "nodir").exists()
    assert not os.path.exists(str(tmp_path / "m.ple"))


# --- disk full on a real small filesystem -----------------------------------------------------

@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip("cannot mount a 1 MiB tmpfs here: %s" % proc.stderr.strip())
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_fails_clearly_and_keeps_the_old_pack(tmp_path, tiny_fs, monkeypatch):
    small = tmp_path / "small"
    build_checkpoint(small)
    dest = tiny_fs / "m.ple"
    ple_pack.pack(str(small), str(dest))
    old = dest.read_bytes()
    big = tmp_path / "big"
    big.mkdir()
    write_shard(big / "model.safetensors", {PLE: tensor("bf16", (1024, 1024), 5)})  # 2 MiB
    # 1. the free-space check before writing
    with pytest.raises(ple_pack.PackError, match="not enough free disk"):
        ple_pack.pack(str(big), str(dest))
    assert dest.read_bytes() == old and leftovers(tiny_fs) == []
    # 2. the filesystem itself says ENOSPC (preallocation)
    with pytest.raises(ple_pack.PackError, match="disk full"):
        ple_pack.pack(str(big), str(dest), check_space=False)
    assert dest.read_bytes() == old and leftovers(tiny_fs) == []

    # 3. ENOSPC in the middle of the copy (no preallocation on this filesystem)
    def no_fallocate(fd, offset, length):
        raise OSError(95, "Operation not supported")
    monkeypatch.setattr(os, "posix_fallocate", no_fallocate)
    with pytest.raises(ple_pack.PackError, match="disk full"):
        ple_pack.pack(str(big), str(dest), check_space=False)
    assert dest.read_bytes() == old and leftovers(tiny_fs) == []


# --- a killed pack ------------------------------------------------------------------------------

KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[3])
    from ansible_collections.sparkops.appliance.plugins.module_utils import _safetensors as st
    from ansible_collections.sparkops.appliance.plugins.modules import ple_pack
    st.COPY_CHUNK_BYTES = 64 * 1024
    real = st.RangeCopier._copy_some
    calls = []
    def copy_some(self, *args):
        calls.append(1)
        if len(calls) == 4:   # midway through the first table: die like kill -9 would
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *args)
    st.RangeCopier._copy_some = copy_some
    ple_pack.pack(sys.argv[1], sys.argv[2])
""")


def test_a_killed_pack_leaves_no_file_and_the_rerun_cleans_up(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    raw = write_shard(src / "model.safetensors", {PLE: tensor("bf16", (512, 1024), 9)})  # 1 MiB
    dest = tmp_path / "m.ple"
    proc = subprocess.run([sys.executable, "-c", KILLER, str(src), str(dest),
                           os.path.join(ROOT, ".collections")], capture_output=True, text=True, check=False)
    assert proc.returncode == -9, proc.stderr
    assert not dest.exists()
    left = leftovers(tmp_path)
    assert len(left) == 1 and left[0].startswith(".m.ple.")
    assert 0 < os.path.getsize(str(tmp_path / left[0]))
    check = ple_pack.pack(str(src), str(dest), check_mode=True)
    assert check["changed"] is True and leftovers(tmp_path) == left  # check mode removes nothing
    result = ple_pack.pack(str(src), str(dest))
    assert result["changed"] is True
    assert [os.path.basename(p) for p in result["removed_temp_files"]] == left
    assert leftovers(tmp_path) == []
    data, index = parse_pack(str(dest))
    t = index["tables"][0]
    assert table_bytes(data, t) == raw[PLE]


def test_a_temp_file_of_a_live_pack_is_not_removed(tmp_path, ckpt):
    src, _raw = ckpt
    dest = tmp_path / "m.ple"
    busy = tmp_path / ".m.ple.12345.abcd.ple-tmp"
    busy.write_bytes(b"in progress")
    fd = os.open(str(busy), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        result = ple_pack.pack(str(src), str(dest))
        assert result["removed_temp_files"] == [] and busy.exists()
    finally:
        os.close(fd)
    again = ple_pack.pack(str(src), str(dest))  # the writer is gone now
    assert again["removed_temp_files"] == [str(busy)] and not busy.exists()
    assert again["changed"] is True


# --- the module entry point: check mode with diff, real, again -----------------------------------

def run_main(capsys, **args):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            ple_pack.main()
    return json.loads(capsys.readouterr().out)


def test_module_check_diff_then_real_then_again(tmp_path, ckpt, capsys):
    src, raw = ckpt
    dest = tmp_path / "m.ple"
    args = dict(checkpoint_dir=str(src), dest=str(dest), alignment=8192, mode="0640")
    check = run_main(capsys, _ansible_check_mode=True, _ansible_diff=True, **args)
    assert check["changed"] is True and not dest.exists()
    assert check["diff"]["before"] == "" and PLE in check["diff"]["after"]
    assert all(t["digest"] is None for t in check["tables"])
    real = run_main(capsys, _ansible_diff=True, **args)
    assert real["changed"] is True and dest.exists()
    assert real["diff"] == check["diff"]
    assert oct(os.stat(str(dest)).st_mode & 0o777) == "0o640"
    assert [t["digest"] for t in real["tables"]] == [doc_digest(raw[n]) for n in (PLE, PLE_AUDIO)]
    for key in ("ple_bytes", "ple_gib", "weight_bytes", "file_bytes", "fingerprint"):
        assert real[key] == check[key], key
    again = run_main(capsys, _ansible_diff=True, **args)
    assert again["changed"] is False
    assert again["diff"]["before"] == again["diff"]["after"] == real["diff"]["after"]
    again_check = run_main(capsys, _ansible_check_mode=True, _ansible_diff=True, **args)
    assert again_check["changed"] is False


def test_module_reports_bad_input_as_failed(tmp_path, capsys):
    _bad_checkpoint(tmp_path / "ckpt", "truncated")
    out = run_main(capsys, checkpoint_dir=str(tmp_path / "ckpt"), dest=str(tmp_path / "m.ple"))
    assert out["failed"] is True and "truncated" in out["msg"]
    out = run_main(capsys, checkpoint_dir=str(tmp_path / "ckpt"), dest=str(tmp_path / "m.ple"),
                   mode="rw-r--r--")
    assert out["failed"] is True and "octal file mode" in out["msg"]
    assert not (tmp_path / "m.ple").exists()


def test_module_through_ansible_playbook(tmp_path, ckpt):
    src, _raw = ckpt
    dest = tmp_path / "m.ple"
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent("""
        - hosts: localhost
          gather_facts: false
          tasks:
            - name: Check mode with diff
              sparkops.appliance.ple_pack: {checkpoint_dir: "%(src)s", dest: "%(dest)s"}
              check_mode: true
              diff: true
              register: check
            - name: For real
              sparkops.appliance.ple_pack: {checkpoint_dir: "%(src)s", dest: "%(dest)s"}
              diff: true
              register: real
            - name: Again
              sparkops.appliance.ple_pack: {checkpoint_dir: "%(src)s", dest: "%(dest)s"}
              diff: true
              register: again
        """) % {"src": src, "dest": dest})
    # the task results as the JSON stdout callback reports them (no task that saves them)
    proc = run_playbook(str(play), extra_vars={"ansible_python_interpreter": sys.executable})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = {"Check mode with diff": "check", "For real": "real", "Again": "again"}
    res = {names[task]: result for _play, task, result in host_results(stdout_json(proc), "localhost")}
    assert res["check"]["changed"] is True and res["real"]["changed"] is True
    assert res["again"]["changed"] is False
    assert res["again"]["diff"]["before"] == res["again"]["diff"]["after"]
    assert res["real"]["ple_gib"] == res["check"]["ple_gib"] > 0
    parse_pack(str(dest))


def test_a_new_mode_is_applied_without_repacking(tmp_path, ckpt):
    src, _raw = ckpt
    dest = tmp_path / "m.ple"
    ple_pack.pack(str(src), str(dest), mode=0o644)
    inode = os.stat(str(dest)).st_ino
    check = ple_pack.pack(str(src), str(dest), mode=0o600, check_mode=True)
    assert check["changed"] is True and "mode: 0644" in check["diff"]["before"]
    assert "mode: 0600" in check["diff"]["after"]
    assert os.stat(str(dest)).st_mode & 0o777 == 0o644
    real = ple_pack.pack(str(src), str(dest), mode=0o600)
    assert real["changed"] is True and real["copy_method"] is None
    assert os.stat(str(dest)).st_mode & 0o777 == 0o600 and os.stat(str(dest)).st_ino == inode
    again = ple_pack.pack(str(src), str(dest), mode=0o600)
    assert again["changed"] is False and again["diff"]["before"] == again["diff"]["after"]


def test_a_failed_copy_stops_the_hash_threads(tmp_path, ckpt, monkeypatch):
    from ansible_collections.sparkops.appliance.plugins.module_utils import _safetensors as st
    src, _raw = ckpt
    seen = []
    real_hash = st.hash_range

    def slow_hash(*args, **kwargs):
        seen.append(kwargs.get("stop"))
        return real_hash(*args, **kwargs)

    real_copy = st.RangeCopier.copy
    copies = []

    def broken_copy(self, *args):  # the first table's chunk goes through, then the disk fails
        copies.append(args)
        if len(copies) > 1:
            raise OSError(5, "Input/output error")
        return real_copy(self, *args)
    monkeypatch.setattr(st, "hash_range", slow_hash)
    monkeypatch.setattr(st.RangeCopier, "copy", broken_copy)
    with pytest.raises(ple_pack.PackError, match="Input/output error"):
        ple_pack.pack(str(src), str(tmp_path / "m.ple"))
    assert seen and all(e is not None and e.is_set() for e in seen)
    assert leftovers(tmp_path) == [] and not (tmp_path / "m.ple").exists()
