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
