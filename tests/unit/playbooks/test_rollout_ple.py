# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""rollout.yml's PLE steps, taken as they are from the playbook and the rollout role's rescue, run by
Ansible on the local host with the real ple and checkpoint roles, on real safetensors checkpoints:
r1 served, r2 staged beside it with other and larger PLE tables.

Before, the batch never ran the ple role: serve's spark_ple_pack_file was unset, so the rollout
rendered a PLE server's unit without its pack, and a revision switched in was served with the pack
of the revision before it.

- the served copy: its pack is made where missing (current: nothing written), and the facts serve and
  the plan read are set (spark_ple_pack_file, spark_ple_bytes);
- the staged revision: its tables' sizes for its plan, read in check mode: the pack is not written;
- switched in (the checkpoint role's switch, as the batch runs it): the pack is made from r2;
- switched back (the rescue's two tasks): the pack is r1's again, byte for byte.
Four ansible-playbook starts, one per step; the stand-in is only what the batch set before (facts)."""
import hashlib
import json
import os
import sys

import pytest
import yaml

import harness

sys.path.insert(0, os.path.join(harness.ROOT, "tests", "unit", "plugins"))
from ple_checkpoints import DEFAULT_LAYOUT, PLE, build_checkpoint  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.sparkops.appliance.plugins.modules import checkpoint_verify, ple_pack  # noqa: E402  pylint: disable=wrong-import-position

HOST = "spark"
ROLLOUT = os.path.join(harness.ROOT, "playbooks", "rollout.yml")
RESCUE = os.path.join(harness.ROOT, "roles", "rollout", "tasks", "rescue.yml")
SERVED = "The PLE pack of the served copy (ple_enabled)"
STAGED = "The PLE tables of a staged revision (their sizes for its plan, nothing written)"
SWITCH = "The checkpoint - switch the staged revision in (the served copy kept until the gate passes)"
SWITCHED = "The PLE pack of the revision switched in (ple_enabled)"
BACK = "Put the checkpoint served before this rollout back in place (where it was switched)"
PACK_BACK = "The PLE pack of the checkpoint put back (ple_enabled)"
FACTS = ["spark_ple_pack_file", "spark_ple_bytes", "spark_checkpoint_switched"]


def batch_task(name):
    with open(ROLLOUT) as handle:
        play = [p for p in yaml.safe_load(handle) if p.get("hosts") == "__rollout_ordered"][0]
    found = [t for t in harness.walk_tasks(play["tasks"]) if t.get("name") == name]
    assert len(found) == 1, name
    return found[0]


def rescue_task(name):
    with open(RESCUE) as handle:
        found = [t for t in yaml.safe_load(handle) if t.get("name") == name]
    assert len(found) == 1, name
    return found[0]


def sha(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def ple_bytes(raw):
    return len(raw[PLE]) + sum(len(v) for k, v in raw.items() if k.endswith("embed_tokens_per_layer.weight") and k != PLE)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rollout-ple")
    models = tmp / "models"
    served, staged = models / "m", models / "m.staged"
    raw1 = build_checkpoint(served, seed=1)
    layout2 = [dict(shard) for shard in DEFAULT_LAYOUT]
    layout2[0][PLE] = ("bf16", (97, 72))                  # r2's main table: other values, more columns
    raw2 = build_checkpoint(staged, layout=layout2, seed=2)
    for path, revision in ((served, "r1"), (staged, "r2")):   # accepted copies, as the checkpoint role leaves them
        result = harness.run_module(checkpoint_verify, {"path": str(path), "create": True, "revision": revision})
        assert result.get("verified"), result
    inventory = harness.batch_inventory(tmp, {HOST: {
        "spark_model_dir": str(models), "spark_model_name": "m",       # ple_enabled: the role's default
        "checkpoint_source": "path", "checkpoint_src_path": str(tmp / "unused"), "checkpoint_revision": "r2",
        # what the batch's first play and the checkpoint role set before these steps
        "__sparkops_checked_roles": ["sparkops.appliance.checkpoint", "sparkops.appliance.ple"],
        "spark_checkpoint_staged": True, "spark_checkpoint_staged_dir": str(staged)}})
    pack = models / "m.ple"
    w = {"pack": pack, "raw1": raw1, "raw2": raw2, "served": served}

    def step(name, tasks):
        record = {"name": "record", "ansible.builtin.copy": {
            "dest": str(tmp / (name + ".json")), "mode": "0644",
            "content": "{{ {%s} | to_json }}" % ", ".join("'%s': %s | default(none)" % (f, f) for f in FACTS)}}
        path = tmp / (name + ".yml")
        path.write_text(yaml.safe_dump([{"name": name, "hosts": HOST, "gather_facts": False, "tasks": tasks + [record]}]))
        doc = harness.play_json(path, inventory=inventory)
        failed = [(t, r.get("msg")) for _p, t, r in harness.host_results(doc, HOST) if r.get("failed")]
        assert failed == [], failed
        facts = json.loads((tmp / (name + ".json")).read_text())
        return facts, (sha(pack) if pack.exists() else None), (os.stat(pack).st_mtime_ns if pack.exists() else None)

    w["served_step"] = step("served", [batch_task(SERVED)])
    w["staged_step"] = step("staged", [batch_task(STAGED)])
    w["switched_step"] = step("switched", [batch_task(SWITCH), batch_task(SWITCHED)])
    w["current_r2"] = not harness.run_module(ple_pack, {"checkpoint_dir": str(served), "dest": str(pack)}, check=True)["changed"]
    w["back_step"] = step("back", [rescue_task(BACK), rescue_task(PACK_BACK)])
    w["current_r1"] = not harness.run_module(ple_pack, {"checkpoint_dir": str(served), "dest": str(pack)}, check=True)["changed"]
    return w


def test_the_batch_packs_the_served_copy_and_gives_serve_the_pack(world):
    facts, digest, _mtime = world["served_step"]
    assert digest is not None
    assert facts["spark_ple_pack_file"] == str(world["pack"])
    assert int(facts["spark_ple_bytes"]) == ple_bytes(world["raw1"])


def test_a_staged_revisions_tables_are_measured_for_its_plan_and_nothing_is_written(world):
    facts, digest, mtime = world["staged_step"]
    assert (digest, mtime) == world["served_step"][1:]
    assert int(facts["spark_ple_bytes"]) == ple_bytes(world["raw2"]) > ple_bytes(world["raw1"])
    assert facts["spark_ple_pack_file"] == str(world["pack"])    # what the server mounts after the switch


def test_the_revision_switched_in_is_packed_before_its_server_starts(world):
    facts, digest, _mtime = world["switched_step"]
    assert facts["spark_checkpoint_switched"] is True
    assert digest != world["served_step"][1]
    assert int(facts["spark_ple_bytes"]) == ple_bytes(world["raw2"])
    assert world["current_r2"]


def test_the_rescue_puts_the_pack_of_the_copy_it_puts_back(world):
    facts, digest, _mtime = world["back_step"]
    assert digest == world["served_step"][1]                      # r1's pack, byte for byte
    assert int(facts["spark_ple_bytes"]) == ple_bytes(world["raw1"])
    assert world["current_r1"]
