# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_tuning_sysctl_apply: true, false and auto decide whether the sysctl settings are applied now.

Runs the role in check mode (nothing is written, nothing applied) on several local "hosts" at once,
one per case: the decision shows as the task APPLY (ansible.posix.sysctl, which sets nothing in
check mode) running or being skipped on that host. One ansible-playbook start runs every test's
cases: a play per test, on that test's group of hosts (a failing host leaves only its own play)."""
import json
import os
import sys

import pytest

from ansible_collections.sparkops.appliance.plugins.plugin_utils._role_inputs import (
    input_problems,
    load_role_checks,
    load_role_options,
)
from harness import ansible_env, run_playbook
from ansible_json import stdout_json

SYSCTL_FILE = "/etc/sysctl.d/99-sparkops-unit-test.conf"
ITS_OWN_TYPE = "{{ [ansible_facts.virtualization_type] }}"  # the host counts as a container
APPLY = "Apply the sysctl settings where the kernel allows it"
SWAP_OFF = "Turn swap off now"

APPLY_CASES = {
    "yaml-true": ({"host_tuning_sysctl_apply": True, "host_tuning_container_virtualization_types": []}, True),
    "yaml-true-in-a-container": ({"host_tuning_sysctl_apply": True, "host_tuning_container_virtualization_types": ITS_OWN_TYPE}, True),
    "yaml-false": ({"host_tuning_sysctl_apply": False, "host_tuning_container_virtualization_types": []}, False),
    "auto-not-a-container": ({"host_tuning_sysctl_apply": "auto", "host_tuning_container_virtualization_types": []}, True),
    "auto-in-a-container": ({"host_tuning_sysctl_apply": "auto", "host_tuning_container_virtualization_types": ITS_OWN_TYPE}, False),
}
# Refused by validate.yml's one check (the input_problems lookup): every value in this process, one
# of them also through the role (its host in the play: refused, and nothing applied).
REFUSED_VALUES = {"string-true": "true", "yes": "yes", "one": 1, "always": "always"}
REFUSED_CASES = {"string-true": REFUSED_VALUES["string-true"]}
SWAP_CASES = {"swap-on": 1048576, "swap-off": 0}
FACTS_CASES = {"facts-no-swap": {"fstab": "no-swap"}, "facts-swap": {"fstab": "swap"}, "no-facts": {}}

DPKG_QUERY = """#!/bin/sh
if [ "$1" = -L ] && [ "$2" = libjemalloc2 ]; then
  printf '/.\\n/usr/lib/aarch64-linux-gnu/libjemalloc.so.2\\n'
else
  echo "dpkg-query: package '$2' is not installed" >&2; exit 1
fi
"""

# test_apply_true_false_auto and test_anything_else_is_refused_naming_the_variable: the role itself.
ROLE_PLAY = ("- hosts: apply:refused\n  gather_facts: true\n  gather_subset: ['!all', '!min', virtual]\n"
             "  roles:\n    - sparkops.appliance.host_tuning\n")
# test_swap_off_now_follows_preflights_swap_total: spark_facts reads a meminfo file per host.
SWAP_PLAY = ("- hosts: swap\n  gather_facts: false\n  tasks:\n"
             "    - sparkops.appliance.spark_facts: {meminfo_path: '%(tmp)s/{{ inventory_hostname }}.meminfo', disk_path: '%(tmp)s',"
             " check_gpu: false, check_docker: false}\n"
             "    - ansible.builtin.setup: {gather_subset: [min, virtual]}\n"
             "    - ansible.builtin.include_role: {name: sparkops.appliance.host_tuning}\n")
# test_reads_preflights_facts_instead_of_asking_again: a dpkg-query stand-in in front of PATH (the
# play's environment, for every task of this play: spark_facts and the role's own dpkg-query).
FACTS_PLAY = ("- hosts: facts\n  gather_facts: false\n"
              "  environment:\n    PATH: \"%(bin)s:{{ lookup('ansible.builtin.env', 'PATH') }}\"\n  tasks:\n"
              "    - sparkops.appliance.spark_facts: {meminfo_path: /proc/meminfo, disk_path: '%(tmp)s', check_gpu: false,"
              " check_docker: false, fstab_path: '%(tmp)s/{{ fstab }}.fstab', sysctl_dir: '%(sysctl)s'}\n"
              "      when: fstab is defined\n"
              "    - ansible.builtin.setup: {gather_subset: [min, virtual, hardware]}\n"
              "    - ansible.builtin.include_role: {name: sparkops.appliance.host_tuning}\n")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Every test's plays in check mode, one start; (tmp_path, {host: {task name: result}}, stats)."""
    tmp_path = tmp_path_factory.mktemp("host-tuning")
    for host, kib in SWAP_CASES.items():
        (tmp_path / (host + ".meminfo")).write_text("MemTotal: 131072000 kB\nMemAvailable: 120000000 kB\nSwapTotal: %d kB\n" % kib)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dpkg-query").write_text(DPKG_QUERY)
    (bin_dir / "dpkg-query").chmod(0o755)
    sysctl_dir = tmp_path / "sysctl.d"
    sysctl_dir.mkdir()
    stale = sysctl_dir / "50-sparkops-old.conf"
    stale.write_text("# Unified-memory serving host (sparkops.appliance host_tuning).\n")
    for name, text in (("no-swap", "UUID=a / ext4 defaults 0 1\n"), ("swap", "/swap.img none swap sw 0 0\n")):
        (tmp_path / (name + ".fstab")).write_text(text)
    groups = {
        "apply": {host: case[0] for host, case in APPLY_CASES.items()},
        "refused": {host: {"host_tuning_sysctl_apply": value} for host, value in REFUSED_CASES.items()},
        "swap": {host: {"host_tuning_swap_off": True, "host_tuning_sysctl_apply": False} for host in SWAP_CASES},
        "facts": {host: dict(case, host_tuning_swap_off=True, host_tuning_jemalloc=True, host_tuning_sysctl_apply=False)
                  for host, case in FACTS_CASES.items()},
    }
    playbook = tmp_path / "pb.yml"
    playbook.write_text(ROLE_PLAY + SWAP_PLAY % {"tmp": tmp_path}
                        + FACTS_PLAY % {"tmp": tmp_path, "sysctl": sysctl_dir, "bin": bin_dir})
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "host_tuning_swap_off": False,
              "host_tuning_jemalloc": False, "host_tuning_sysctl_file": SYSCTL_FILE}
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"vars": common, "children": {g: {"hosts": h} for g, h in groups.items()}}}))
    proc = run_playbook(playbook, inventory=inventory, args=["--check"], connection=None, env=ansible_env())
    out = stdout_json(proc)
    results = {host: {} for hosts in groups.values() for host in hosts}
    for play_ in out["plays"]:
        for task in play_["tasks"]:
            for host, result in task["hosts"].items():
                results[host][task["task"]["name"].split(" : ")[-1]] = result
    assert not os.path.exists(SYSCTL_FILE)
    return tmp_path, results, out["stats"]


def failed(stats, host):
    """Whether the host failed (what the return code of a start of its own said)."""
    return stats[host]["failures"] + stats[host]["unreachable"] > 0


def test_apply_true_false_auto(run):
    _tmp, results, stats = run
    assert not any(failed(stats, host) for host in APPLY_CASES), (stats, results)
    for host, (_value, applied) in APPLY_CASES.items():
        read = results[host][APPLY]
        assert read.get("skipped", False) is (not applied), (host, read)


def test_anything_else_is_refused_naming_the_variable(run):
    _tmp, results, stats = run
    assert all(failed(stats, host) for host in REFUSED_CASES), stats
    for host in REFUSED_CASES:
        failures = [res for res in results[host].values() if res.get("failed")]
        assert failures and "host_tuning_sysctl_apply" in failures[0]["msg"], (host, results[host])
        assert APPLY not in results[host]


@pytest.mark.parametrize("value", list(REFUSED_VALUES.values()), ids=list(REFUSED_VALUES))
def test_anything_else_is_refused_naming_the_variable_in_process(value):
    """What validate.yml's "Refuse ..." task joins (input_problems of the role's options and checks)."""
    options, checks = load_role_options(roles=["host_tuning"]), load_role_checks(roles=["host_tuning"])
    problems = input_problems({"host_tuning_sysctl_apply": value}, options, checks)
    assert problems and "host_tuning_sysctl_apply" in problems[0], problems
    for good, _applied in APPLY_CASES.values():
        assert input_problems({"host_tuning_sysctl_apply": good["host_tuning_sysctl_apply"]}, options, checks) == []


def test_swap_off_now_follows_preflights_swap_total(run):
    """site.yml gathers no hardware facts: "Turn swap off now" reads SwapTotal from preflight's
    spark_facts (here from a meminfo file per host). In check mode the command itself is skipped,
    so the decision shows as its reason: "would have run" against a false condition."""
    _tmp, results, stats = run
    assert not any(failed(stats, host) for host in SWAP_CASES), (stats, results)
    results = dict((host, results[host][SWAP_OFF]) for host in SWAP_CASES)
    assert "would have run" in results["swap-on"].get("msg", ""), results
    assert results["swap-off"].get("false_condition"), results


def test_reads_preflights_facts_instead_of_asking_again(run):
    """Where preflight's spark_facts ran, host_tuning takes the fstab's swap lines, the marked
    sysctl.d files and jemalloc's file list from it (no find, no dpkg-query, no replace where
    there is no swap line); where it did not, the role asks the host itself."""
    tmp_path, results, stats = run
    stale = tmp_path / "sysctl.d" / "50-sparkops-old.conf"
    assert not any(failed(stats, host) for host in FACTS_CASES), (stats, results)
    jemalloc = "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"
    for host in FACTS_CASES:
        got = results[host]
        from_facts = host != "no-facts"
        assert got["Find sysctl.d files an earlier run wrote at another path"].get("skipped", False) is from_facts, (host, got)
        assert got["Find the jemalloc shared library"].get("skipped", False) is from_facts, (host, got)
        assert got["Record the jemalloc path for LD_PRELOAD"]["ansible_facts"]["spark_jemalloc_path"] == jemalloc, host
        assert got["Install the jemalloc package (the package lists refreshed at most daily)"].get("skipped"), host
        removed = [item["item"] for item in got["Remove sysctl.d files an earlier run wrote at another path"].get("results", [])]
        assert removed == ([str(stale)] if from_facts else []), (host, removed)
    assert results["facts-no-swap"]["Comment out swap lines in /etc/fstab"].get("skipped") is True
    for host in ("facts-swap", "no-facts"):
        assert not results[host]["Comment out swap lines in /etc/fstab"].get("skipped", False), host
    assert stale.exists()   # check mode
