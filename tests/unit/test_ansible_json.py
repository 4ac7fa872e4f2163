"""ansible_json.stdout_json: a run's JSON stdout parsed; a run that printed none fails the test with
its command, return code, the start of stdout and the end of stderr (not a bare JSONDecodeError)."""
import subprocess

import pytest

from ansible_json import stdout_json

CMD = ["ansible-playbook", "-i", "localhost,", "play.yml"]


def test_json_stdout_is_parsed():
    proc = subprocess.CompletedProcess(CMD, 0, stdout='{"plays": [], "stats": {}}\n', stderr="[WARNING]: noise\n")
    assert stdout_json(proc) == {"plays": [], "stats": {}}


def test_empty_stdout_names_the_command_rc_and_the_end_of_stderr():
    stderr = "the start of a long stderr\n" + "x" * 5000 + "\nERROR! the tail that explains it\n"
    proc = subprocess.CompletedProcess(CMD, 4, stdout="", stderr=stderr)
    with pytest.raises(AssertionError) as e:
        stdout_json(proc)
    msg = str(e.value)
    assert "ansible-playbook -i localhost, play.yml" in msg
    assert "stdout is empty, rc 4" in msg
    assert "ERROR! the tail that explains it" in msg
    assert "the start of a long stderr" not in msg  # its tail, not all of it


def test_stdout_that_is_not_json_shows_its_start():
    proc = subprocess.CompletedProcess(CMD, 0, stdout="PLAY [localhost] ***\n" + "y" * 5000, stderr=b"")
    with pytest.raises(AssertionError) as e:
        stdout_json(proc)
    msg = str(e.value)
    assert "stdout is not JSON (Expecting value: line 1 column 1 (char 0)), rc 0" in msg
    assert "PLAY [localhost] ***" in msg and "y" * 5000 not in msg
