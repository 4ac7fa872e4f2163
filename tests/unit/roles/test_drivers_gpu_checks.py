"""The drivers role's GPU checks (tasks_from=gpu) with stand-ins for nvidia-smi and the docker CLI on
PATH (no GPU here): a GPU listed on the host and inside a --gpus all container passes; a driver that
does not answer, or a container that does not see the GPU, fails with a message that says what to do.

One ansible-playbook start runs every case: each a local host of a batch inventory with its own bin
folder of stand-ins, put in front of PATH by the play's environment."""
import stat

import pytest

from harness import batch_inventory, host_results, play_json

PLAY = """
- hosts: sparks
  gather_facts: false
  environment:
    PATH: "{{ case_bin }}:{{ lookup('ansible.builtin.env', 'PATH') }}"
  tasks:
    - name: GPU checks
      ansible.builtin.include_role:
        name: sparkops.appliance.drivers
        tasks_from: gpu
"""
GPU = 'echo "GPU 0: NVIDIA GB10 (UUID: GPU-1234)"\n'
NO_DRIVER = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2\nexit 9\n'

# host: (nvidia-smi, docker, extra variables)
CASES = {
    "gpu": (GPU, GPU, {}),
    "no-driver": (NO_DRIVER, GPU, {}),
    "no-gpu-in-container": (GPU, 'echo "unknown or invalid runtime name: nvidia" >&2\nexit 125\n', {}),
    "smoke-off": (GPU, "exit 125\n", {"drivers_smoke": False}),
}


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """{host: (failed, failure messages, the docker stand-in's arguments)}, from one start."""
    tmp_path = tmp_path_factory.mktemp("gpu-checks")
    hosts = {}
    for host, (smi, container, extra) in CASES.items():
        bin_dir = tmp_path / host / "bin"
        bin_dir.mkdir(parents=True)
        for name, body in (("nvidia-smi", smi), ("docker", 'echo "$@" >> %s\n%s' % (tmp_path / host / "docker.args", container))):
            path = bin_dir / name
            path.write_text("#!/bin/sh\n" + body)
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        hosts[host] = dict({"drivers_persistence_mode": False, "case_bin": str(bin_dir)}, **extra)
    (tmp_path / "play.yml").write_text(PLAY)
    doc = play_json(tmp_path / "play.yml", inventory=batch_inventory(tmp_path, hosts))
    out = {}
    for host in CASES:
        results = [r for _p, _t, r in host_results(doc, host)]
        assert results, "%s ran no task" % host
        failed = [r.get("msg", "") for r in results if r.get("failed")]
        stats = doc["stats"][host]
        args_file = tmp_path / host / "docker.args"
        args = args_file.read_text() if args_file.exists() else ""
        out[host] = (stats["failures"] + stats["unreachable"] > 0, " | ".join(failed), args)
    return out


def test_a_gpu_on_the_host_and_in_the_container_passes(checks):
    failed, messages, args = checks["gpu"]
    assert (failed, messages) == (False, "")
    assert args.split() == ["run", "--rm", "--gpus", "all", "ubuntu:24.04", "nvidia-smi", "-L"]


def test_a_driver_that_does_not_answer_fails_naming_a_reboot(checks):
    failed, messages, args = checks["no-driver"]
    assert failed
    assert "nvidia-smi -L lists no GPU" in messages and "couldn't communicate" in messages and "reboot" in messages
    assert args == ""                      # the smoke is not reached


def test_a_container_without_the_gpu_fails_and_the_smoke_can_be_switched_off(checks):
    failed, messages, _args = checks["no-gpu-in-container"]
    assert failed
    assert "docker run --gpus all ubuntu:24.04 nvidia-smi -L failed" in messages and "invalid runtime" in messages
    assert checks["smoke-off"] == (False, "", "")
