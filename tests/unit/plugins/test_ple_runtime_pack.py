# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM plugin's pack reader and start-up checks (roles/runtime_image/files/sparkops_vllm_ple).

Packs are written by the real packer (sparkops.appliance.ple_pack) from checkpoints written by
the safetensors library; the reader is the plugin's own, standard library only (no torch here).
"""
import json
import os
import struct
import sys

import numpy as np
import pytest

from ansible_collections.sparkops.appliance.plugins.modules import ple_pack
from ple_checkpoints import PLE, PLE_AUDIO, build_checkpoint
import harness

ROOT = harness.ROOT
sys.path.insert(0, os.path.join(ROOT, "roles", "runtime_image", "files", "sparkops_vllm_ple"))
from sparkops_vllm_ple import pack  # noqa: E402  pylint: disable=wrong-import-position

ROWS, COLS = 97, 40  # the language-model table of ple_checkpoints' default layout


@pytest.fixture
def packed(tmp_path):
    ckpt = tmp_path / "ckpt"
    raw = build_checkpoint(ckpt)
    dest = str(tmp_path / "model.ple")
    ple_pack.pack(str(ckpt), dest)
    return str(ckpt), dest, raw


def test_a_matching_pack_passes_and_rows_are_where_the_index_says(packed):
    ckpt, dest, raw = packed
    index, table = pack.open_checked(dest, ckpt, ROWS, COLS, "Gemma3nForCausalLM")
    assert table["name"] == PLE and table["dtype"] == "BF16"
    assert [t["name"] for t in index["tables"]] == [PLE, PLE_AUDIO]
    # Row r as the plugin maps it (offset + r * cols * 2) equals row r of the source tensor.
    source = np.frombuffer(raw[PLE], dtype="<u2").reshape(ROWS, COLS)
    mapped = np.memmap(dest, dtype="<u2", mode="r", offset=table["offset"], shape=(ROWS, COLS))
    for r in (0, 1, 50, ROWS - 1):
        assert (mapped[r] == source[r]).all()


def test_the_audio_tower_table_is_not_taken_for_the_language_model(packed):
    _ckpt, dest, _raw = packed
    assert pack.text_table(pack.read_index(dest), dest)["name"] == PLE


@pytest.mark.parametrize("rows, cols", [(ROWS + 1, COLS), (ROWS, COLS * 2)])
def test_a_wrong_shape_is_refused_naming_the_table(packed, rows, cols):
    ckpt, dest, _raw = packed
    with pytest.raises(pack.PackMismatchError) as err:
        pack.open_checked(dest, ckpt, rows, cols, "Gemma4ForCausalLM")
    msg = str(err.value)
    assert PLE in msg and "[%d, %d]" % (ROWS, COLS) in msg and "[%d, %d]" % (rows, cols) in msg
    assert "ple role" in msg


def test_a_stale_fingerprint_is_refused_naming_the_table(packed):
    ckpt, dest, _raw = packed
    shard = os.path.join(ckpt, "model-00001-of-00003.safetensors")
    st = os.stat(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))  # rewritten since the pack
    with pytest.raises(pack.PackMismatchError) as err:
        pack.open_checked(dest, ckpt, ROWS, COLS, "Gemma3nForCausalLM")
    assert "stale pack" in str(err.value) and PLE in str(err.value)


def test_the_fingerprint_is_the_packers(packed):
    ckpt, dest, _raw = packed
    index = pack.read_index(dest)
    assert pack.fingerprint(index, ckpt, dest) == index["fingerprint"]


def test_a_pack_of_another_checkpoint_is_refused(packed, tmp_path):
    _ckpt, dest, _raw = packed
    other = tmp_path / "other"
    build_checkpoint(other, seed=3, layout=[{PLE: ("bf16", (ROWS, COLS)), PLE_AUDIO: ("float16", (33, 17))}])
    with pytest.raises(pack.PackMismatchError) as err:
        pack.open_checked(dest, str(other), ROWS, COLS, "Gemma3nForCausalLM")
    assert PLE in str(err.value)


def test_a_truncated_copy_is_refused(packed):
    ckpt, dest, _raw = packed
    with open(dest, "r+b") as f:
        f.truncate(os.path.getsize(dest) - 1)
    with pytest.raises(pack.PackMismatchError, match="truncated or partial copy"):
        pack.open_checked(dest, ckpt, ROWS, COLS, "Gemma3nForCausalLM")


def _rewrite_index(path, change):
    with open(path, "r+b") as f:
        _magic, _version, _flags, index_len = pack.PREFIX.unpack(f.read(pack.PREFIX.size))
        index = json.loads(f.read(index_len))
        change(index)
        blob = json.dumps(index, separators=(",", ":")).encode("utf-8")
        assert len(blob) <= index_len   # shorter: the tables stay where they are
        f.seek(0)
        f.write(pack.PREFIX.pack(pack.MAGIC, pack.FORMAT_VERSION, 0, len(blob)) + blob)


@pytest.mark.parametrize("scheme", [None, "sha1-chunks"])
def test_an_older_or_unknown_hash_scheme_is_refused(packed, scheme):
    ckpt, dest, _raw = packed
    pack.open_checked(dest, ckpt, ROWS, COLS, "Gemma3nForCausalLM")   # as packed: read

    def older(index):
        index.pop("hash_scheme")
        if scheme:
            index["hash_scheme"] = scheme
    _rewrite_index(dest, older)
    with pytest.raises(pack.PackMismatchError, match="hash scheme %r: packed with the old whole-table sha256" % scheme):
        pack.open_checked(dest, ckpt, ROWS, COLS, "Gemma3nForCausalLM")


def test_not_a_pack_and_a_missing_file_are_refused(tmp_path):
    bad = tmp_path / "bad.ple"
    bad.write_bytes(b"NOTAPACK" + struct.pack("<IIQ", 1, 0, 2) + b"{}")
    with pytest.raises(pack.PackMismatchError, match="not a packed PLE file"):
        pack.read_index(str(bad))
    with pytest.raises(pack.PackMismatchError, match="SPARKOPS_PLE_FILE .* cannot be read"):
        pack.read_index(str(tmp_path / "missing.ple"))


def test_a_quantised_table_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    build_checkpoint(ckpt, layout=[{PLE: ("f8", (ROWS, COLS))}])
    dest = str(tmp_path / "q.ple")
    ple_pack.pack(str(ckpt), dest)
    with pytest.raises(pack.PackMismatchError, match="F8_E4M3"):
        pack.open_checked(dest, str(ckpt), ROWS, COLS, "Gemma3nForCausalLM")


def test_two_language_model_tables_are_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    build_checkpoint(ckpt, layout=[{PLE: ("bf16", (ROWS, COLS)), "model.embed_tokens_per_layer.weight": ("bf16", (ROWS, COLS))}])
    dest = str(tmp_path / "two.ple")
    ple_pack.pack(str(ckpt), dest)
    with pytest.raises(pack.PackMismatchError, match="found 2"):
        pack.text_table(pack.read_index(dest), dest)


def test_the_plugin_does_nothing_without_the_pack(monkeypatch):
    import sparkops_vllm_ple  # pylint: disable=import-outside-toplevel

    monkeypatch.delenv("SPARKOPS_PLE_FILE", raising=False)
    monkeypatch.delenv("SPARKOPS_PLE_REPORT_WEIGHTS", raising=False)
    assert sparkops_vllm_ple.register() is None  # returns before importing vLLM (not installed here)


def test_the_dist_info_declares_the_entry_point():
    base = os.path.join(ROOT, "roles", "runtime_image", "files", "sparkops_vllm_ple")
    with open(os.path.join(base, "sparkops_vllm_ple-1.0.0.dist-info", "entry_points.txt"), encoding="utf-8") as f:
        assert f.read().split() == ["[vllm.general_plugins]", "sparkops_ple", "=", "sparkops_vllm_ple:register"]
    with open(os.path.join(base, "pyproject.toml"), encoding="utf-8") as f:
        assert 'sparkops_ple = "sparkops_vllm_ple:register"' in f.read()


def test_a_refusal_is_the_line_the_play_quotes():
    """vllm_status quotes the last exception line of a failed start that is not vLLM's wrapper:
    the plugin's refusal must look like one (a class named ...Error), or the play would quote
    "Engine core initialization failed" instead of the table."""
    from ansible_collections.sparkops.appliance.plugins.modules import vllm_status  # pylint: disable=import-outside-toplevel

    refusal = "%s.%s: /opt/sparkops/ple/ple.pack: stale pack: ... table %s changed" % (
        pack.PackMismatchError.__module__, pack.PackMismatchError.__name__, PLE)
    lines = ["(EngineCore pid=82) ERROR 11-29 23:07:01 [core.py:1510] " + refusal,
             "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above."]
    assert vllm_status.telling_line(lines) == refusal
