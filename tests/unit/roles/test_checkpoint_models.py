# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model's own checkpoint on a Spark with several models (spark_models, SPEC §13): the checkpoint
role's per-model entry points, run by Ansible on the local host.

- validate: each entry's checkpoint settings checked as the host's are, every message naming the
  entry (one ansible-playbook start, one local host per case);
- tasks_from models: each model's checkpoint fetched from a local path into spark_model_dir/<name>,
  in the list's order, a model without checkpoint_source left alone; the host's own spark_checkpoint_*
  facts as the host's run left them, each model's in spark_checkpoint_models;
- a new revision of a model whose folder holds another: staged beside it by tasks_from models (the
  served copy unchanged, the model noted as staged); then that model alone (tasks_from each_model with
  __checkpoint_only, as rollout.yml's per-model steps run it) switched in, switched back, switched in
  again and released, the other models and the host's own facts untouched."""
import os
import sys

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from support_checkpoint import failures, publish, result_of, snapshot, steps_by_play, write_checkpoint  # noqa: E402

from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402
from harness import batch_inventory, host_failure, play_json, validate_batch  # noqa: E402

HOST = "spark"
SHA = "0123456789abcdef0123456789abcdef01234567"


def entry(name, port, **settings):
    return dict({"name": name, "priority": port - 8000, "port": port}, **settings)


GOOD = [entry("chat", 8000, checkpoint_source="huggingface", checkpoint_hf_repo="org/chat", checkpoint_revision=SHA),
        entry("tiny-embed", 8001, checkpoint_source="path", checkpoint_src_path="/srv/share/embed"),
        entry("by-hand", 8002)]


def bad(index, **settings):
    models = [dict(m) for m in GOOD]
    models[index].update(settings)
    return {"spark_models": models}


VALIDATE = {
    "good": ({"spark_models": GOOD}, None),
    "bad-source": (bad(1, checkpoint_source="s3"), "spark_models[1] (tiny-embed) checkpoint_source = \"s3\""),
    "no-src-path": (bad(1, checkpoint_src_path=""), "spark_models[1] (tiny-embed) checkpoint_src_path"),
    "relative-src": (bad(1, checkpoint_src_path="share/embed"), "spark_models[1] (tiny-embed) checkpoint_src_path"),
    "branch": (bad(0, checkpoint_revision="main"), "spark_models[0] (chat) checkpoint_revision"),
    "no-repo": (bad(0, checkpoint_hf_repo=""), "spark_models[0] (chat) checkpoint_hf_repo"),
    "plain-http": (bad(2, checkpoint_source="http", checkpoint_url="http://mirror.lan/by-hand"),
                   "spark_models[2] (by-hand) checkpoint_url = \"http://mirror.lan/by-hand\": plain http://"),
    "revision-type": (bad(1, checkpoint_revision=7), "spark_models[1] (tiny-embed) checkpoint_revision"),
    # the source is its own folder
    "src-is-dir": (bad(1, checkpoint_src_path="/srv/sparkops/models/tiny-embed"),
                   "spark_models[1] (tiny-embed) checkpoint_src_path"),
}


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt-models-validate")
    doc = validate_batch(tmp, "checkpoint", dict((case, values) for case, (values, _n) in VALIDATE.items()))
    return doc


@pytest.mark.parametrize("case", sorted(VALIDATE))
def test_each_models_settings_are_checked_naming_the_entry(validated, case):
    needle = VALIDATE[case][1]
    failure = host_failure(validated, case)
    if needle is None:
        assert failure is None, failure
    else:
        assert failure is not None, "%s passed" % case
        assert needle in failure["msg"], failure["msg"]
        assert "Fix" in failure["msg"], failure["msg"]


# What a Hugging Face fetch of the model before leaves as host facts (its Hub listing, its transfer's
# result): a later model's fetch must not verify against them.
LEFT_BY_A_HUB_FETCH = {"__checkpoint_expected": [{"path": "model.safetensors", "size": 1, "sha256": "0" * 64}],
                       "__checkpoint_fetch_result": {"changed": True, "total_bytes": 1}}


def role_play(name, tasks_from, models, rescue=False, before=None, include_vars=None):
    include = {"ansible.builtin.include_role": {"name": "sparkops.appliance.checkpoint", "tasks_from": tasks_from}}
    task = dict(include, name="the role")
    if include_vars:
        task["vars"] = include_vars
    if rescue:  # the host goes on to the next play, what the role said kept
        task = {"name": "the role, its failure kept", "block": [task],
                "rescue": [{"name": "what failed", "ansible.builtin.set_fact": {"role_failure": "{{ ansible_failed_result.msg }}"}}]}
    facts = {"name": "the facts", "ansible.builtin.debug": {"msg": {
        "dir": "{{ spark_checkpoint_dir | default('') }}", "bytes": "{{ spark_checkpoint_bytes | default('') }}",
        "fetched": "{{ spark_checkpoint_fetched | default('') }}", "staged": "{{ spark_checkpoint_staged | default('') }}",
        "models": "{{ spark_checkpoint_models | default([]) }}", "failure": "{{ role_failure | default('') }}"}}}
    first = [{"name": "what the run before left", "ansible.builtin.set_fact": before}] if before else []
    return {"name": name, "hosts": HOST, "gather_facts": False, "vars": {"spark_models": models},
            "tasks": first + [task, facts]}


def run(tmp, name, plays, inventory):
    path = tmp / (name + ".yml")
    path.write_text(yaml.safe_dump(plays))
    return steps_by_play(play_json(path, inventory=inventory), HOST)


def models_at(src, r_chat):
    return [entry("chat", 8000, checkpoint_source="path", checkpoint_src_path=src, checkpoint_revision=r_chat),
            entry("embed", 8001, checkpoint_source="path", checkpoint_src_path=src),
            entry("by-hand", 8002)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt-models")
    src = write_checkpoint(str(tmp / "share" / "tiny"))
    publish(src, None)
    models = tmp / "models"
    inventory = batch_inventory(tmp, {HOST: {
        "spark_model_dir": str(models), "spark_model_name": "host-model",
        # the host's own checkpoint, fetched by the host's run of the role
        "checkpoint_source": "path", "checkpoint_src_path": src,
        "checkpoint_progress_file": str(tmp / "progress.json"),
        "checkpoint_ple_pack_gib": 0, "checkpoint_min_free_margin_gib": 0,
        "checkpoint_progress_interval_s": 1, "checkpoint_fetch_timeout_s": 120}})
    w = {"tmp": tmp, "models": str(models)}
    w["fetch"] = run(tmp, "fetch", [role_play("host", "main", []),
                                    role_play("models", "models", models_at(src, "r1"), before=LEFT_BY_A_HUB_FETCH),
                                    role_play("models again", "models", models_at(src, "r1"))], inventory)
    w["after_fetch"] = dict((n, snapshot(str(models / n))) for n in ("chat", "embed", "host-model"))
    w["listing"] = sorted(os.listdir(str(models)))
    w["intact"] = ck.intact(str(models / "chat"), "r1") and ck.intact(str(models / "embed"))
    w["staged"] = run(tmp, "staged", [role_play("model play", "models", models_at(src, "r2"))], inventory)
    w["after_staged"] = dict((n, snapshot(str(models / n))) for n in ("chat", "embed", "host-model"))
    w["listing_staged"] = sorted(os.listdir(str(models)))
    w["staged_intact"] = ck.intact(str(models / "chat.staged"), "r2")

    def one(step):  # the chat model's step alone, as roles/rollout/tasks/model.yml runs it
        return {"__checkpoint_each": step + ".yml", "__checkpoint_only": "chat"}
    w["roll"] = run(tmp, "roll", [role_play("switch", "each_model", models_at(src, "r2"), include_vars=one("switch")),
                                  role_play("switch back", "each_model", models_at(src, "r2"), include_vars=one("switch_back")),
                                  role_play("switch again", "each_model", models_at(src, "r2"), include_vars=one("switch")),
                                  role_play("release", "each_model", models_at(src, "r2"), include_vars=one("release"))],
                    inventory)
    w["after_roll"] = dict((n, snapshot(str(models / n))) for n in ("chat", "embed", "host-model"))
    w["listing_roll"] = sorted(os.listdir(str(models)))
    w["rolled_intact"] = ck.intact(str(models / "chat"), "r2")
    return w


def facts(steps):
    return result_of(steps, "the facts")["msg"]


def test_each_model_is_fetched_into_its_folder_in_order(world):
    steps = world["fetch"]
    for play in ("host", "models", "models again"):
        assert failures(steps[play]) == [], play
    # by-hand (no checkpoint_source) is left alone: no folder made for it
    assert world["listing"] == ["chat", "embed", "host-model"]
    assert world["intact"]
    noted = facts(steps["models"])["models"]
    assert [(m["name"], m["dir"], m["fetched"], m["revision"]) for m in noted] == [
        ("chat", world["models"] + "/chat", True, "r1"), ("embed", world["models"] + "/embed", True, "")]
    assert all(m["bytes"] > 0 for m in noted)
    # a re-run fetches nothing
    assert [m["fetched"] for m in facts(steps["models again"])["models"]] == [False, False]


def test_a_models_run_leaves_the_hosts_own_facts(world):
    steps = world["fetch"]
    host = facts(steps["host"])
    assert host["dir"] == world["models"] + "/host-model" and host["fetched"] in (True, "True")
    for play in ("models", "models again"):
        after = facts(steps[play])
        assert (after["dir"], after["bytes"], after["fetched"], after["staged"]) == (
            host["dir"], host["bytes"], host["fetched"], host["staged"]), play


def test_a_new_revision_of_a_model_is_staged_beside_its_folder(world):
    steps = world["staged"]
    assert failures(steps["model play"]) == []
    # the served copies as they were; the new revision beside chat's, verified
    assert world["after_staged"] == world["after_fetch"]
    assert world["listing_staged"] == ["chat", "chat.staged", "embed", "host-model"]
    assert world["staged_intact"]
    noted = dict((m["name"], m) for m in facts(steps["model play"])["models"])
    assert (noted["chat"]["staged"], noted["chat"]["staged_dir"]) == (True, world["models"] + "/chat.staged")
    assert (noted["embed"]["staged"], noted["embed"]["staged_dir"]) == (False, "")
    # the host's own checkpoint stays the host's: nothing of its staged
    assert facts(steps["model play"])["staged"] in ("", False, "False")


def test_one_models_staged_revision_is_switched_back_and_forth_and_released_alone(world):
    steps = world["roll"]
    for play in ("switch", "switch back", "switch again", "release"):
        assert failures(steps[play]) == [], play
        # the host's own facts: no switch of a model's copy is the host's (rollout.yml reads them for its one model)
        assert facts(steps[play])["staged"] in ("", False, "False"), play
    said = dict((play, " ".join(str(r.get("msg", "")) for t, r in steps[play] if t.startswith("Checkpoint | report")))
                for play in steps)
    assert said["switch"].startswith("spark_models[0] (chat) %s/chat: " % world["models"]), said["switch"]
    # that model alone: no other model's copy is switched, switched back or released
    assert all("(embed)" not in text and "(by-hand)" not in text for text in said.values()), said
    assert "must restart to load it" in said["switch"] and "must restart" in said["switch again"]
    assert "nothing to switch back" not in said["switch back"], said["switch back"]
    assert "no previous copy to release" not in said["release"], said["release"]
    # the end: chat serves r2 from its folder, nothing kept or staged beside it; embed and the host's untouched
    assert world["listing_roll"] == ["chat", "embed", "host-model"]
    assert world["rolled_intact"]
    assert world["after_roll"]["embed"] == world["after_fetch"]["embed"]
    assert world["after_roll"]["host-model"] == world["after_fetch"]["host-model"]
