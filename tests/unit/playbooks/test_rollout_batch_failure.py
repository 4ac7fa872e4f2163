"""rollout.yml's batch play, as Ansible runs it, when one host of a batch of two fails.

The play's own keywords (serial, max_fail_percentage, any_errors_fatal, ...) and the shape of its
block (each step an include, the rescue an include_role) are taken from playbooks/rollout.yml; only
the steps are stand-ins (a step that fails on one host), because the real ones need a serving Spark
(the rollout scenario runs them for real). With `any_errors_fatal: true` beside `serial` and a
block whose rescue includes tasks, ansible-core 2.19 lists the failed host's rescue include but runs
none of its tasks, and stops the batch's other host after its current task: no rollback, no return
to the balancer, and the recap says failed=0. The batch must instead run every failed
host's rescue to its end, let the batch's other hosts finish (their gate puts them back), and stop
the rollout after the batch: no later batch is touched.
"""
import json
import os
import sys

import yaml

import harness

ROLLOUT = os.path.join(harness.ROOT, "playbooks", "rollout.yml")
HOSTS = ["r1", "r2", "r3"]
STEPS = ["image", "checkpoint", "ple", "ple-staged", "plan", "ray-prepare", "prepare", "drain", "stop-head", "switch",
         "ple-switched", "ray-worker", "ray-head", "apply", "gate"]


def batch_play():
    """The batch play without its first task, the block of a Spark with several models (each model's
    server its own rescue; not what these tests look at): the hosts here serve one model each
    (__rollout_models_here false in the inventory, as the first play notes it)."""
    with open(ROLLOUT) as handle:
        plays = yaml.safe_load(handle)
    play = [play for play in plays if play.get("hosts") == "__rollout_ordered"][0]
    several = play["tasks"][0]
    assert several["when"] == "__rollout_models_here | bool" and "tasks_from" in str(several["block"]), several
    return dict(play, tasks=play["tasks"][1:])


def single_spark_vars():
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "__rollout_models_here": False}


def stand_in(tmp_path, fail_on):
    """The batch play with its keywords as they are, its steps replaced by stand-ins that write
    which steps ran on which host; the step named 'gate' fails on `fail_on`."""
    play = batch_play()
    block = play["tasks"][0]
    assert set(block) >= {"block", "rescue"}, block
    steps = tmp_path / "steps"
    steps.mkdir()
    (steps / "step.yml").write_text(yaml.safe_dump([
        {"name": "Record the step", "ansible.builtin.lineinfile": {
            "path": str(tmp_path / "ran-{{ inventory_hostname }}"), "line": "{{ __step }}", "create": True}},
        {"name": "Fail the gate here", "ansible.builtin.fail": {"msg": "gate failed on {{ inventory_hostname }}"},
         "when": ["__step == 'gate'", "inventory_hostname == %r" % fail_on]}]))
    (steps / "rescue.yml").write_text(yaml.safe_dump([
        {"name": "Record the rescue", "ansible.builtin.lineinfile": {
            "path": str(tmp_path / "ran-{{ inventory_hostname }}"), "line": "rescue", "create": True}},
        {"name": "Say what happened", "ansible.builtin.set_fact": {"__rollout_stop_msg": "rollout stopped at {{ inventory_hostname }}"}}]))
    names = STEPS
    assert len(block["block"]) == len(names), [task["name"] for task in block["block"]]
    block = dict(block)
    block["block"] = [{"name": task["name"], "ansible.builtin.include_tasks": str(steps / "step.yml"),
                       "vars": {"__step": step}} for task, step in zip(play["tasks"][0]["block"], names)]
    # the rescue: a single Spark's (a pair's node notes its failure; the pair rolls back after the block)
    assert len(block["rescue"]) == 2, block["rescue"]
    block["rescue"] = [{"name": block["rescue"][0]["name"], "ansible.builtin.include_tasks": str(steps / "rescue.yml")}]
    _pair, release, stop = play["tasks"][1:]
    release = {"name": release["name"], "ansible.builtin.include_tasks": str(steps / "step.yml"),
               "vars": {"__step": "release"}, "when": release["when"]}
    play = dict(play, hosts="all", serial=[2, 1], tasks=[block, release, stop])
    path = tmp_path / "batch.yml"
    path.write_text(yaml.safe_dump([play], sort_keys=False))
    return path


def ran(tmp_path, host):
    path = tmp_path / ("ran-" + host)
    return path.read_text().split() if path.exists() else []


def test_a_failure_in_a_batch_of_two_rescues_that_host_and_stops_after_the_batch(tmp_path):
    playbook = stand_in(tmp_path, fail_on="r2")
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": dict((host, single_spark_vars()) for host in HOSTS)}}))
    proc = harness.run_playbook(playbook, inventory=inventory, connection=None,
                                env=harness.ansible_env(stdout_callback="ansible.builtin.default"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    # the failed host: every step up to its gate, then its whole rescue
    assert ran(tmp_path, "r2") == STEPS + ["rescue"], out[-3000:]
    assert "rollout stopped at r2" in out, out[-3000:]
    # the batch's other host finishes its own steps (its gate puts it back) and is not rolled back
    assert ran(tmp_path, "r1") == STEPS + ["release"], out[-3000:]
    # no later batch is touched
    assert ran(tmp_path, "r3") == [], out[-3000:]


def test_the_stand_in_keeps_the_plays_keywords():
    play = batch_play()
    assert play["max_fail_percentage"] == 0
    assert "rescue" in play["tasks"][0] and "serial" in play


def pair_stand_in(tmp_path, fail_on):
    """The batch play with its keywords, the rescue's and the pair rollback's conditions and vars as they
    are; every step that acts on a host is a stand-in that records its name (the gate fails on `fail_on`)."""
    play = batch_play()
    block, pair, release, stop = play["tasks"]
    assert set(block) >= {"block", "rescue"} and "block" in pair, play["tasks"]
    steps = tmp_path / "steps"
    steps.mkdir()
    record = {"name": "Record the step", "ansible.builtin.lineinfile": {
        "path": str(tmp_path / "ran-{{ inventory_hostname }}"), "line": "{{ __step }}", "create": True}}
    (steps / "step.yml").write_text(yaml.safe_dump([
        record,
        {"name": "Fail the gate here", "ansible.builtin.fail": {"msg": "gate failed on {{ inventory_hostname }}"},
         "when": ["__step == 'gate'", "inventory_hostname == %r" % fail_on]}]))
    (steps / "rescue.yml").write_text(yaml.safe_dump([
        record, {"name": "Say what happened", "ansible.builtin.set_fact": {"__rollout_stop_msg": "rollout stopped at {{ inventory_hostname }}"}}]))
    # the pair's rescue leaves the stop to the pair's last task (its message in __rollout_stop_msg)
    (steps / "pair_rescue.yml").write_text(yaml.safe_dump([
        record, {"name": "Say what happened", "ansible.builtin.set_fact": {
            "__rollout_stop_msg": "rollout stopped at {{ inventory_hostname }}"}}]))

    def stand_in_task(task, step, path="step.yml"):
        out = {"name": task["name"], "ansible.builtin.include_tasks": str(steps / path), "vars": {"__step": step}}
        if "when" in task:
            out["when"] = task["when"]
        return out
    block = dict(block, block=[{"name": task["name"], "ansible.builtin.include_tasks": str(steps / "step.yml"),
                                "vars": {"__step": step}} for task, step in zip(block["block"], STEPS)])
    single_rescue, note = block["rescue"]
    block["rescue"] = [stand_in_task(single_rescue, "single-rescue", "rescue.yml"), note]
    # the pair's rollback: every task that acts on a host a stand-in; the worker's message (a set_fact) as it is
    acts = [task for task in pair["block"] if "ansible.builtin.set_fact" not in task]
    # pair-ple runs only where the switch back changed something (not here: nothing was switched)
    names = ["pair-stop-head", "pair-switch-back", "pair-ple", "pair-ray-worker", "pair-ray-head", "pair-rescue"]
    assert len(acts) == len(names), [task["name"] for task in pair["block"]]
    pair = dict(pair, block=[stand_in_task(task, step, "pair_rescue.yml" if step == "pair-rescue" else "step.yml")
                             for task, step in zip(acts, names)]
                + [task for task in pair["block"] if "ansible.builtin.set_fact" in task])
    play = dict(play, hosts="all", serial=[2, 1], tasks=[block, pair, stand_in_task(release, "release"), stop])
    path = tmp_path / "batch.yml"
    path.write_text(yaml.safe_dump([play], sort_keys=False))
    return path


def test_a_failure_on_a_pairs_head_rolls_both_nodes_back_worker_first_and_stops(tmp_path):
    """A pair (head and worker: one batch) whose head fails its gate: neither node runs a single Spark's
    rescue; after the block both run the pair's rollback, the worker's Ray node before the head's, the
    head's server last; both fail (the worker naming the pair), and the later batch is never touched."""
    playbook = pair_stand_in(tmp_path, fail_on="head")
    inventory = tmp_path / "inventory.json"
    local = single_spark_vars()
    pair = {"cluster_name": "pair-x"}
    inventory.write_text(json.dumps({"all": {"hosts": {
        "head": dict(local, cluster_role="head", **pair), "worker": dict(local, cluster_role="worker", **pair),
        "single": dict(local, cluster_role="", cluster_name="")}}}))
    proc = harness.run_playbook(playbook, inventory=inventory, connection=None,
                                env=harness.ansible_env(stdout_callback="ansible.builtin.default"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    # neither releases its previous checkpoint copy (the gate did not pass on the pair)
    assert ran(tmp_path, "head") == STEPS + ["pair-stop-head", "pair-switch-back", "pair-ray-head", "pair-rescue"], out[-3000:]
    assert ran(tmp_path, "worker") == STEPS + ["pair-switch-back", "pair-ray-worker"], out[-3000:]
    assert "rollout stopped at head" in out and "rollout stopped at pair pair-x" in out, out[-3000:]
    assert ran(tmp_path, "single") == [], out[-3000:]
    # the worker's Ray node went back before the head's (the play runs the two tasks in this order)
    assert out.index("A pair's worker - its previous Ray node") < out.index("A pair's head - its previous Ray node")
