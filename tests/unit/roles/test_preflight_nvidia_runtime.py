"""preflight refuses a Spark whose Docker engine does not list the nvidia runtime (when a GPU is
expected), naming the fix; the docker CLI and nvidia-smi are stand-ins on PATH (no GPU here).

One ansible-playbook start runs the three cases: each a local host of a batch inventory with its own
bin folder of stand-ins, put in front of PATH by the play's environment."""
import json
import os
import stat

import pytest

from harness import batch_inventory, host_outcomes, play_json

PLAY = """
- hosts: sparks
  gather_facts: true
  environment:
    PATH: "{{ case_bin }}:{{ lookup('ansible.builtin.env', 'PATH') }}"
  roles:
    - role: sparkops.appliance.preflight
"""

DOCKER = """#!/bin/sh
case "$1" in
  version) echo 28.3.0 ;;
  info) echo '%s' ;;
esac
"""

# host: (the runtimes docker info lists, spark_expect_gpu)
CASES = {
    "no-nvidia-runtime": (["runc", "io.containerd.runc.v2"], True),
    "nvidia-runtime": (["nvidia", "runc"], True),
    "no-gpu": (["runc"], False),
}
CHECK = "Check that Docker lists the NVIDIA runtime"
debian_only = pytest.mark.skipif(not os.path.exists("/etc/debian_version"), reason="preflight expects a Debian-family host")


def _program(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture(scope="module")
def preflight(tmp_path_factory):
    """{host: (failed, {task name: result})}, from one start."""
    tmp_path = tmp_path_factory.mktemp("preflight")
    hosts = {}
    for host, (runtimes, expect_gpu) in CASES.items():
        bin_dir = tmp_path / host / "bin"
        bin_dir.mkdir(parents=True)
        _program(bin_dir / "docker", DOCKER % json.dumps({name: {"path": name} for name in runtimes}))
        _program(bin_dir / "nvidia-smi", '#!/bin/sh\necho "GPU 0: NVIDIA GB10 (UUID: GPU-1234)"\n')
        hosts[host] = {"spark_expect_gpu": expect_gpu, "preflight_expected_arch": [os.uname().machine],
                       "preflight_min_mem_total_gib": 0, "preflight_min_free_disk_gib": 0,
                       "spark_model_dir": str(tmp_path / host), "case_bin": str(bin_dir)}
    (tmp_path / "play.yml").write_text(PLAY)
    doc = play_json(tmp_path / "play.yml", inventory=batch_inventory(tmp_path, hosts))
    return host_outcomes(doc, CASES)


@debian_only
def test_refuses_an_engine_without_the_nvidia_runtime(preflight):
    failed, tasks = preflight["no-nvidia-runtime"]
    result = tasks[CHECK]
    assert failed and result.get("failed") is True
    assert '["io.containerd.runc.v2", "runc"], not nvidia' in result["msg"]
    assert "playbooks/drivers.yml" in result["msg"]


@debian_only
def test_passes_with_the_runtime_and_skips_without_a_gpu(preflight):
    failed, tasks = preflight["nvidia-runtime"]
    assert not failed and tasks[CHECK].get("failed") is not True
    failed, tasks = preflight["no-gpu"]
    assert not failed and tasks[CHECK].get("skipped") is True
