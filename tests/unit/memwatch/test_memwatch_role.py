"""The memwatch role refuses bad input before it changes anything, and renders a config that the
program accepts. Runs ansible-playbook against this machine in check mode (nothing is written).

One ansible-playbook start for the whole file (a module-scoped fixture): every case is a host of a
batch inventory (harness.batch_inventory: each host is this machine, with its own variables and its
own tmp paths), so that the role runs for all of them side by side; each test reads its own host's
results from the JSON callback. The render check is a play of its own in the same playbook.
"""
import json
import os
import subprocess
import sys

import pytest

from harness import ROOT, batch_inventory, host_failure, host_results, play_json
from mwhelpers import PROGRAM

BAD = [
    ({"memwatch_oom_score_adjust": -1000}, ["memwatch_oom_score_adjust", "-1000 is refused"]),
    ({"memwatch_consecutive_samples": 0}, ["memwatch_consecutive_samples", "at least 1"]),
    ({"memwatch_kernel_log_source": "file"}, ["memwatch_kernel_log_path"]),
    ({"memwatch_kernel_log_source": "dmesg"}, ["memwatch_kernel_log_source", "journal, kmsg, file, none"]),
    ({"memwatch_available_lt_gib": "six"}, ["memwatch_available_lt_gib"]),
]
# host: the variables of the case (as -e gave them before; nothing in the role outranks a host
# variable: no vars/main.yml, no set_fact of these names)
CASES = dict({"bad%d" % i: extra for i, (extra, _words) in enumerate(BAD)},
             default={}, renamed={"spark_serve_container_name": "llm", "spark_serve_unit_name": "llm-serve"},
             several={"spark_models": [{"name": "chat", "priority": 10, "port": 8000},
                                       {"name": "embed", "priority": 1, "port": 8001},
                                       {"name": "code", "priority": 5, "port": 8002}]})

# The template rendered the way the role does (ansible template lookup), in a play of its own, not
# in check mode. The two values are strings, as from an inventory (the template casts them); task
# vars, since the play's vars_files (the defaults) outrank a host variable.
RENDER_PLAY = """
- name: render
  hosts: render
  gather_facts: false
  vars_files: [%(defaults)s]
  tasks:
    - ansible.builtin.copy:
        dest: "%(out)s"
        mode: '0644'
        content: "{{ lookup('ansible.builtin.template', '%(template)s') }}"
      check_mode: false
      vars:
        memwatch_stop_grace_s: "7"
        memwatch_available_lt_gib: "5.5"
"""

ROLE_PLAY = """
- name: role
  hosts: "sparks:!render"
  gather_facts: false
  roles:
    - sparkops.appliance.memwatch
"""


def paths(base):
    return {"memwatch_config_path": os.path.join(base, "etc", "memwatch.json"),
            "memwatch_bin_path": os.path.join(base, "bin", "memwatch"),
            "memwatch_state_dir": os.path.join(base, "state"), "memwatch_archive_dir": os.path.join(base, "inc"),
            "memwatch_log_dir": os.path.join(base, "log"), "memwatch_metrics_file": os.path.join(base, "m", "memwatch.prom")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("memwatch-role")
    hosts = {}
    for host, extra in CASES.items():
        os.makedirs(str(tmp / host))
        hosts[host] = dict(paths(str(tmp / host)), **extra)
    hosts["render"] = {}
    out = tmp / "render" / "memwatch.json"
    os.makedirs(str(out.parent))
    pb = tmp / "pb.yml"
    pb.write_text(RENDER_PLAY % {
        "defaults": os.path.join(ROOT, "roles/common/defaults/main.yml") + ", "
        + os.path.join(ROOT, "roles/memwatch/defaults/main.yml"),
        "out": out, "template": os.path.join(ROOT, "roles/memwatch/templates/memwatch.json.j2")} + ROLE_PLAY)
    inventory = batch_inventory(tmp, hosts)
    doc = play_json(pb, inventory=inventory, args=["--check", "--diff"])
    return {"doc": doc, "tmp": tmp, "rendered": out}


def stats(run, host):
    return run["doc"]["stats"][host]


def diff_lines(run, host):
    """The lines the role's diff adds (the '+' lines of the unified diff the default callback prints)."""
    added = []
    for _play, _task, result in host_results(run["doc"], host):
        diffs = result.get("diff") or []
        for diff in diffs if isinstance(diffs, list) else [diffs]:
            before = str(diff.get("before") or "").splitlines()
            added += [line for line in str(diff.get("after") or "").splitlines() if line not in before]
    return added


@pytest.mark.parametrize("extra, words", BAD)
def test_bad_input_fails_before_any_change(run, extra, words):
    host = "bad%d" % BAD.index((extra, words))
    failure = host_failure(run["doc"], host)
    assert failure is not None and stats(run, host)["failures"] == 1, host_results(run["doc"], host)
    for word in words:  # in the failure's own message (before: anywhere in the run's output)
        assert word in failure.get("msg", ""), failure
    assert stats(run, host)["changed"] == 0
    assert not (run["tmp"] / host / "etc").exists()


def test_check_mode_reports_changes_and_writes_nothing(run):
    st = stats(run, "default")
    assert st["failures"] == 0 and st["unreachable"] == 0, host_failure(run["doc"], "default")
    assert st["changed"] > 0
    assert not (run["tmp"] / "default" / "etc").exists() and not (run["tmp"] / "default" / "bin").exists()


def test_rendered_config_is_accepted_by_the_program(run):
    """Render the role's template the way the role does (ansible template lookup) and check it."""
    st = stats(run, "render")
    assert st["failures"] == 0 and st["unreachable"] == 0, host_failure(run["doc"], "render")
    check = subprocess.run([sys.executable, PROGRAM, "check-config", str(run["rendered"])], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert check.returncode == 0, check.stderr
    cfg = json.loads(check.stdout)
    assert cfg["stop_grace_s"] == 7 and cfg["available_lt_gib"] == 5.5
    assert cfg["targets"] == [{"name": "", "unit": "sparkops-serve.service", "container": "sparkops-vllm", "priority": 0}]
    assert cfg["stop_via_unit"] is True and cfg["consecutive_samples"] == 5


def test_memwatch_in_a_play_of_its_own_watches_the_serve_roles_names(run):
    """site.yml runs memwatch in its own play, where the serve role's variables are not visible:
    the names must come from the one shared source (roles/common), not from a fallback."""
    st = stats(run, "default")
    assert st["failures"] == 0 and st["unreachable"] == 0, host_failure(run["doc"], "default")
    added = diff_lines(run, "default")
    assert '      "container": "sparkops-vllm",' in added, added
    assert '      "unit": "sparkops-serve.service"' in added, added
    # A user who renames the unit and container once renames them for serve and memwatch alike.
    renamed = diff_lines(run, "renamed")
    assert '      "container": "llm",' in renamed and '      "unit": "llm-serve.service"' in renamed, renamed


def rendered_config(run, host):
    """The memwatch.json the role would write for ``host`` (its check-mode diff)."""
    for _play, _task, result in host_results(run["doc"], host):
        diffs = result.get("diff") or []
        for diff in diffs if isinstance(diffs, list) else [diffs]:
            after = str(diff.get("after") or "")
            if after.startswith("{") and '"targets"' in after:
                return json.loads(after)
    raise AssertionError("no memwatch.json in %s's diff" % host)


def test_several_models_are_targets_in_stop_order(run, tmp_path):
    """A host with spark_models: one target per model, named as serve names them (serve_instances),
    lowest priority first; the program accepts the config as it is rendered."""
    st = stats(run, "several")
    assert st["failures"] == 0 and st["unreachable"] == 0, host_failure(run["doc"], "several")
    cfg = rendered_config(run, "several")
    assert cfg["targets"] == [
        {"name": "embed", "unit": "sparkops-serve-embed.service", "container": "sparkops-vllm-embed", "priority": 1},
        {"name": "code", "unit": "sparkops-serve-code.service", "container": "sparkops-vllm-code", "priority": 5},
        {"name": "chat", "unit": "sparkops-serve-chat.service", "container": "sparkops-vllm-chat", "priority": 10}]
    assert "serve_unit" not in cfg and "container_name" not in cfg
    path = tmp_path / "memwatch.json"
    path.write_text(json.dumps(cfg))
    check = subprocess.run([sys.executable, PROGRAM, "check-config", str(path)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["targets"] == cfg["targets"]
