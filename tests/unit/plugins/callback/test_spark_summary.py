"""The summary callback as ansible-playbook runs it: per host, what changed, what failed."""
import sys

import harness

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
