"""The summary callback as ansible-playbook runs it: per host, what changed, what failed."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

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
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK=stdout_callback,
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    cmd = ["ansible-playbook", "-i", "alpha,beta,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
           "-e", "target=" + str(target), str(book)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_lists_changes_per_host_then_nothing_changed(tmp_path):
    first = run(tmp_path).stdout.split("WHAT WAS DONE, PER HOST")[-1]
    assert "alpha: 3 change(s)" in first
    assert "  changed: Write the marker" in first
    assert "  changed: Touch two more (a)" in first and "  changed: Touch two more (b)" in first
    assert "beta: FAILED" in first
    assert "  failed:  Fail on beta only" in first
    second = run(tmp_path).stdout.split("WHAT WAS DONE, PER HOST")[-1]
    assert "alpha: nothing changed" in second
    assert "beta: FAILED" in second


def test_silent_under_a_machine_readable_stdout_callback(tmp_path):
    out = run(tmp_path, "ansible.builtin.json").stdout
    assert "WHAT WAS DONE" not in out
