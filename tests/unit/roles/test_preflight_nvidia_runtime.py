"""preflight refuses a Spark whose Docker engine does not list the nvidia runtime (when a GPU is
expected), naming the fix; the docker CLI and nvidia-smi are stand-ins on PATH (no GPU here)."""
import json
import os
import stat
import subprocess
import sys

import pytest

from ansible_json import stdout_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PLAY = """
- hosts: localhost
  gather_facts: true
  roles:
    - role: sparkops.appliance.preflight
"""

DOCKER = """#!/bin/sh
case "$1" in
  version) echo 28.3.0 ;;
  info) echo '%s' ;;
esac
"""


def _program(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_preflight(tmp_path, runtimes, expect_gpu=True):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _program(bin_dir / "docker", DOCKER % json.dumps({name: {"path": name} for name in runtimes}))
    _program(bin_dir / "nvidia-smi", '#!/bin/sh\necho "GPU 0: NVIDIA GB10 (UUID: GPU-1234)"\n')
    (tmp_path / "play.yml").write_text(PLAY)
    extra = {"spark_expect_gpu": expect_gpu, "preflight_expected_arch": [os.uname().machine],
             "preflight_min_mem_total_gib": 0, "preflight_min_free_disk_gib": 0, "spark_model_dir": str(tmp_path)}
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", PATH=str(bin_dir) + os.pathsep + os.environ["PATH"])
    cmd = ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
           "-e", json.dumps(extra), str(tmp_path / "play.yml")]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    tasks = stdout_json(proc)["plays"][0]["tasks"]
    return proc.returncode, {t["task"]["name"].split(" : ", 1)[-1]: t["hosts"]["localhost"] for t in tasks}


@pytest.mark.skipif(not os.path.exists("/etc/debian_version"), reason="preflight expects a Debian-family host")
def test_refuses_an_engine_without_the_nvidia_runtime(tmp_path):
    rc, tasks = run_preflight(tmp_path, ["runc", "io.containerd.runc.v2"])
    result = tasks["Check that Docker lists the NVIDIA runtime"]
    assert rc != 0 and result.get("failed") is True
    assert '["io.containerd.runc.v2", "runc"], not nvidia' in result["msg"]
    assert "playbooks/drivers.yml" in result["msg"]


@pytest.mark.skipif(not os.path.exists("/etc/debian_version"), reason="preflight expects a Debian-family host")
def test_passes_with_the_runtime_and_skips_without_a_gpu(tmp_path):
    rc, tasks = run_preflight(tmp_path, ["nvidia", "runc"])
    assert rc == 0 and tasks["Check that Docker lists the NVIDIA runtime"].get("failed") is not True
    (tmp_path / "nogpu").mkdir()
    rc, tasks = run_preflight(tmp_path / "nogpu", ["runc"], expect_gpu=False)
    assert rc == 0 and tasks["Check that Docker lists the NVIDIA runtime"].get("skipped") is True
