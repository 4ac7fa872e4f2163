"""Every playbook of the collection on the example inventory's values (plus the one lab override
file), against the converged Spark: plan.yml, cluster.yml, rollout.yml and verify.yml. A playbook
that reads a variable only the lab sets (e.g. a shared name without roles/common loaded) fails
here, where the example inventory is the product. None of them may restart the server when there
is nothing to roll.

Runs in the production scenario's verify, after site.yml's converge and idempotence; by hand against
the lab:

  SPARKOPS_LAB_RUNTIME_IMAGE=$(lab/runtime/tag.sh) MOLECULE_INVENTORY_FILE=inventories/lab \\
    python3 -m pytest -q -s molecule/production/tests/test_every_playbook.py --hosts=docker://sparkops-spark-lab-1
"""
import json
import os
import re
import subprocess
import tempfile

import pytest
import testinfra.utils.ansible_runner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
if not os.path.isabs(INVENTORY):
    INVENTORY = os.path.join(PROJECT, INVENTORY)
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("sparks")[:1]
NAME = testinfra_hosts[0] if testinfra_hosts else ""
UNIT = "sparkops-serve.service"   # spark_serve_unit_name's default (roles/common)
# verify.yml at the tiny model's shape, one short round (the rollout scenario checks its figures).
VERIFY_SMALL = {"verify_prompt_tokens": 32, "verify_max_tokens": 8, "verify_requests": 2, "verify_concurrency": 1,
                "verify_rounds": 1, "verify_round_requests": 2, "verify_settle_s": 1, "verify_band_gib": 4}


def playbook(name, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_DIFF_ALWAYS="0")
    cmd = ["ansible-playbook", "-i", INVENTORY, os.path.join(PROJECT, "playbooks", name), "--limit", NAME] + list(extra)
    proc = subprocess.run(cmd, env=env, cwd=PROJECT, capture_output=True, text=True, timeout=1200, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def recap(out):
    """{host: {ok, changed, failed, ...}} from the PLAY RECAP lines."""
    hosts = {}
    for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", out, re.M):
        hosts[host] = dict((key, int(value)) for key, value in re.findall(r"(\w+)=(\d+)", counts))
    return hosts


def changed_on_the_spark(out):
    """Tasks that reported a change on the Spark itself (a report written on the controller,
    `changed: [host -> localhost]`, is not one)."""
    return re.findall(r"^changed: \[%s\]" % re.escape(NAME), out, re.M)


@pytest.fixture(scope="module")
def invocation(host):
    """The serve unit's InvocationID before these playbooks: a restart changes it."""
    return host.check_output("systemctl show -p InvocationID --value %s" % UNIT)


def test_plan_yml(host):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.json")
        rc, out = playbook("plan.yml", "-e", json.dumps({"plan_json_path": path}))
        assert rc == 0, out[-4000:]
        with open(path) as handle:
            plans = json.load(handle)
    assert NAME in json.dumps(plans) and "gmu" in json.dumps(plans)
    assert recap(out)[NAME]["failed"] == 0 and not changed_on_the_spark(out), out[-3000:]


def test_cluster_yml_leaves_a_single_spark_alone(host, invocation):
    rc, out = playbook("cluster.yml")
    assert rc == 0, out[-4000:]
    assert recap(out)[NAME]["failed"] == 0 and not changed_on_the_spark(out), out[-3000:]
    assert host.check_output("systemctl show -p InvocationID --value %s" % UNIT) == invocation


def test_rollout_yml_with_nothing_to_roll_keeps_the_server(host, invocation):
    rc, out = playbook("rollout.yml")
    assert rc == 0, out[-6000:]
    assert recap(out)[NAME]["failed"] == 0 and not changed_on_the_spark(out), out[-3000:]
    assert host.check_output("systemctl show -p InvocationID --value %s" % UNIT) == invocation


def test_verify_yml_reports(host, invocation):
    with tempfile.TemporaryDirectory() as tmp:
        rc, out = playbook("verify.yml", "-e", json.dumps(dict(VERIFY_SMALL, verify_report_dir=tmp)))
        assert rc == 0, out[-6000:]
        with open(os.path.join(tmp, NAME + ".json")) as handle:
            report = json.load(handle)
    assert report["load"]["failed_requests"] == 0 and report["load"]["concurrency"]["requests"] > 0
    assert report["startup"]["now"]["kv_cache_gib"] > 0
    assert host.check_output("systemctl show -p InvocationID --value %s" % UNIT) == invocation


def test_status_yml_says_the_spark_is_healthy(host, invocation):
    with tempfile.TemporaryDirectory() as tmp:
        rc, out = playbook("status.yml", "-e", json.dumps({"status_report_dir": tmp}))
        assert rc == 0, out[-4000:]
        with open(os.path.join(tmp, "status.json")) as handle:
            (row,) = json.load(handle)
    assert (row["host"], row["kind"], row["state"], row["liveness"], row["memwatch"]) == (NAME, "single", "active", "live", "active")
    assert row["problems"] == [] and row["actual_kv_gib"] > 0 and row["plan_kv_gib"] > 0 and row["image"]
    assert row["mem_available_gib"] > row["memwatch_available_lt_gib"] > 0
    assert recap(out)[NAME]["failed"] == 0 and not changed_on_the_spark(out), out[-3000:]
    assert host.check_output("systemctl show -p InvocationID --value %s" % UNIT) == invocation


@pytest.mark.parametrize("tag", ["serve", "memwatch"])
def test_site_yml_one_phase_by_its_tag(host, invocation, tag):
    """--tags <phase>: the first play (tagged always) checks every input, then only that phase runs."""
    rc, out = playbook("site.yml", "--tags", tag)
    assert rc == 0, out[-6000:]
    assert recap(out)[NAME]["failed"] == 0 and not changed_on_the_spark(out), out[-3000:]
    plays = re.findall(r"^PLAY \[(.*?)\]", out, re.M)
    assert plays[0].startswith("Preflight") and any(name.lower().startswith({"serve": "serve", "memwatch": "memory"}[tag])
                                                    for name in plays), plays
    after_the_first_play = out.split("\nPLAY [", 2)[-1]
    assert re.search(r"TASK \[sparkops\.appliance\.%s : (?!Validating arguments)" % tag, after_the_first_play), out[-3000:]
    for other in ("checkpoint", "host_tuning", "drivers", "runtime_image" if tag == "memwatch" else "memwatch"):
        # (Ansible's own argument-spec validation of a role is tagged always: it runs and changes nothing)
        assert not re.search(r"TASK \[sparkops\.appliance\.%s : (?!Validating arguments)" % other, after_the_first_play), other
    assert host.check_output("systemctl show -p InvocationID --value %s" % UNIT) == invocation


def test_rollout_yml_refuses_a_unit_name_that_is_the_systems(host, invocation):
    """rollout.yml's first play runs the same name guard as site.yml's (roles/preflight/tasks/names.yml)."""
    rc, out = playbook("rollout.yml", "-e", json.dumps({"spark_serve_unit_name": "systemd-journald"}))
    assert rc != 0 and "spark_serve_unit_name" in out, out[-4000:]
    assert "PLAY [Rollout - one batch at a time" not in out, out[-4000:]
    assert host.check_output("systemctl show -p InvocationID --value %s" % UNIT) == invocation
