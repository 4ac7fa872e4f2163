"""The drivers role's input checks (tasks_from=validate, as site.yml's first play runs them): every bad
value is refused with a message naming the variable, on the controller, before any host change.

One ansible-playbook start checks every case (harness.batch_inventory: one local host per case, its
value a host variable, above the role defaults as the -e of one start per case was): a first play
runs tasks_from=validate on the value cases, a second the whole role on the checked-roles cases."""
import json

import pytest

from harness import batch_inventory, host_results, play_json

PLAY = """
- name: Validate
  hosts: validate
  gather_facts: false
  tasks:
    - name: Validate
      ansible.builtin.include_role:
        name: sparkops.appliance.drivers
        tasks_from: validate

- name: Role
  hosts: role
  gather_facts: false
  tasks:
    - name: Remember which roles' inputs are checked (as site.yml's first play does)
      ansible.builtin.set_fact:
        __sparkops_checked_roles: "{{ case_checked }}"
    - name: The role, as a later play of site.yml applies it
      ansible.builtin.include_role:
        name: sparkops.appliance.drivers
"""

BAD = [
    ({"drivers_force": "false"}, 'drivers_force = "false": a string, not a YAML boolean'),
    ({"drivers_manage": "yes"}, 'drivers_manage = "yes": a string, not a YAML boolean'),
    ({"drivers_reboot_allowed": 1}, "drivers_reboot_allowed = 1: a whole number, not a YAML boolean"),
    ({"drivers_driver_branch": 580}, "drivers_driver_branch = 580: a whole number, not a string"),
    ({"drivers_driver_branch": "58O"}, 'drivers_driver_branch = "58O": not three digits'),
    ({"drivers_driver_package": "nvidia driver"}, 'drivers_driver_package = "nvidia driver": not a Debian package name'),
    ({"drivers_container_toolkit_version": "1.18.0-1\nPin: *"}, "drivers_container_toolkit_version = \"1.18.0-1\\nPin: *\": the value holds a newline"),
    ({"drivers_container_toolkit_version": "latest"}, 'drivers_container_toolkit_version = "latest": not a Debian package version'),
    ({"drivers_driver_version": 580}, "drivers_driver_version = 580: a whole number, not a string"),
    ({"drivers_container_toolkit_packages": "nvidia-container-toolkit"},
     'drivers_container_toolkit_packages = "nvidia-container-toolkit": a string, not a list'),
    ({"drivers_docker_packages": ["docker.io; rm -rf /"]},
     'drivers_docker_packages = ["docker.io; rm -rf /"]: element [0] ("docker.io; rm -rf /") is not a Debian package name'),
    ({"drivers_apt_sources": [{"name": "x", "line": "deb file:/x ./\ndeb http://evil ./"}]},
     'drivers_apt_sources = [{"line": "deb file:/x ./\\ndeb http://evil ./", "name": "x"}]: drivers_apt_sources[0]["line"] holds a newline'),
    ({"drivers_apt_sources": [{"name": "../x", "line": "deb file:/x ./"}]},
     'drivers_apt_sources = [{"line": "deb file:/x ./", "name": "../x"}]: the entry {"line": "deb file:/x ./", "name": "../x"} has name "../x"'),
    ({"drivers_apt_sources": [{"name": "x", "line": "deb file:/x ./", "keyurl": "http://k"}]},
     'drivers_apt_sources = [{"keyurl": "http://k", "line": "deb file:/x ./", "name": "x"}]: the entry {"keyurl": "http://k", '
     '"line": "deb file:/x ./", "name": "x"} has keyurl (only name, line, key_url, and nothing else)'),
    ({"drivers_apt_sources": [{"name": "x", "line": "deb file:/x ./", "key_url": "ftp://k"}]},
     'drivers_apt_sources = [{"key_url": "ftp://k", "line": "deb file:/x ./", "name": "x"}]: the entry'),
    # a key_url "" would be fetched as the URL "": an entry without a key leaves key_url out
    ({"drivers_apt_sources": [{"name": "x", "line": "deb file:/x ./", "key_url": ""}]},
     'drivers_apt_sources = [{"key_url": "", "line": "deb file:/x ./", "name": "x"}]: the entry'),
    ({"drivers_apt_sources": [{"line": "deb file:/x ./"}]},
     'drivers_apt_sources = [{"line": "deb file:/x ./"}]: the entry {"line": "deb file:/x ./"} lacks name'),
    ({"drivers_apt_sources": [{"name": "x", "line": "rpm x"}]},
     'drivers_apt_sources = [{"line": "rpm x", "name": "x"}]: the entry {"line": "rpm x", "name": "x"} has line "rpm x", not one apt line'),
    ({"drivers_docker_daemon_json": "/etc/docker/daemon.yaml"},
     'drivers_docker_daemon_json = "/etc/docker/daemon.yaml": not an absolute path to a .json file'),
    ({"drivers_docker_service": "docker service"}, 'drivers_docker_service = "docker service": not a systemd unit name'),
    ({"drivers_docker_runtime": {"path": ""}}, 'drivers_docker_runtime = {"path": ""}: the entry {"path": ""} has path "", not a non-empty string'),
    ({"drivers_docker_daemon_json": "docker/daemon.json"}, 'drivers_docker_daemon_json = "docker/daemon.json": not an absolute path'),
    ({"drivers_docker_runtime": {"args": []}}, 'drivers_docker_runtime = {"args": []}: the entry {"args": []} lacks path'),
    ({"drivers_smoke_image": "ubuntu:24.04 --privileged"}, 'drivers_smoke_image = "ubuntu:24.04 --privileged": not one word without whitespace'),
    ({"drivers_reboot_timeout_s": 0}, "drivers_reboot_timeout_s = 0: below 1"),
]
GOOD = {"spark_expect_gpu": True, "drivers_driver_version": "580.95.05-0ubuntu1",
        "drivers_apt_sources": [{"name": "mirror", "line": "deb [trusted=yes] file:/srv/m ./",
                                 "key_url": "file:///srv/m/key.asc"}]}

ROLE_CASES = [
    ("[]", True),                                                          # the role alone checks its inputs
    ("['sparkops.appliance.memory_plan', 'sparkops.appliance.serve']", True),  # rollout.yml's list: not this role
    ("['sparkops.appliance.host_tuning', 'sparkops.appliance.drivers']", False),  # site.yml checked them already
]
# The case where the role says its message names its host: that host is called localhost, as the one
# host of a start per case was.
ROLE_HOSTS = {checked: ("localhost" if not refused else "role-%d" % i) for i, (checked, refused) in enumerate(ROLE_CASES)}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("drivers-validate")
    (tmp_path / "play.yml").write_text(PLAY)
    cases = {"bad-%d" % i: extra for i, (extra, _m) in enumerate(BAD)}
    cases["good"] = GOOD
    validate = batch_inventory(tmp_path, cases, group="validate", name="validate.json")
    # drivers_manage false: past its checks the role only says so (nothing on this host changes).
    role = batch_inventory(tmp_path, {ROLE_HOSTS[checked]: {"case_checked": json.loads(checked.replace("'", '"')),
                                                            "drivers_manage": False, "drivers_force": "false"}
                                      for checked, _refused in ROLE_CASES}, group="role", name="role.json")
    return play_json(tmp_path / "play.yml", inventory=validate, args=["-i", role])


def validate(doc, host):
    """(failed, messages) of one case: whether the host failed (the rc of a start of its own), and the
    messages of its failed results, as one start per case joined them."""
    results = [r for play, _t, r in host_results(doc, host) if play == "Validate"]
    assert results, "%s ran no task" % host
    failed = [r for r in results if r.get("failed") or r.get("unreachable")]
    messages = []
    for result in failed:
        messages.append(result.get("msg", ""))
        messages.extend(r.get("msg", "") for r in result.get("results", []) if r.get("failed"))
    return bool(failed) or doc["stats"][host]["failures"] > 0, " | ".join(m for m in messages if m)


@pytest.mark.parametrize("extra, message", BAD, ids=[list(e)[0] + "-%d" % i for i, (e, _m) in enumerate(BAD)])
def test_bad_value_is_refused_naming_it(batch, extra, message):
    failed, messages = validate(batch, "bad-%d" % BAD.index((extra, message)))
    assert failed
    assert message in messages


def test_defaults_and_a_mirror_pass(batch):
    failed, messages = validate(batch, "good")
    assert (failed, messages, batch["stats"]["good"]["unreachable"]) == (False, "", 0)


@pytest.mark.parametrize("checked, refused", ROLE_CASES)
def test_the_role_skips_its_own_checks_only_when_the_first_play_made_them(batch, checked, refused):
    host = ROLE_HOSTS[checked]
    results = [r for _p, _t, r in host_results(batch, host)]
    tasks = {t: r for play, t, r in host_results(batch, host) if play == "Role"}
    stats = batch["stats"][host]
    if refused:
        assert stats["failures"] + stats["unreachable"] > 0
        assert json.dumps('drivers_force = "false": a string, not a YAML boolean')[1:-1] in json.dumps(results)
    else:
        assert stats["failures"] + stats["unreachable"] == 0, results
        assert tasks["sparkops.appliance.drivers : Check the inputs"].get("skipped") is True
        assert "is not managed on localhost" in tasks["sparkops.appliance.drivers : Say that the GPU stack is not managed on this host"]["msg"]
