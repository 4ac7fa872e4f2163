"""sparkops.appliance.plan_inputs: the memory plan's readings of a host, in one call."""
import json
import os

import pytest

from ansible_collections.sparkops.appliance.plugins.module_utils._disk import tree_bytes
from ansible_collections.sparkops.appliance.plugins.modules import plan_inputs

ALL = {"measure_weights": True, "read_config": True, "measure_ple": True, "read_meminfo": False,
       "meminfo_path": "/proc/meminfo"}


def params(ckpt="", ple="", **extra):
    values = dict(ALL, checkpoint_dir=str(ckpt) if ckpt else "", ple_file=str(ple) if ple else "")
    values.update(extra)
    return values


@pytest.fixture
def snapshot(tmp_path):
    """A Hugging Face-like snapshot: files linked into blobs/, a hidden manifest, a linked folder."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "a").write_bytes(b"a" * 3000)
    (blobs / "sub").mkdir()
    (blobs / "sub" / "b").write_bytes(b"b" * 500)
    ckpt = tmp_path / "home" / ".cache" / "ckpt"       # under a hidden folder: still measured
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    os.symlink(str(blobs / "a"), str(ckpt / "model.safetensors"))
    os.symlink(str(blobs / "sub"), str(ckpt / "linked"))
    os.symlink(str(ckpt), str(ckpt / "linked" / "back"))  # a link back up the tree: walked once
    os.symlink(str(tmp_path / "gone"), str(ckpt / "broken"))
    (ckpt / ".sparkops-manifest.json").write_bytes(b"m" * 7000)
    (ckpt / ".cache").mkdir()
    (ckpt / ".cache" / "x").write_bytes(b"x" * 9000)
    (ckpt / "model.ple").write_bytes(b"p" * 11000)
    os.mkfifo(str(ckpt / "pipe"))                     # not a regular file: counts nothing
    config_bytes = (ckpt / "config.json").stat().st_size
    return ckpt, ckpt / "model.ple", 3000 + 500 + config_bytes


def test_everything_in_one_reading(snapshot):
    ckpt, ple, weights = snapshot
    got = plan_inputs.read(params(ckpt, ple, read_meminfo=True))
    assert got["checkpoint_isdir"] is True
    assert got["weight_bytes"] == weights
    assert got["ple_bytes"] == 11000
    assert got["model_config"] == {"num_hidden_layers": 2}
    with open("/proc/meminfo") as handle:
        kib = int(handle.readline().split()[1])
    assert got["mem_total_gib"] == pytest.approx(kib / 1048576.0)


def test_the_pack_counts_as_weights_when_it_is_not_named(snapshot):
    ckpt, _ple, weights = snapshot
    assert tree_bytes(str(ckpt)) == weights + 11000


def test_only_what_is_asked_for(snapshot):
    ckpt, ple, _weights = snapshot
    got = plan_inputs.read(params(ckpt, ple, measure_weights=False, read_config=False, measure_ple=False))
    assert got == {"checkpoint_isdir": True, "weight_bytes": None, "ple_bytes": None, "model_config": None,
                   "mem_total_gib": None}


def test_nothing_there_is_null_not_an_error(tmp_path):
    got = plan_inputs.read(params(tmp_path / "none", tmp_path / "none.ple"))
    assert got == {"checkpoint_isdir": False, "weight_bytes": None, "ple_bytes": None, "model_config": None,
                   "mem_total_gib": None}
    assert plan_inputs.read(params())["checkpoint_isdir"] is False


@pytest.mark.parametrize("text, needle", [("{not json", "is not JSON"), ("[1, 2]", "holds no JSON object")])
def test_a_bad_config_json_names_the_file(tmp_path, text, needle):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError) as err:
        plan_inputs.read(params(tmp_path))
    assert needle in str(err.value) and str(tmp_path / "config.json") in str(err.value)


def test_relative_paths_and_a_bad_meminfo_are_refused(tmp_path):
    with pytest.raises(ValueError, match="checkpoint_dir must be an absolute path"):
        plan_inputs.read(params("models/x"))
    bad = tmp_path / "meminfo"
    bad.write_text("MemFree: 12 kB\n")
    with pytest.raises(ValueError, match="MemTotal"):
        plan_inputs.read(params(read_meminfo=True, meminfo_path=str(bad)))
