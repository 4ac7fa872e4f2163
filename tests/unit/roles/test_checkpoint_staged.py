# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint role stages updates (docs/checkpoint.md, "Updates are staged"), run by Ansible on
the local host against a real Range-capable HTTP server on 127.0.0.1 that serves two releases:

- a fresh host fetches r1 straight into checkpoint_dir;
- r2 (one shard changed at the same size, config.json grown) is fetched into the staging directory,
  the changed shard whole, the rest hard-linked; every byte, size, mtime and inode under
  checkpoint_dir is as before, and the run says the rollout switches it; again: nothing changes;
- tasks_from switch, switch_back, switch, release, each run twice (the second changes nothing);
- a switch cut between its two renames (with the empty directory docker --volume leaves) is refused
  by the main entry point (nothing fetched) and finished by tasks_from switch.

Four ansible-playbook starts, each of several plays (one play a step, so that what each step
changed is counted on its own)."""
import os
import shutil
import sys
import threading

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from support_checkpoint import (  # noqa: E402
    SHARDS, changed, failures, publish, result_of, revision_at, snapshot, steps_by_play, write_checkpoint)
from range_http_server import make_server  # noqa: E402  (support_checkpoint put it on sys.path)

from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402
from harness import batch_inventory, play_json  # noqa: E402

HOST = "spark"
SAME_SIZE = "model-00001-of-00002.safetensors"
GROWS = "config.json"
KEPT = ("model-00002-of-00002.safetensors", "tokenizer/tokenizer.json", "empty.txt")


def layout(d):
    return {"dir": revision_at(d), "staged": revision_at(d + ".staged"), "previous": revision_at(d + ".previous")}


def role_play(name, revision, tasks_from="main", rescue=False):
    include = {"ansible.builtin.include_role": {"name": "sparkops.appliance.checkpoint", "tasks_from": tasks_from}}
    task = dict(include, name="the role")
    if rescue:  # the host goes on to the next play, what the role said kept
        task = {"name": "the role, its failure kept", "block": [task],
                "rescue": [{"name": "what failed", "ansible.builtin.set_fact": {"role_failure": "{{ ansible_failed_result.msg }}"}}]}
    return {"name": name, "hosts": HOST, "gather_facts": False,
            "vars": {"checkpoint_revision": revision, "checkpoint_url": "{{ base }}/" + revision},
            "tasks": [task]}


def run(tmp, name, plays, inventory):
    path = tmp / (name + ".yml")
    path.write_text(yaml.safe_dump(plays))
    doc = play_json(path, inventory=inventory)
    return doc, steps_by_play(doc, HOST)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt-staged")
    www = tmp / "www"
    r1 = write_checkpoint(str(www / "r1"))
    publish(r1, "r1")
    r2 = str(www / "r2")
    shutil.copytree(r1, r2)
    p = os.path.join(r2, SAME_SIZE)
    data = bytearray(open(p, "rb").read())
    for i in range(0, len(data), 4096):
        data[i] ^= 0x5A
    open(p, "wb").write(bytes(data))
    with open(os.path.join(r2, GROWS), "ab") as f:
        f.write(b"  ")
    publish(r2, "r2")
    server = make_server(str(www))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    d = str(tmp / "models" / "m")
    inventory = batch_inventory(tmp, {HOST: {
        "base": "http://127.0.0.1:%d" % server.server_address[1],
        "checkpoint_source": "http", "checkpoint_allow_http": True,  # the local stand-in has no TLS
        "checkpoint_dir": d, "checkpoint_progress_file": str(tmp / "progress.json"),
        "checkpoint_ple_pack_gib": 0, "checkpoint_min_free_margin_gib": 0,
        "checkpoint_progress_interval_s": 1, "checkpoint_fetch_timeout_s": 120}})
    w = {"tmp": tmp, "d": d, "server": server, "inventory": inventory}

    # A: a fresh host
    w["fresh"] = run(tmp, "fresh", [role_play("fresh", "r1")], inventory)[1]
    w["after_fresh"] = snapshot(d)
    w["fresh_intact"] = ck.intact(d, "r1") and not os.path.exists(d + ".staged")
    # B: r2 staged, then the same run again
    server.state.reset()
    w["stage"] = run(tmp, "stage", [role_play("stage", "r2"), role_play("stage again", "r2")], inventory)[1]
    w["served_b"] = dict(server.state.bytes)
    w["after_stage"] = snapshot(d)
    w["layout_b"] = layout(d)
    w["staged_intact"] = ck.intact(d + ".staged", "r2")
    w["links"] = [os.path.exists(os.path.join(d + ".staged", k))
                  and os.stat(os.path.join(d + ".staged", k)).st_ino == os.stat(os.path.join(d, k)).st_ino for k in KEPT]
    # C: switch, switch_back, each twice
    server.state.reset()
    w["cycle"] = run(tmp, "cycle", [role_play(n, "r2", n.split()[0]) for n in
                                    ("switch", "switch again", "switch_back", "switch_back again")], inventory)[1]
    w["layout_c"] = layout(d)
    w["after_cycle"] = snapshot(d)
    # D: the first rename of a switch done, the second not; the server restarted meanwhile
    if os.path.isdir(d) and not os.path.exists(d + ".previous"):
        os.rename(d, d + ".previous")
        os.mkdir(d)
    w["layout_cut"] = layout(d)
    w["finish"] = run(tmp, "finish", [role_play("site", "r2", rescue=True), role_play("switch", "r2", "switch"),
                                      role_play("switch again", "r2", "switch"), role_play("release", "r2", "release"),
                                      role_play("release again", "r2", "release")], inventory)[1]
    w["served_d"] = dict(server.state.bytes)
    w["layout_d"] = layout(d)
    w["final_intact"] = ck.intact(d, "r2")
    w["left"] = sorted(os.listdir(os.path.dirname(d)))
    server.shutdown()
    server.server_close()
    return w


def test_a_fresh_host_fetches_into_checkpoint_dir(world):
    fresh = world["fresh"]["fresh"]
    assert failures(fresh) == []
    facts = result_of(fresh, "Checkpoint | export the checkpoint's size for the memory plan")["ansible_facts"]
    assert facts["spark_checkpoint_staged"] is False and facts["spark_checkpoint_fetched"] is True
    assert facts["spark_checkpoint_dir"] == world["d"]
    assert world["fresh_intact"]


def test_a_new_revision_is_staged_and_the_served_copy_untouched(world):
    stage = world["stage"]["stage"]
    assert failures(stage) == []
    # every byte, size, mtime and inode under checkpoint_dir, manifest and fingerprint included
    assert world["after_stage"] == world["after_fresh"]
    assert world["layout_b"] == {"dir": "r1", "staged": "r2", "previous": None} and world["staged_intact"]
    # the same-size changed shard was fetched whole (not skipped for its size), config.json too,
    # the three unchanged files hard-linked, not fetched
    served = dict((k, v) for k, v in world["served_b"].items() if not k.endswith(ck.MANIFEST_NAME))
    assert served == {"r2/" + SAME_SIZE: SHARDS[SAME_SIZE], "r2/" + GROWS: SHARDS[GROWS] + 2}
    assert world["links"] == [True] * len(KEPT)
    facts = result_of(stage, "Checkpoint | export the checkpoint's size for the memory plan")["ansible_facts"]
    assert facts["spark_checkpoint_staged"] is True and facts["spark_checkpoint_fetched"] is False
    assert facts["spark_checkpoint_staged_dir"] == world["d"] + ".staged" and facts["spark_checkpoint_dir"] == world["d"]
    assert int(facts["spark_checkpoint_bytes"]) == sum(SHARDS.values()) + 2   # r2's, what loads after the switch
    msg = result_of(stage, "Checkpoint | report")["msg"]
    assert "serves revision r1 and was not changed; playbooks/rollout.yml switches it" in msg


def test_staging_again_changes_nothing(world):
    again = world["stage"]["stage again"]
    assert failures(again) == [] and changed(again) == []
    assert result_of(again, "Checkpoint | fetch from http").get("skipped")
    facts = result_of(again, "Checkpoint | export the checkpoint's size for the memory plan")["ansible_facts"]
    assert facts["spark_checkpoint_staged"] is True


def test_switch_and_switch_back_each_idempotent(world):
    cycle = world["cycle"]
    sw = result_of(cycle["switch"], "Checkpoint | switch the staged copy in")
    d = world["d"]
    assert sw["changed"] and sw["actions"] == ["rename %s -> %s.previous" % (d, d), "rename %s.staged -> %s" % (d, d)]
    facts = result_of(cycle["switch"], "Checkpoint | what the server loads on its next start")["ansible_facts"]
    assert facts["spark_checkpoint_switched"] is True and facts["spark_checkpoint_staged"] is False
    assert changed(cycle["switch again"]) == [] and failures(cycle["switch again"]) == []
    back = result_of(cycle["switch_back"], "Checkpoint | switch the previous copy back")
    assert back["changed"] and back["actions"] == ["rename %s -> %s.staged" % (d, d), "rename %s.previous -> %s" % (d, d)]
    facts = result_of(cycle["switch_back"], "Checkpoint | what the server loads on its next start")["ansible_facts"]
    assert facts["spark_checkpoint_switched"] is False and facts["spark_checkpoint_staged"] is True
    assert changed(cycle["switch_back again"]) == [] and failures(cycle["switch_back again"]) == []
    # back where it started: r1 served (the very same files), r2 staged
    assert world["layout_c"] == {"dir": "r1", "staged": "r2", "previous": None}
    assert world["after_cycle"] == world["after_fresh"]


def test_a_switch_cut_between_its_renames_is_refused_by_site_and_finished_by_switch(world):
    assert world["layout_cut"] == {"dir": None, "staged": "r2", "previous": "r1"}
    finish = world["finish"]
    site = finish["site"]
    msg = result_of(site, "what failed")["ansible_facts"]["role_failure"]
    assert "interrupted between its two renames" in msg and "tasks_from: switch" in msg and "Nothing was changed" in msg
    assert [k for k in world["served_d"] if not k.endswith(ck.MANIFEST_NAME)] == []   # nothing fetched
    sw = result_of(finish["switch"], "Checkpoint | switch the staged copy in")
    assert sw["changed"] and sw["actions"] == ["rename %s.staged -> %s" % (world["d"], world["d"])]
    assert changed(finish["switch again"]) == [] and failures(finish["switch again"]) == []
    rel = result_of(finish["release"], "Checkpoint | release the copy served before the last switch")
    assert rel["changed"] and failures(finish["release"]) == []
    assert changed(finish["release again"]) == [] and failures(finish["release again"]) == []
    assert world["layout_d"] == {"dir": "r2", "staged": None, "previous": None}
    assert world["final_intact"]
    assert world["left"] == ["m"]


def pinned_play(name, d, revision, release):
    """The role on checkpoint_dir d, pinned at revision ("" for none), fetching the release's directory."""
    include = {"ansible.builtin.include_role": {"name": "sparkops.appliance.checkpoint"}}
    return {"name": name, "hosts": HOST, "gather_facts": False,
            "vars": {"checkpoint_revision": revision, "checkpoint_url": "{{ base }}/" + release, "checkpoint_dir": d},
            "tasks": [dict(include, name="the role")]}


@pytest.fixture(scope="module")
def unrecorded(tmp_path_factory):
    """A copy that records no revision: fetched before checkpoint_revision was pinned (its release's
    manifest names none), then pinned; and a fresh host pinned at a release that names none."""
    tmp = tmp_path_factory.mktemp("ckpt-unrecorded")
    www = tmp / "www"
    plain = write_checkpoint(str(www / "plain"))
    publish(plain, None)                     # a publisher that names no revision
    shutil.copytree(plain, str(www / "r1"))
    publish(str(www / "r1"), "r1")           # the same bytes, released as r1
    server = make_server(str(www))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    inventory = batch_inventory(tmp, {HOST: {
        "base": "http://127.0.0.1:%d" % server.server_address[1],
        "checkpoint_source": "http", "checkpoint_allow_http": True,  # the local stand-in has no TLS
        "checkpoint_progress_file": str(tmp / "progress.json"),
        "checkpoint_ple_pack_gib": 0, "checkpoint_min_free_margin_gib": 0,
        "checkpoint_progress_interval_s": 1, "checkpoint_fetch_timeout_s": 120}})
    old, fresh = str(tmp / "models" / "old"), str(tmp / "models" / "fresh")
    w = {"old": old, "fresh": fresh}
    w["before"] = run(tmp, "before", [pinned_play("unpinned", old, "", "plain")], inventory)[1]["unpinned"]
    w["layout_before"], w["after_before"] = layout(old), snapshot(old)
    server.state.reset()
    steps = run(tmp, "pin", [pinned_play("pinned", old, "r1", "r1"), pinned_play("pinned again", old, "r1", "r1"),
                             pinned_play("fresh", fresh, "r1", "plain"),
                             pinned_play("fresh again", fresh, "r1", "plain")], inventory)[1]
    w.update(steps)
    w["fetched"] = sorted(k for k in server.state.bytes if not k.endswith(ck.MANIFEST_NAME))
    w["layout_old"], w["after_pin"], w["layout_fresh"] = layout(old), snapshot(old), layout(fresh)
    w["staged_intact"] = ck.intact(old + ".staged", "r1")
    server.shutdown()
    server.server_close()
    return w


def test_a_copy_that_records_no_revision_is_staged_against_when_a_revision_is_pinned(unrecorded):
    """Before: such a verified copy was kept whatever revision was pinned, and a rollout never
    switched the host to the pinned bytes. Now the pinned revision is staged beside it (every file of
    the same sha256 hard-linked), the served copy untouched, once."""
    w = unrecorded
    assert failures(w["before"]) == [] and w["layout_before"] == {"dir": None, "staged": None, "previous": None}
    pinned = w["pinned"]
    assert failures(pinned) == []
    assert w["after_pin"] == w["after_before"]
    assert w["layout_old"] == {"dir": None, "staged": "r1", "previous": None} and w["staged_intact"]
    facts = result_of(pinned, "Checkpoint | export the checkpoint's size for the memory plan")["ansible_facts"]
    assert facts["spark_checkpoint_staged"] is True and facts["spark_checkpoint_staged_dir"] == w["old"] + ".staged"
    msg = " ".join(result_of(pinned, "Checkpoint | report")["msg"].split())
    assert "Revision r1 staged beside %s, which serves a copy that records no revision" % w["old"] in msg
    again = w["pinned again"]
    assert failures(again) == [] and changed(again) == []


def test_a_copy_verified_at_a_pinned_revision_records_it_and_is_not_staged_again(unrecorded):
    """A release that names no revision, fetched with a pin: the copy records the pin, so the next
    run finds it at that revision (no staging, nothing changed), and no file moved over the wire for
    either host but the fresh host's first fetch."""
    w = unrecorded
    assert failures(w["fresh"]) == [] and w["layout_fresh"] == {"dir": "r1", "staged": None, "previous": None}
    facts = result_of(w["fresh"], "Checkpoint | export the checkpoint's size for the memory plan")["ansible_facts"]
    assert facts["spark_checkpoint_staged"] is False and facts["spark_checkpoint_fetched"] is True
    again = w["fresh again"]
    assert failures(again) == [] and changed(again) == []
    assert w["fetched"] == sorted("plain/" + k for k, size in SHARDS.items() if size)   # an empty file is made, not fetched
