"""The memwatch role refuses bad input before it changes anything, and renders a config that the
program accepts. Runs ansible-playbook against localhost in check mode (nothing is written)."""
import json
import os
import subprocess
import sys

import pytest

from mwhelpers import PROGRAM, ROOT


def play(tmp_path, extra, check=True, diff=False):
    pb = tmp_path / "pb.yml"
    pb.write_text("- hosts: localhost\n  gather_facts: false\n  roles:\n    - sparkops.appliance.memwatch\n")
    base = {"memwatch_config_path": str(tmp_path / "etc" / "memwatch.json"),
            "memwatch_bin_path": str(tmp_path / "bin" / "memwatch"),
            "memwatch_state_dir": str(tmp_path / "state"), "memwatch_archive_dir": str(tmp_path / "inc"),
            "memwatch_log_dir": str(tmp_path / "log"), "memwatch_metrics_file": str(tmp_path / "m" / "memwatch.prom")}
    base["ansible_python_interpreter"] = sys.executable
    base.update(extra)
    cmd = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(pb), "-e", json.dumps(base)]
    if check:
        cmd.append("--check")
    if diff:
        cmd.append("--diff")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300, check=False)


@pytest.mark.parametrize("extra, words", [
    ({"memwatch_oom_score_adjust": -1000}, ["memwatch_oom_score_adjust", "-1000 is refused"]),
    ({"memwatch_consecutive_samples": 0}, ["memwatch_consecutive_samples", ">= 1"]),
    ({"memwatch_kernel_log_source": "file"}, ["memwatch_kernel_log_path"]),
    ({"memwatch_kernel_log_source": "dmesg"}, ["memwatch_kernel_log_source", "journal, kmsg, file, none"]),
    ({"memwatch_available_lt_gib": "six"}, ["memwatch_available_lt_gib"]),
])
def test_bad_input_fails_before_any_change(tmp_path, extra, words):
    proc = play(tmp_path, extra)
    assert proc.returncode != 0, proc.stdout
    for word in words:
        assert word in proc.stdout, proc.stdout
    assert "changed=0" in proc.stdout
    assert not (tmp_path / "etc").exists()


def test_check_mode_reports_changes_and_writes_nothing(tmp_path):
    proc = play(tmp_path, {})
    assert proc.returncode == 0, proc.stdout
    assert "changed=0" not in proc.stdout
    assert not (tmp_path / "etc").exists() and not (tmp_path / "bin").exists()


def test_rendered_config_is_accepted_by_the_program(tmp_path):
    """Render the role's template the way the role does (ansible template lookup) and check it."""
    pb = tmp_path / "render.yml"
    out = tmp_path / "memwatch.json"
    pb.write_text(
        "- hosts: localhost\n  gather_facts: false\n  vars_files: [%s]\n  tasks:\n"
        "    - ansible.builtin.copy:\n        dest: %s\n        mode: '0644'\n"
        "        content: \"{{ lookup('ansible.builtin.template', '%s') }}\"\n"
        % (os.path.join(ROOT, "roles/common/defaults/main.yml") + ", " + os.path.join(ROOT, "roles/memwatch/defaults/main.yml"), out,
           os.path.join(ROOT, "roles/memwatch/templates/memwatch.json.j2")))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(pb),
                           "-e", "ansible_python_interpreter=" + sys.executable,
                           # strings, as from an inventory: the template casts them
                           "-e", '{"memwatch_stop_grace_s": "7", "memwatch_available_lt_gib": "5.5"}'],
                          cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout
    check = subprocess.run([sys.executable, PROGRAM, "check-config", str(out)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert check.returncode == 0, check.stderr
    cfg = json.loads(check.stdout)
    assert cfg["stop_grace_s"] == 7 and cfg["available_lt_gib"] == 5.5
    assert cfg["container_name"] == "sparkops-vllm" and cfg["serve_unit"] == "sparkops-serve.service"
    assert cfg["stop_via_unit"] is True and cfg["consecutive_samples"] == 5


def test_memwatch_in_a_play_of_its_own_watches_the_serve_roles_names(tmp_path):
    """site.yml runs memwatch in its own play, where the serve role's variables are not visible:
    the names must come from the one shared source (roles/common), not from a fallback."""
    proc = play(tmp_path, {}, check=True, diff=True)
    assert proc.returncode == 0, proc.stdout
    assert '+  "container_name": "sparkops-vllm",' in proc.stdout, proc.stdout
    assert '+  "serve_unit": "sparkops-serve.service",' in proc.stdout, proc.stdout
    # A user who renames the unit and container once renames them for serve and memwatch alike.
    renamed = play(tmp_path, {"spark_serve_container_name": "llm", "spark_serve_unit_name": "llm-serve"}, check=True, diff=True)
    assert '+  "container_name": "llm",' in renamed.stdout and '+  "serve_unit": "llm-serve.service",' in renamed.stdout, renamed.stdout
