"""The drivers role's GPU checks (tasks_from=gpu) with stand-ins for nvidia-smi and the docker CLI on
PATH (no GPU here): a GPU listed on the host and inside a --gpus all container passes; a driver that
does not answer, or a container that does not see the GPU, fails with a message that says what to do."""
import json
import os
import stat
import subprocess
import sys

from ansible_json import stdout_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: GPU checks
      ansible.builtin.include_role:
        name: sparkops.appliance.drivers
        tasks_from: gpu
"""
GPU = 'echo "GPU 0: NVIDIA GB10 (UUID: GPU-1234)"\n'
NO_DRIVER = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2\nexit 9\n'


def run_checks(tmp_path, smi, container, extra=None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("nvidia-smi", smi), ("docker", 'echo "$@" >> %s\n%s' % (tmp_path / "docker.args", container))):
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "play.yml").write_text(PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", PATH=str(bin_dir) + os.pathsep + os.environ["PATH"])
    variables = dict({"drivers_persistence_mode": False}, **(extra or {}))
    cmd = ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
           "-e", json.dumps(variables), str(tmp_path / "play.yml")]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    out = stdout_json(proc)
    failed = [h.get("msg", "") for t in out["plays"][0]["tasks"] for h in t["hosts"].values() if h.get("failed")]
    args = (tmp_path / "docker.args").read_text() if (tmp_path / "docker.args").exists() else ""
    return proc.returncode, " | ".join(failed), args


def test_a_gpu_on_the_host_and_in_the_container_passes(tmp_path):
    rc, failed, args = run_checks(tmp_path, GPU, GPU)
    assert (rc, failed) == (0, "")
    assert args.split() == ["run", "--rm", "--gpus", "all", "ubuntu:24.04", "nvidia-smi", "-L"]


def test_a_driver_that_does_not_answer_fails_naming_a_reboot(tmp_path):
    rc, failed, args = run_checks(tmp_path, NO_DRIVER, GPU)
    assert rc != 0
    assert "nvidia-smi -L lists no GPU" in failed and "couldn't communicate" in failed and "reboot" in failed
    assert args == ""                      # the smoke is not reached


def test_a_container_without_the_gpu_fails_and_the_smoke_can_be_switched_off(tmp_path):
    rc, failed, _args = run_checks(tmp_path, GPU, 'echo "unknown or invalid runtime name: nvidia" >&2\nexit 125\n')
    assert rc != 0
    assert "docker run --gpus all ubuntu:24.04 nvidia-smi -L failed" in failed and "invalid runtime" in failed
    (tmp_path / "off").mkdir()
    rc, failed, args = run_checks(tmp_path / "off", GPU, "exit 125\n", {"drivers_smoke": False})
    assert (rc, failed, args) == (0, "", "")
