"""docker_daemon_json on files the tests write: in this process (harness.run_module), and once
through Ansible itself (ansible localhost -m ...) for the wiring."""
import json
import os

import pytest

from ansible_collections.sparkops.appliance.plugins.modules import docker_daemon_json

from harness import run_module as run_in_process
from harness import run_adhoc as adhoc

NVIDIA = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}


def run_module(args, check=False, diff=False):
    return run_in_process(docker_daemon_json, args, check=check, diff=diff)


def snapshot(path):
    st = os.stat(path)
    return path.read_bytes(), st.st_ino, st.st_mtime_ns, st.st_mode & 0o7777


def test_creates_the_file_with_the_runtime(tmp_path):
    """Through Ansible itself: the module found by its name, its result as a task returns it."""
    path = tmp_path / "daemon.json"
    result = adhoc("docker_daemon_json", {"path": str(path), "settings": NVIDIA})
    assert result["changed"] is True and result["created"] is True
    assert json.loads(path.read_text()) == NVIDIA
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_keeps_unrelated_keys_and_other_runtimes(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"storage-driver": "vfs", "log-opts": {"max-size": "10m"},
                                "runtimes": {"crun": {"path": "/usr/bin/crun"}}, "iptables": False}))
    path.chmod(0o600)
    result = run_module({"path": str(path), "settings": NVIDIA})
    assert result["changed"] is True
    assert json.loads(path.read_text()) == {
        "storage-driver": "vfs", "log-opts": {"max-size": "10m"}, "iptables": False,
        "runtimes": {"crun": {"path": "/usr/bin/crun"}, "nvidia": {"path": "nvidia-container-runtime", "args": []}}}
    # An existing file keeps its own permissions.
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_second_run_changes_nothing_and_keeps_the_file(tmp_path):
    path = tmp_path / "daemon.json"
    # Already holds the settings, in a formatting of its own: compared as JSON, not rewritten.
    path.write_text('{"runtimes":{"nvidia":{"args":[],"path":"nvidia-container-runtime"}},"debug":true}')
    before = snapshot(path)
    result = run_module({"path": str(path), "settings": NVIDIA})
    assert result["changed"] is False
    assert snapshot(path) == before


def test_write_is_a_rename_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}\n')
    inode = os.stat(path).st_ino
    assert run_module({"path": str(path), "settings": NVIDIA})["changed"] is True
    assert os.stat(path).st_ino != inode
    assert sorted(os.listdir(tmp_path)) == ["daemon.json"]


@pytest.mark.parametrize("existing", [None, '{"debug": true}\n'])
def test_check_mode_shows_the_diff_and_writes_nothing(tmp_path, existing):
    path = tmp_path / "daemon.json"
    if existing is not None:
        path.write_text(existing)
        before = snapshot(path)
    result = run_module({"path": str(path), "settings": NVIDIA}, check=True, diff=True)
    assert result["changed"] is True
    assert result["diff"]["before"] == (existing or "")
    assert json.loads(result["diff"]["after"]) == dict(json.loads(existing or "{}"), **NVIDIA)
    if existing is None:
        assert not path.exists()
    else:
        assert snapshot(path) == before


@pytest.mark.parametrize("text, why", [
    ('{"debug": true,,}', "is not valid JSON"),
    ('{"debug": true', "is not valid JSON"),
    ('["debug"]', "holds a JSON list, not an object"),
])
def test_refuses_a_broken_file_and_leaves_it_untouched(tmp_path, text, why):
    path = tmp_path / "daemon.json"
    path.write_text(text)
    before = snapshot(path)
    result = run_module({"path": str(path), "settings": NVIDIA})
    assert result.get("failed") is True
    assert str(path) in result["msg"] and why in result["msg"] and "left untouched" in result["msg"]
    assert snapshot(path) == before
    assert sorted(os.listdir(tmp_path)) == ["daemon.json"]


def test_an_empty_file_counts_as_no_settings(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text("\n")
    assert run_module({"path": str(path), "settings": NVIDIA})["changed"] is True
    assert json.loads(path.read_text()) == NVIDIA
