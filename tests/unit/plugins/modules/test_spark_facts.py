"""spark_facts on files the tests write: in this process (harness.run_module), and once through
Ansible itself (ansible localhost -m ... --check) for the wiring."""
import os
import re
import stat
import sys

import pytest
import yaml

from ansible_collections.sparkops.appliance.plugins.modules import spark_facts

from harness import ROOT
from harness import run_module as run_in_process
from harness import run_adhoc as adhoc

MEMINFO = """MemTotal:       127601232 kB
MemFree:         3012404 kB
MemAvailable:   98765432 kB
SwapTotal:       8388604 kB
"""


def run_module(args, check=False):
    return run_in_process(spark_facts, args, check=check)


def on_path(monkeypatch, bin_dir):
    """Stand-in programs first on PATH, for the module's get_bin_path and run_command."""
    monkeypatch.setenv("PATH", str(bin_dir) + os.pathsep + os.environ["PATH"])


def fake_program(directory, name, script):
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# A docker CLI as the engine answers it: the version, and `docker info`'s runtimes as JSON.
DOCKER = """case "$1" in
  version) echo 28.3.0 ;;
  info) echo '{"runc":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime","args":[]}}' ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def meminfo(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    return path


@pytest.mark.parametrize("check", [False, True])
def test_reads_memory_disk_gpu_and_docker(tmp_path, meminfo, check, monkeypatch):
    """In check mode through Ansible itself (the module found by its name, --check reaching it, the
    facts as a task returns them); outside it in this process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir, "nvidia-smi", 'echo "GPU 0: NVIDIA GB10 (UUID: GPU-1234)"\n')
    fake_program(bin_dir, "docker", DOCKER)
    args = {"meminfo_path": str(meminfo), "disk_path": str(tmp_path / "not" / "yet")}
    if check:
        result = adhoc("spark_facts", args, check=True, path_prefix=str(bin_dir))
    else:
        on_path(monkeypatch, bin_dir)
        result = run_module(args)
    assert result["changed"] is False
    facts = result["ansible_facts"]
    assert round(facts["spark_mem_total_gib"], 2) == 121.69
    assert facts["spark_swap_total_gib"] == pytest.approx(8.0, abs=1e-5)
    assert facts["spark_disk"]["measured_path"] == str(tmp_path)
    assert facts["spark_disk"]["free_gib"] > 0
    assert facts["spark_gpu"] == {"checked": True, "present": True, "error": "",
                                  "names": ["GPU 0: NVIDIA GB10 (UUID: GPU-1234)"]}
    assert facts["spark_docker"] == {"checked": True, "reachable": True, "server_version": "28.3.0", "error": "",
                                     "runtimes": ["nvidia", "runc"]}


def test_reports_a_missing_gpu_and_an_unreachable_engine(tmp_path, meminfo, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir, "nvidia-smi", 'echo "NVIDIA-SMI has failed because it could not communicate" >&2\nexit 9\n')
    fake_program(bin_dir, "docker", 'echo "Cannot connect to the Docker daemon" >&2\nexit 1\n')
    on_path(monkeypatch, bin_dir)
    facts = run_module({"meminfo_path": str(meminfo)})["ansible_facts"]
    assert facts["spark_gpu"]["present"] is False
    assert "could not communicate" in facts["spark_gpu"]["error"]
    assert facts["spark_docker"]["reachable"] is False
    assert "Cannot connect" in facts["spark_docker"]["error"]


def test_skipped_checks_are_marked_unchecked(meminfo):
    facts = run_module({"meminfo_path": str(meminfo), "check_gpu": False, "check_docker": False})["ansible_facts"]
    assert facts["spark_gpu"]["checked"] is False
    assert facts["spark_docker"]["checked"] is False


def test_unreadable_meminfo_fails_naming_the_file(tmp_path):
    bad = tmp_path / "meminfo"
    bad.write_text("MemFree: 1 kB\n")
    result = run_module({"meminfo_path": str(bad), "check_gpu": False, "check_docker": False})
    assert result.get("failed") is True
    assert str(bad) in result["msg"] and "MemTotal" in result["msg"]


def test_runtimes_without_nvidia_and_an_unparsable_info(tmp_path, meminfo, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    on_path(monkeypatch, bin_dir)
    fake_program(bin_dir, "docker", DOCKER.replace('"nvidia":{"path":"nvidia-container-runtime","args":[]}', '"crun":{}'))
    docker = run_module({"meminfo_path": str(meminfo), "check_gpu": False})["ansible_facts"]["spark_docker"]
    assert docker["reachable"] is True and docker["runtimes"] == ["crun", "runc"]
    fake_program(bin_dir, "docker", DOCKER.replace("info) echo", "info) echo not-json; echo"))
    docker = run_module({"meminfo_path": str(meminfo), "check_gpu": False})["ansible_facts"]["spark_docker"]
    assert docker["runtimes"] == [] and "listed no runtimes" in docker["error"]


def test_tells_which_python_modules_import(meminfo):
    # runtime_image installs python3-requests only where this says the import fails
    facts = run_module({"meminfo_path": str(meminfo), "check_gpu": False, "check_docker": False,
                        "python_modules": ["json", "sparkops_no_such_module"]})["ansible_facts"]
    assert facts["spark_python"] == {"executable": sys.executable,
                                     "modules": {"json": True, "sparkops_no_such_module": False}}


# dpkg-query as Debian's answers: the files of an installed package, rc 1 and a message for any other.
DPKG_QUERY = """if [ "$1" = -L ] && [ "$2" = libjemalloc2 ]; then
  printf '/.\\n/usr\\n/usr/lib/aarch64-linux-gnu/libjemalloc.so.2\\n/usr/share/doc/libjemalloc2\\n'
else
  echo "dpkg-query: package '$2' is not installed" >&2; exit 1
fi
"""

MARKER = "# Unified-memory serving host (sparkops.appliance host_tuning)"


def test_reads_what_host_tuning_would_ask_for(tmp_path, meminfo, monkeypatch):
    """The three host readings host_tuning takes from here instead of paying a call for each."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    on_path(monkeypatch, bin_dir)
    fake_program(bin_dir, "dpkg-query", DPKG_QUERY)
    fstab = tmp_path / "fstab"
    fstab.write_text("UUID=abc / ext4 defaults 0 1\n"
                     "/swap.img\tnone\tswap\tsw\t0\t0\n"
                     "#/old.swap none swap sw 0 0\n"
                     "  /dev/sdb2 none swap defaults 0 0\n"
                     "tmpfs /swapdir tmpfs defaults 0 0\n")
    sysctl_dir = tmp_path / "sysctl.d"
    sysctl_dir.mkdir()
    (sysctl_dir / "90-sparkops.conf").write_text("# Ansible managed\n%s.\nvm.min_free_kbytes = 65536\n" % MARKER)
    (sysctl_dir / "50-old-sparkops.conf").write_text("%s.\nvm.vfs_cache_pressure = 200\n" % MARKER)
    (sysctl_dir / "10-other.conf").write_text("vm.swappiness = 10 %s, in the middle of a line\n" % MARKER)
    (sysctl_dir / "notes.txt").write_text(MARKER + "\n")
    facts = run_module({"meminfo_path": str(meminfo), "check_gpu": False, "check_docker": False,
                        "packages": ["libjemalloc2", "sparkops-not-installed"],
                        "fstab_path": str(fstab), "sysctl_dir": str(sysctl_dir)},
                       check=True)["ansible_facts"]
    assert facts["spark_package_files"] == {
        "libjemalloc2": ["/.", "/usr", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2", "/usr/share/doc/libjemalloc2"],
        "sparkops-not-installed": []}
    assert facts["spark_fstab_swap"] == ["/swap.img\tnone\tswap\tsw\t0\t0", "  /dev/sdb2 none swap defaults 0 0"]
    assert facts["spark_sysctl_marked"] == [str(sysctl_dir / "50-old-sparkops.conf"), str(sysctl_dir / "90-sparkops.conf")]


def test_missing_fstab_and_sysctl_dir_read_as_empty(tmp_path, meminfo):
    facts = run_module({"meminfo_path": str(meminfo), "check_gpu": False, "check_docker": False, "packages": [],
                        "fstab_path": str(tmp_path / "no-fstab"), "sysctl_dir": str(tmp_path / "no-dir")})["ansible_facts"]
    assert facts["spark_package_files"] == {}
    assert facts["spark_fstab_swap"] == []
    assert facts["spark_sysctl_marked"] == []


def test_an_empty_sysctl_marker_is_refused(meminfo):
    result = run_module({"meminfo_path": str(meminfo), "check_gpu": False, "check_docker": False, "sysctl_marker": " "})
    assert result.get("failed") is True and "sysctl_marker" in result["msg"]


def test_the_default_marker_is_the_one_host_tuning_writes_and_finds(tmp_path, meminfo):
    """The marker has three homes: host_tuning's template writes it, the role's own find (where
    preflight did not run) searches for it, and this module's default recognises it. A drift
    between them would leave an earlier sysctl.d file behind without a word."""
    template = open(os.path.join(ROOT, "roles", "host_tuning", "templates", "sysctl.conf.j2")).read()
    written = [line for line in template.splitlines() if "{{" not in line and "{%" not in line]
    tasks = yaml.safe_load(open(os.path.join(ROOT, "roles", "host_tuning", "tasks", "main.yml")))
    find = [t["ansible.builtin.find"] for t in tasks if "ansible.builtin.find" in t]
    assert len(find) == 1 and any(re.match(find[0]["contains"], line) for line in written), find
    sysctl_dir = tmp_path / "sysctl.d"
    sysctl_dir.mkdir()
    (sysctl_dir / "90-sparkops.conf").write_text("# Ansible managed\n" + "\n".join(written) + "\n")
    facts = run_module({"meminfo_path": str(meminfo), "check_gpu": False, "check_docker": False, "packages": [],
                        "sysctl_dir": str(sysctl_dir)})["ansible_facts"]
    assert facts["spark_sysctl_marked"] == [str(sysctl_dir / "90-sparkops.conf")]


def test_reads_the_loaded_driver_and_the_kernel_release_without_a_gpu(tmp_path, meminfo):
    (tmp_path / "nvidia-version").write_text("590.44.01\n")
    (tmp_path / "osrelease").write_text("7.0.0-1019-nvidia\n")
    facts = run_module({"meminfo_path": str(meminfo), "check_gpu": False, "check_docker": False, "packages": [],
                        "driver_version_path": str(tmp_path / "nvidia-version"),
                        "kernel_release_path": str(tmp_path / "osrelease")})["ansible_facts"]
    assert facts["spark_driver_version"] == "590.44.01"
    assert facts["spark_kernel_release"] == "7.0.0-1019-nvidia"


def test_no_driver_loaded_reads_as_empty_and_the_kernel_by_default_is_this_one(tmp_path, meminfo):
    facts = run_module({"meminfo_path": str(meminfo), "check_gpu": False, "check_docker": False, "packages": [],
                        "driver_version_path": str(tmp_path / "no-module")})["ansible_facts"]
    assert facts["spark_driver_version"] == ""
    assert facts["spark_kernel_release"] == os.uname().release
