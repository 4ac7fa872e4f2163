"""The summary callback: per host, what changed, what failed. One ansible-playbook start checks the
wiring (ansible.cfg enables it beside the default stdout callback; real task, loop and failure
results); the rest feeds the callback's hooks in this process, the results a run would give them."""
import sys

import pytest
from ansible import constants as C

import harness
from ansible_collections.sparkops.appliance.plugins.callback.spark_summary import CallbackModule

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Write the marker
      ansible.builtin.copy:
        dest: "{{ target }}/{{ inventory_hostname }}"
        content: "x"
        mode: "0644"
    - name: Touch two more
      ansible.builtin.copy:
        dest: "{{ target }}/{{ inventory_hostname }}-{{ item }}"
        content: "y"
        mode: "0644"
      loop: [a, b]
    - name: Fail on beta only
      ansible.builtin.fail:
        msg: boom
      when: inventory_hostname == 'beta'
"""


def run(tmp_path, stdout_callback="ansible.builtin.default"):
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    target = tmp_path / "out"
    target.mkdir(exist_ok=True)
    return harness.run_playbook(book, inventory="alpha,beta,", timeout=120,
                                extra_vars={"ansible_python_interpreter": sys.executable, "target": str(target)},
                                env=harness.ansible_env(stdout_callback=stdout_callback))


def test_lists_changes_per_host_through_ansible_playbook(tmp_path):
    first = run(tmp_path).stdout.split("WHAT WAS DONE, PER HOST")[-1]
    assert "alpha: 3 change(s)" in first
    assert "  changed: Write the marker" in first
    assert "  changed: Touch two more (a)" in first and "  changed: Touch two more (b)" in first
    assert "beta: FAILED" in first
    assert "  failed:  Fail on beta only" in first


# In this process: the callback's hooks called as the task executor calls them.
class _Named:
    def __init__(self, name):
        self._name = name

    def get_name(self):
        return self._name


class _Result:
    def __init__(self, host, task, result):
        self._host, self._task, self._result = _Named(host), _Named(task), result


class _Display:
    def __init__(self):
        self.lines = []

    def banner(self, text):
        self.lines.append("*** " + text)

    def display(self, text):
        self.lines.append(text)


def second_run(callback):
    """The playbook's hooks on its second run: every file already there (nothing changed), beta fails."""
    for host in ("alpha", "beta"):
        callback.v2_runner_on_ok(_Result(host, "Write the marker", {"changed": False}))
        for item in ("a", "b"):
            callback.v2_runner_item_on_ok(_Result(host, "Touch two more", {"changed": False, "item": item}))
        callback.v2_runner_on_ok(_Result(host, "Touch two more", {"changed": False, "results": [{}, {}]}))
    callback.v2_runner_on_skipped(_Result("alpha", "Fail on beta only", {"skipped": True}))
    callback.v2_runner_on_failed(_Result("beta", "Fail on beta only", {"failed": True, "msg": "boom"}))


def summary(monkeypatch, stdout_callback="ansible.builtin.default"):
    monkeypatch.setattr(C, "DEFAULT_STDOUT_CALLBACK", stdout_callback)
    callback = CallbackModule()
    callback._display = _Display()  # pylint: disable=protected-access
    second_run(callback)
    callback.v2_playbook_on_stats(None)
    return callback._display.lines  # pylint: disable=protected-access


def test_then_nothing_changed(monkeypatch):
    lines = summary(monkeypatch)
    assert lines[0] == "*** WHAT WAS DONE, PER HOST"
    assert "alpha: nothing changed" in lines
    assert "beta: FAILED" in lines
    assert "  failed:  Fail on beta only" in lines
    assert not [line for line in lines if line.startswith("  changed:")], lines


@pytest.mark.parametrize("stdout_callback", ["ansible.builtin.json", "json", "ansible.builtin.jsonl"])
def test_silent_under_a_machine_readable_stdout_callback(monkeypatch, stdout_callback):
    assert summary(monkeypatch, stdout_callback) == []
