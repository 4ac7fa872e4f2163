# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_tuning_sysctl_apply: true, false and auto decide whether the sysctl settings are applied now.

Runs the role in check mode (nothing is written, nothing applied) on several local "hosts" at once,
one per case: the decision shows as the task APPLY (ansible.posix.sysctl, which sets nothing in
check mode) running or being skipped on that host."""
import json
import os
import subprocess
import sys

from ansible_json import stdout_json

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SYSCTL_FILE = "/etc/sysctl.d/99-sparkops-unit-test.conf"
ITS_OWN_TYPE = "{{ [ansible_facts.virtualization_type] }}"  # the host counts as a container
APPLY = "Apply the sysctl settings where the kernel allows it"


ROLE_PLAY = ("- hosts: all\n  gather_facts: true\n  gather_subset: ['!all', '!min', virtual]\n"
             "  roles:\n    - sparkops.appliance.host_tuning\n")


def play(tmp_path, cases, playbook_text=ROLE_PLAY, path_prefix=None):
    """Run the role (or playbook_text) in check mode on one local host per case ({host: vars});
    {host: {task name: result}}. path_prefix goes in front of PATH (fake programs)."""
    playbook = tmp_path / "pb.yml"
    playbook.write_text(playbook_text)
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "host_tuning_swap_off": False,
              "host_tuning_jemalloc": False, "host_tuning_sysctl_file": SYSCTL_FILE}
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"vars": common, "hosts": cases}}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_NOCOLOR="1")
    if path_prefix:
        env["PATH"] = path_prefix + os.pathsep + env["PATH"]
    proc = subprocess.run(["ansible-playbook", "-i", str(inventory), "--check", str(playbook)],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300, check=False)
    out = stdout_json(proc)
    results = {host: {} for host in cases}
    for play_ in out["plays"]:
        for task in play_["tasks"]:
            for host, result in task["hosts"].items():
                results[host][task["task"]["name"].split(" : ")[-1]] = result
    assert not os.path.exists(SYSCTL_FILE)
    return proc, results


def test_apply_true_false_auto(tmp_path):
    cases = {
        "yaml-true": ({"host_tuning_sysctl_apply": True, "host_tuning_container_virtualization_types": []}, True),
        "yaml-true-in-a-container": ({"host_tuning_sysctl_apply": True, "host_tuning_container_virtualization_types": ITS_OWN_TYPE}, True),
        "yaml-false": ({"host_tuning_sysctl_apply": False, "host_tuning_container_virtualization_types": []}, False),
        "auto-not-a-container": ({"host_tuning_sysctl_apply": "auto", "host_tuning_container_virtualization_types": []}, True),
        "auto-in-a-container": ({"host_tuning_sysctl_apply": "auto", "host_tuning_container_virtualization_types": ITS_OWN_TYPE}, False),
    }
    proc, results = play(tmp_path, {host: case[0] for host, case in cases.items()})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    for host, (_value, applied) in cases.items():
        read = results[host][APPLY]
        assert read.get("skipped", False) is (not applied), (host, read)


def test_anything_else_is_refused_naming_the_variable(tmp_path):
    cases = {"string-true": "true", "yes": "yes", "one": 1, "always": "always"}
    proc, results = play(tmp_path, {host: {"host_tuning_sysctl_apply": value} for host, value in cases.items()})
    assert proc.returncode != 0
    for host in cases:
        failed = [res for res in results[host].values() if res.get("failed")]
        assert failed and "host_tuning_sysctl_apply" in failed[0]["msg"], (host, results[host])
        assert APPLY not in results[host]


SWAP_OFF = "Turn swap off now"


def test_swap_off_now_follows_preflights_swap_total(tmp_path):
    """site.yml gathers no hardware facts: "Turn swap off now" reads SwapTotal from preflight's
    spark_facts (here from a meminfo file per host). In check mode the command itself is skipped,
    so the decision shows as its reason: "would have run" against a false condition."""
    cases = {"swap-on": 1048576, "swap-off": 0}
    for host, kib in cases.items():
        (tmp_path / (host + ".meminfo")).write_text("MemTotal: 131072000 kB\nMemAvailable: 120000000 kB\nSwapTotal: %d kB\n" % kib)
    proc, results = play(tmp_path, {host: {"host_tuning_swap_off": True, "host_tuning_sysctl_apply": False} for host in cases},
                         "- hosts: all\n  gather_facts: false\n  tasks:\n"
                         "    - sparkops.appliance.spark_facts: {meminfo_path: '%s/{{ inventory_hostname }}.meminfo', disk_path: '%s',"
                         " check_gpu: false, check_docker: false}\n"
                         "    - ansible.builtin.setup: {gather_subset: [min, virtual]}\n"
                         "    - ansible.builtin.include_role: {name: sparkops.appliance.host_tuning}\n" % (tmp_path, tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    results = dict((host, results[host][SWAP_OFF]) for host in cases)
    assert "would have run" in results["swap-on"].get("msg", ""), results
    assert results["swap-off"].get("false_condition"), results


DPKG_QUERY = """#!/bin/sh
if [ "$1" = -L ] && [ "$2" = libjemalloc2 ]; then
  printf '/.\\n/usr/lib/aarch64-linux-gnu/libjemalloc.so.2\\n'
else
  echo "dpkg-query: package '$2' is not installed" >&2; exit 1
fi
"""


def test_reads_preflights_facts_instead_of_asking_again(tmp_path):
    """Where preflight's spark_facts ran, host_tuning takes the fstab's swap lines, the marked
    sysctl.d files and jemalloc's file list from it (no find, no dpkg-query, no replace where
    there is no swap line); where it did not, the role asks the host itself."""
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
    cases = {"facts-no-swap": {"fstab": "no-swap"}, "facts-swap": {"fstab": "swap"}, "no-facts": {}}
    proc, results = play(
        tmp_path, {host: dict(case, host_tuning_swap_off=True, host_tuning_jemalloc=True, host_tuning_sysctl_apply=False)
                   for host, case in cases.items()},
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - sparkops.appliance.spark_facts: {meminfo_path: /proc/meminfo, disk_path: '%s', check_gpu: false,"
        " check_docker: false, fstab_path: '%s/{{ fstab }}.fstab', sysctl_dir: '%s'}\n"
        "      when: fstab is defined\n"
        "    - ansible.builtin.setup: {gather_subset: [min, virtual, hardware]}\n"
        "    - ansible.builtin.include_role: {name: sparkops.appliance.host_tuning}\n" % (tmp_path, tmp_path, sysctl_dir),
        path_prefix=str(bin_dir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    jemalloc = "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"
    for host in cases:
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
