# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NCCL and vLLM versions a runtime image ships, read without a GPU (standard library only).

Run by the runtime_image role in a throwaway container of the image just built (no network), by the
Python that runs vllm, the script on stdin. Prints one JSON line:
{"nccl": VERSION or "none", "nccl_from": where it was read, "vllm": VERSION or ""}.

NCCL: the library vLLM's torch loads, read in this order:
  1. torch.cuda.nccl.version() (ncclGetVersion; a CPU build of torch has no NCCL and says so);
  2. the version of an nvidia-nccl-cu* wheel (pip's NCCL, which a CUDA torch loads);
  3. a system libnccl, its version from the file name ldconfig points at (libnccl.so.2.30.4);
  4. "none": the image ships no NCCL.
vLLM: importlib.metadata's version of the distribution vllm, before any "+local" part.
"""
import importlib.metadata
import json
import os
import re
import subprocess
import sys

_NCCL_WHEEL = re.compile(r"^nvidia[-_.]nccl[-_.]cu\d+$")
_NCCL_FILE = re.compile(r"libnccl\.so\.(\d+(?:\.\d+)+)$")


def _from_code(code):
    """An NCCL_VERSION_CODE (22304 since 2.9: major*10000 + minor*100 + patch; 2708 before)."""
    code = int(code)
    if code >= 10000:
        return (code // 10000, code // 100 % 100, code % 100)
    return (code // 1000, code // 100 % 10, code % 100)


def nccl_from_torch():
    try:
        import torch   # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    if not hasattr(torch._C, "_nccl_version"):    # pylint: disable=protected-access
        return None                                # a CPU build: no NCCL in torch
    version = torch.cuda.nccl.version()
    parts = _from_code(version) if isinstance(version, int) else tuple(version)[:3]
    return ".".join(str(part) for part in parts)


def nccl_from_wheel():
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if _NCCL_WHEEL.match(name):
            return dist.version
    return None


def nccl_from_system():
    for program in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            listing = subprocess.run([program, "-p"], capture_output=True, text=True, check=False).stdout
        except OSError:
            continue
        for line in listing.splitlines():
            if "libnccl.so" not in line or "=>" not in line:
                continue
            found = _NCCL_FILE.search(os.path.realpath(line.split("=>", 1)[1].strip()))
            if found:
                return found.group(1)
        return None
    return None


def nccl():
    for source, read in (("torch.cuda.nccl.version()", nccl_from_torch), ("the nvidia-nccl wheel", nccl_from_wheel),
                         ("the system libnccl (ldconfig)", nccl_from_system)):
        version = read()
        if version:
            return version, source
    return "none", "none found (no torch NCCL, no nvidia-nccl wheel, no system libnccl)"


def vllm():
    try:
        return importlib.metadata.version("vllm").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return ""


def main():
    version, source = nccl()
    print(json.dumps({"nccl": version, "nccl_from": source, "vllm": vllm()}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
