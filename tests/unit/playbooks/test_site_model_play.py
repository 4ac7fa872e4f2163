# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml's model play, as site.yml has it, run on the local host with the example inventory's
values (the product: inventories/example/group_vars/sparks/main.yml) in check mode; only what this
machine has not is set: no checkpoint source to fetch from, and a model directory here.

The example inventory leaves ple_enabled to the ple role's default (true), which the play's own
conditions could not see: the play stopped on "'ple_enabled' is undefined" before the pack, while
every lab run passed (the lab sets ple_enabled: false)."""
import os
import sys

import yaml

import harness

EXAMPLE = os.path.join(harness.ROOT, "inventories", "example", "group_vars", "sparks", "main.yml")


def test_the_model_play_runs_on_the_example_inventorys_values(tmp_path):
    with open(os.path.join(harness.ROOT, "playbooks", "site.yml")) as handle:
        model = [p for p in yaml.safe_load(handle) if p["name"].startswith("Model")]
    assert len(model) == 1
    (tmp_path / "model.yml").write_text(yaml.safe_dump(model))
    with open(EXAMPLE) as handle:
        example = yaml.safe_load(handle)
    assert "ple_enabled" not in example   # the case: left to the role's default
    host = dict(example, ansible_connection="local", ansible_python_interpreter=sys.executable,
                checkpoint_source="none",                        # nothing to fetch from here
                spark_model_dir=str(tmp_path / "models"))        # no /srv here
    inventory = {"all": {"children": {"sparks": {"hosts": {"spark-01": host}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    doc = harness.play_json(tmp_path / "model.yml", inventory=tmp_path / "hosts.yml", args=["--check"], connection=None)
    steps = [(task.split(" : ", 1)[-1], result) for _play, task, result in harness.host_results(doc, "spark-01")]
    failed = [(name, r.get("msg")) for name, r in steps if r.get("failed")]
    assert failed == []
    names = [name for name, _r in steps]
    # the ple role ran (the example's model has PLE tables): in check mode it says the pack waits
    waits = [r for name, r in steps if name == "Say that the pack waits for the checkpoint"]
    assert waits and "would be written once the checkpoint is fetched" in " ".join(waits[0]["msg"].split())
    assert "Compute the memory plan" in names
    assert not (tmp_path / "models").exists()   # check mode


def _play(name, playbook="site.yml"):
    with open(os.path.join(harness.ROOT, "playbooks", playbook)) as handle:
        found = [p for p in yaml.safe_load(handle) if p["name"].startswith(name)]
    assert len(found) == 1
    return found[0]


def test_the_model_play_fetches_each_models_checkpoint_into_its_folder(tmp_path):
    """Several models on one Spark: each model's checkpoint_source path, fetched by the play as site.yml has
    it into spark_model_dir/<name>, in the list's order; a model without checkpoint_source is left alone."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)) + "/..")
    from support_checkpoint import write_checkpoint
    from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck
    src = write_checkpoint(str(tmp_path / "share" / "tiny"))
    (tmp_path / "model.yml").write_text(yaml.safe_dump([_play("Model")]))
    tiny = {"weight_bytes": 16777216, "overhead_gib": 0.5, "max_model_len": 1024, "kv_bytes_per_token": 512,
            "kv_target_gib": 0.125}
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "spark_model_dir": str(tmp_path / "models"), "checkpoint_source": "none", "ple_enabled": False,
            "checkpoint_progress_file": str(tmp_path / "progress.json"), "checkpoint_min_free_margin_gib": 0,
            "checkpoint_ple_pack_gib": 0,
            "spark_models": [dict(tiny, name="chat", priority=2, port=8000, checkpoint_source="path",
                                  checkpoint_src_path=src, checkpoint_revision="r1"),
                             dict(tiny, name="by-hand", priority=0, port=8002),
                             dict(tiny, name="embed", priority=1, port=8001, checkpoint_source="path",
                                  checkpoint_src_path=src)]}
    inventory = {"all": {"children": {"sparks": {"hosts": {"spark-04": host}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    doc = harness.play_json(tmp_path / "model.yml", inventory=tmp_path / "hosts.yml", connection=None)
    steps = [(task.split(" : ", 1)[-1], result) for _play_name, task, result in harness.host_results(doc, "spark-04")]
    assert [(name, r.get("msg")) for name, r in steps if r.get("failed")] == []
    reports = [" ".join(r["msg"].split()) for name, r in steps if name == "Checkpoint | report" and "msg" in r]
    assert [m.split(":")[0] for m in reports] == [
        "spark_models[0] (chat) %s/models/chat" % tmp_path, "spark_models[2] (embed) %s/models/embed" % tmp_path]
    assert sorted(os.listdir(str(tmp_path / "models"))) == ["chat", "embed"]
    assert ck.intact(str(tmp_path / "models" / "chat"), "r1") and ck.intact(str(tmp_path / "models" / "embed"))


def test_a_models_rollout_stages_switches_releases_and_switches_back_its_own_checkpoint_only():
    """roles/rollout/tasks/model.yml (one model's server in rollout.yml's batch): the model's checkpoint is
    staged before serve's prepare, switched in after the drain and before serve's apply (which restarts
    onto it), released only after the gate, and switched back first in the rescue; each step the
    checkpoint role's each_model for this model alone (serve's loop variable)."""
    with open(os.path.join(harness.ROOT, "roles", "rollout", "tasks", "model.yml")) as handle:
        block = yaml.safe_load(handle)[0]
    names = [t["name"] for t in block["block"]]

    def at(prefix):
        return [i for i, name in enumerate(names) if name.startswith(prefix)][0]

    def step(task):
        include = task["ansible.builtin.include_role"]
        assert include == {"name": "sparkops.appliance.checkpoint", "tasks_from": "each_model"}, task
        assert task["vars"]["__checkpoint_only"] == "{{ serve_served_model_name }}", task
        return task["vars"]["__checkpoint_each"]

    stage, switch, release = (at("This model's checkpoint - stage"), at("This model's checkpoint - switch"),
                              at("This model's checkpoint - release"))
    assert stage < at("Check the new command line") < at("Drain this model's server") < switch
    assert switch < at("Swap the unit and env") < at("Gate") < release < at("Note that this model's server passed")
    assert [step(block["block"][i]) for i in (stage, switch, release)] == ["model.yml", "switch.yml", "release.yml"]
    assert "__rollout_model_staged" in block["block"][at("Drain this model's server")]["when"]
    assert "its checkpoint was switched" in block["block"][at("Swap the unit and env")]["vars"]["__serve_apply_restart"]
    assert step(block["rescue"][0]) == "switch_back.yml"
