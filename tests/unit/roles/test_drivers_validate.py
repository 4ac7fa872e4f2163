"""The drivers role's input checks (tasks_from=validate, as site.yml's first play runs them): every bad
value is refused with a message naming the variable, on the controller, before any host change."""
import json
import os
import subprocess
import sys

import pytest

from ansible_json import stdout_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Validate
      ansible.builtin.include_role:
        name: sparkops.appliance.drivers
        tasks_from: validate
"""


def validate(tmp_path, extra):
    (tmp_path / "play.yml").write_text(PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    cmd = ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
           "-e", json.dumps(extra), str(tmp_path / "play.yml")]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    out = stdout_json(proc)
    failed = [(t["task"]["name"], h) for t in out["plays"][0]["tasks"] for h in t["hosts"].values() if h.get("failed")]
    messages = []
    for _name, result in failed:
        messages.append(result.get("msg", ""))
        messages.extend(r.get("msg", "") for r in result.get("results", []) if r.get("failed"))
    return proc.returncode, " | ".join(m for m in messages if m)


BAD = [
    ({"drivers_force": "false"}, "drivers_force must be a YAML boolean"),
    ({"drivers_manage": "yes"}, "drivers_manage must be a YAML boolean"),
    ({"drivers_reboot_allowed": 1}, "drivers_reboot_allowed must be a YAML boolean"),
    ({"drivers_driver_branch": 580}, "drivers_driver_branch is 580"),
    ({"drivers_driver_branch": "58O"}, "drivers_driver_branch is \"58O\""),
    ({"drivers_driver_package": "nvidia driver"}, "drivers_driver_package is \"nvidia driver\""),
    ({"drivers_container_toolkit_version": "1.18.0-1\nPin: *"}, "drivers_container_toolkit_version is"),
    ({"drivers_container_toolkit_version": "latest"}, "not a Debian package version"),
    ({"drivers_driver_version": 580}, "drivers_driver_version is 580"),
    ({"drivers_container_toolkit_packages": "nvidia-container-toolkit"}, "drivers_container_toolkit_packages is"),
    ({"drivers_docker_packages": ["docker.io; rm -rf /"]}, "drivers_docker_packages is"),
    ({"drivers_apt_sources": [{"name": "x", "line": "deb file:/x ./\ndeb http://evil ./"}]}, "drivers_apt_sources has the entry"),
    ({"drivers_apt_sources": [{"name": "../x", "line": "deb file:/x ./"}]}, "drivers_apt_sources has the entry"),
    ({"drivers_apt_sources": [{"name": "x", "line": "deb file:/x ./", "keyurl": "http://k"}]}, "and nothing else"),
    ({"drivers_apt_sources": [{"name": "x", "line": "deb file:/x ./", "key_url": "ftp://k"}]}, "drivers_apt_sources has the entry"),
    ({"drivers_docker_daemon_json": "docker/daemon.json"}, "drivers_docker_daemon_json \"docker/daemon.json\""),
    ({"drivers_docker_runtime": {"args": []}}, "drivers_docker_runtime {\"args\": []}"),
    ({"drivers_smoke_image": "ubuntu:24.04 --privileged"}, "drivers_smoke_image"),
    ({"drivers_reboot_timeout_s": 0}, "drivers_reboot_timeout_s 0"),
]


@pytest.mark.parametrize("extra, message", BAD, ids=[list(e)[0] + "-%d" % i for i, (e, _m) in enumerate(BAD)])
def test_bad_value_is_refused_naming_it(tmp_path, extra, message):
    rc, messages = validate(tmp_path, extra)
    assert rc != 0
    assert message in messages


def test_defaults_and_a_mirror_pass(tmp_path):
    rc, messages = validate(tmp_path, {"spark_expect_gpu": True, "drivers_driver_version": "580.95.05-0ubuntu1",
                                       "drivers_apt_sources": [{"name": "mirror", "line": "deb [trusted=yes] file:/srv/m ./",
                                                                "key_url": "file:///srv/m/key.asc"}]})
    assert (rc, messages) == (0, "")


ROLE_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Remember which roles' inputs are checked (as site.yml's first play does)
      ansible.builtin.set_fact:
        __sparkops_checked_roles: {checked}
    - name: The role, as a later play of site.yml applies it
      ansible.builtin.include_role:
        name: sparkops.appliance.drivers
"""


@pytest.mark.parametrize("checked, refused", [
    ("[]", True),                                                          # the role alone checks its inputs
    ("['sparkops.appliance.memory_plan', 'sparkops.appliance.serve']", True),  # rollout.yml's list: not this role
    ("['sparkops.appliance.host_tuning', 'sparkops.appliance.drivers']", False),  # site.yml checked them already
])
def test_the_role_skips_its_own_checks_only_when_the_first_play_made_them(tmp_path, checked, refused):
    (tmp_path / "play.yml").write_text(ROLE_PLAY.format(checked=checked))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    # drivers_manage false: past its checks the role only says so (nothing on this host changes).
    extra = {"drivers_manage": False, "drivers_force": "false"}
    cmd = ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
           "-e", json.dumps(extra), str(tmp_path / "play.yml")]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    tasks = {t["task"]["name"]: t["hosts"]["localhost"] for t in stdout_json(proc)["plays"][0]["tasks"]}
    if refused:
        assert proc.returncode != 0
        assert "drivers_force must be a YAML boolean" in proc.stdout
    else:
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert tasks["sparkops.appliance.drivers : Check the inputs"].get("skipped") is True
        assert "is not managed on localhost" in tasks["sparkops.appliance.drivers : Say that the GPU stack is not managed on this host"]["msg"]
