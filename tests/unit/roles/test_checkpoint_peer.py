# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint role's peer source, run by Ansible on the local host with a real rsync: the peer
is a second inventory host on this machine (its manifest read through it), and ssh is a stand-in
that runs the remote command here (what sshd would run on the peer), so rsync talks its own protocol
to a real `rsync --server`. Stand-in: ssh (no sshd here); real: rsync, the role, its modules.

- a fresh host pulls the peer's served copy (r1) into checkpoint_dir;
- the peer then stages r2 beside its served copy (a rollout not yet switched): the host pinned at r2
  pulls the peer's staged copy into its own staging directory, the files of the same sha256
  hard-linked from its served copy, which stays untouched; again: nothing changes."""
import os
import shutil
import stat
import sys

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from support_checkpoint import SHARDS, publish, snapshot, write_checkpoint  # noqa: E402

from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402
from harness import ansible_env, batch_inventory, host_results, play_json  # noqa: E402

HOST, PEER = "spark-b", "spark-a"
CHANGED = "model-00001-of-00002.safetensors"   # r2 changes it at the same size

# ssh's options that take a value (ssh(1)); the first other word is the host, the rest the command
SSH_STANDIN = """#!%(python)s
# Stand-in for ssh (no sshd here): runs the remote command on this machine, as sshd would on the peer.
import os, sys
with_value = set("-b -c -D -E -e -F -I -i -J -L -l -m -O -o -p -Q -R -S -W -w".split())
args, i = sys.argv[1:], 0
while i < len(args) and args[i].startswith("-"):
    i += 2 if args[i] in with_value else 1
with open(os.environ["SSH_STANDIN_LOG"], "a") as log:
    log.write(" ".join(args[i + 1:]) + "\\n")
os.execvp("sh", ["sh", "-c", " ".join(args[i + 1:])])
"""


def peer_play(name, revision):
    include = {"ansible.builtin.include_role": {"name": "sparkops.appliance.checkpoint"}}
    return {"name": name, "hosts": HOST, "gather_facts": False,
            "vars": {"checkpoint_revision": revision}, "tasks": [dict(include, name="the role")]}


def steps_of(doc):
    steps = {}
    for play, task, result in host_results(doc, HOST):
        steps.setdefault(play, []).append((task.split(" : ", 1)[-1], result))
    return steps


def result_of(steps, name):
    found = [r for t, r in steps if t == name]
    assert found, "no task %r in %s" % (name, [t for t, _r in steps])
    return found[-1]


def failures(steps):
    return [(t, r.get("msg")) for t, r in steps if r.get("failed") and not r.get("ignored")]


def changed(steps):
    return [t for t, r in steps if r.get("changed")]


def revision_at(path):
    m = ck.read_manifest_at(path) if os.path.isdir(path) else None
    return m and m.get("revision")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if shutil.which("rsync") is None:
        pytest.fail("rsync is not installed: make deps installs it (the peer source pulls with it)")
    tmp = tmp_path_factory.mktemp("ckpt-peer")
    peer_dir, d = str(tmp / "peer" / "m"), str(tmp / "host" / "m")
    publish(write_checkpoint(peer_dir), "r1")
    bindir = tmp / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(SSH_STANDIN % {"python": sys.executable})
    (bindir / "ssh").chmod(stat.S_IRWXU)
    log = tmp / "ssh.log"
    env = dict(ansible_env(), PATH="%s:%s" % (bindir, os.environ["PATH"]), SSH_STANDIN_LOG=str(log))
    inventory = batch_inventory(tmp, {PEER: {}, HOST: {
        "checkpoint_source": "peer", "checkpoint_peer_host": PEER, "checkpoint_peer_address": "127.0.0.1",
        "checkpoint_peer_dir": peer_dir, "checkpoint_dir": d, "checkpoint_progress_file": str(tmp / "progress.json"),
        "checkpoint_ple_pack_gib": 0, "checkpoint_min_free_margin_gib": 0}})

    def run(name, plays):
        path = tmp / (name + ".yml")
        path.write_text(yaml.safe_dump(plays))
        return steps_of(play_json(path, inventory=inventory, env=env))

    w = {"d": d, "log": log}
    w.update(run("fresh", [peer_play("fresh", "r1")]))
    w["after_fresh"] = snapshot(d)
    # the peer stages r2 (same-size change in one shard) beside the copy it serves
    staged = peer_dir + ".staged"
    shutil.copytree(peer_dir, staged)
    os.remove(os.path.join(staged, ck.MANIFEST_NAME))
    with open(os.path.join(staged, CHANGED), "r+b") as f:
        f.write(bytes(b ^ 0x5A for b in f.read(64)))
    publish(staged, "r2")
    w["peer_r2"] = snapshot(staged)
    w["log_before_stage"] = log.read_text()
    w.update(run("stage", [peer_play("stage", "r2"), peer_play("stage again", "r2")]))
    w["after_stage"] = snapshot(d)
    w["staged_copy"] = snapshot(d + ".staged")
    w["layout"] = {"dir": revision_at(d), "staged": revision_at(d + ".staged")}
    w["staged_intact"] = ck.intact(d + ".staged", "r2")
    w["linked"] = sorted(k for k in SHARDS if os.stat(os.path.join(d, k)).st_ino == os.stat(os.path.join(d + ".staged", k)).st_ino)
    w["rsync_calls"] = [line for line in log.read_text().splitlines()[len(w["log_before_stage"].splitlines()):]
                        if line.startswith("rsync")]
    return w


def files_of(snap):
    """{relative path: sha256 (None for a directory)} of a snapshot, our own records left out."""
    return {k: v[0] for k, v in snap.items() if not os.path.basename(k).startswith(".sparkops-")}


def test_a_fresh_host_pulls_the_peers_served_copy(world):
    fresh = world["fresh"]
    assert failures(fresh) == []
    assert world["layout"]["dir"] == "r1"
    facts = result_of(fresh, "Checkpoint | export the checkpoint's size for the memory plan")["ansible_facts"]
    assert facts["spark_checkpoint_fetched"] is True and facts["spark_checkpoint_staged"] is False
    assert int(facts["spark_checkpoint_bytes"]) == sum(SHARDS.values())
    assert "rsync --server --sender" in world["log_before_stage"]


def test_the_peers_staged_revision_is_pulled_into_the_hosts_staging_directory(world):
    """The peer serves r1 and holds r2 staged: the host pinned at r2 pulls from <peer dir>.staged, into
    its own staging directory; its served copy is as before to the inode and mtime."""
    stage = world["stage"]
    assert failures(stage) == []
    assert world["after_stage"] == world["after_fresh"]
    assert world["layout"] == {"dir": "r1", "staged": "r2"} and world["staged_intact"]
    assert files_of(world["staged_copy"]) == files_of(world["peer_r2"])
    assert [c for c in world["rsync_calls"] if world["d"] not in c and ".staged" in c], world["rsync_calls"]
    # what did not change is linked from the served copy, not pulled again; the changed shard is not
    assert world["linked"] == sorted(k for k in SHARDS if k != CHANGED)
    facts = result_of(stage, "Checkpoint | export the checkpoint's size for the memory plan")["ansible_facts"]
    assert facts["spark_checkpoint_staged"] is True and facts["spark_checkpoint_staged_dir"] == world["d"] + ".staged"
    assert facts["spark_checkpoint_fetched"] is False


def test_staging_from_the_peer_again_changes_nothing(world):
    again = world["stage again"]
    assert failures(again) == [] and changed(again) == []
