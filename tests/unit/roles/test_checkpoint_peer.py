# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint role's peer source, run by Ansible on the local host with a real rsync and the
trust the role makes: the peer is a second inventory host on this machine, so the role makes its
user for peer copies here (a real system user, removed at the end), this host's own key, the
authorized_keys entry that lets that key run rsync's rrsync -ro on the peer's models directory
and nothing else, and the known hosts entry from the peer's host key.

Stand-in: ssh (no sshd here). It does what sshd and ssh would do with those files, nothing more:
the host key must be in the known hosts file it is given (StrictHostKeyChecking=yes), the key must
be in the user's authorized_keys, and that entry's forced command runs as that user, with the
requested command in SSH_ORIGINAL_COMMAND. Real: rsync and rrsync on both ends, the role, its modules.

- a fresh host pulls the peer's served copy (r1) into checkpoint_dir;
- the peer then stages r2 beside its served copy (a rollout not yet switched): the host pinned at r2
  pulls the peer's staged copy into its own staging directory, the files of the same sha256
  hard-linked from its served copy, which stays untouched; again: nothing changes;
- the key opens no shell and writes nothing on the peer; a user of that name that is not ours is
  refused before anything changes."""
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from support_checkpoint import (  # noqa: E402
    SHARDS, changed, failures, publish, result_of, revision_at, snapshot, steps_by_play, write_checkpoint)

from ansible_collections.sparkops.appliance.plugins.module_utils import _checkpoint as ck  # noqa: E402
from harness import ansible_env, batch_inventory, play_json  # noqa: E402

HOST, PEER = "spark-b", "spark-a"
USER = "sparkops-peer-t%d" % (os.getpid() % 100000)   # made by the role on this machine, removed at the end
NOT_OURS = "sparkops-other-t%d" % (os.getpid() % 100000)   # a user of that kind of name the role did not make
CHANGED = "model-00001-of-00002.safetensors"   # r2 changes it at the same size

SSH_STANDIN = r"""#!%(python)s
# Stand-in for ssh and the peer's sshd (no sshd here), see the test's docstring.
import os, pwd, shlex, sys
with_value = set("-b -c -D -E -e -F -I -i -J -L -l -m -O -o -p -Q -R -S -W -w".split())
args, i, opts, user, key = sys.argv[1:], 0, {}, None, None
while i < len(args) and args[i].startswith("-"):
    if args[i] == "-o":
        k, _, v = args[i + 1].partition("=")
        opts[k.lower()] = v
    elif args[i] == "-l":
        user = args[i + 1]
    elif args[i] == "-i":
        key = args[i + 1]
    i += 2 if args[i] in with_value else 1
host, command = args[i], " ".join(args[i + 1:])
if "@" in host:
    user, host = host.split("@", 1)
with open(os.environ["SSH_STANDIN_LOG"], "a") as log:
    log.write("%%s@%%s %%s\n" %% (user, host, command))
def deny(msg):
    sys.stderr.write(msg + "\n")
    sys.exit(255)
if opts.get("stricthostkeychecking") == "yes":
    wanted = open(os.environ["SSH_STANDIN_HOST_KEY"]).read().split()[:2]
    known = [line.split() for line in open(opts.get("userknownhostsfile", "/dev/null"))]
    if [host] + wanted not in [k[:3] for k in known]:
        deny("Host key verification failed.")
pub = open(key + ".pub").read().split()[:2] if key else None
home = pwd.getpwnam(user).pw_dir
entries = [line for line in open(os.path.join(home, ".ssh", "authorized_keys")) if pub and " ".join(pub) in line]
if not entries:
    deny("%%s@%%s: Permission denied (publickey)." %% (user, host))
forced = None
for word in shlex.split(entries[0].split(" ssh-")[0].replace(",", " ")):
    if word.startswith("command="):
        forced = word[len("command="):]
env = dict(os.environ, SSH_ORIGINAL_COMMAND=command, HOME=home, USER=user)
os.execvpe("runuser", ["runuser", "-u", user, "--", "sh", "-c", forced or command], env)
"""


def peer_play(name, revision):
    include = {"ansible.builtin.include_role": {"name": "sparkops.appliance.checkpoint"}}
    return {"name": name, "hosts": HOST, "gather_facts": False,
            "vars": {"checkpoint_revision": revision}, "tasks": [dict(include, name="the role")]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if shutil.which("rsync") is None or not os.path.exists("/usr/bin/rrsync"):
        pytest.fail("rsync (with rrsync) is not installed: make deps installs it (the peer source pulls with it)")
    tmp = tmp_path_factory.mktemp("ckpt-peer")
    # the peer's side where its unprivileged user can read it (pytest's own folders are root's, 0700)
    share = tempfile.mkdtemp(prefix="sparkops-peer-")
    os.chmod(share, 0o755)
    peer_dir, d = os.path.join(share, "models", "m"), str(tmp / "host" / "m")
    publish(write_checkpoint(peer_dir), "r1")
    bindir = tmp / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(SSH_STANDIN % {"python": sys.executable})
    (bindir / "ssh").chmod(stat.S_IRWXU)
    host_key = tmp / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    log = tmp / "ssh.log"
    env = dict(ansible_env(), PATH="%s:%s" % (bindir, os.environ["PATH"]), SSH_STANDIN_LOG=str(log),
               SSH_STANDIN_HOST_KEY=str(host_key) + ".pub")
    peer_vars = {
        "checkpoint_source": "peer", "checkpoint_peer_host": PEER, "checkpoint_peer_address": "127.0.0.1",
        "checkpoint_peer_dir": peer_dir, "checkpoint_progress_file": str(tmp / "progress.json"),
        "checkpoint_ple_pack_gib": 0, "checkpoint_min_free_margin_gib": 0,
        "checkpoint_peer_user": USER, "checkpoint_peer_home": os.path.join(share, "home"),
        "checkpoint_peer_key_file": str(tmp / "etc" / "peer.key"),   # a folder the role makes, as /etc/sparkops
        "checkpoint_peer_known_hosts": str(tmp / "known_hosts"),
        "checkpoint_peer_host_key_file": str(host_key) + ".pub"}
    inventory = batch_inventory(tmp, {PEER: {}, HOST: dict(peer_vars, checkpoint_dir=d),
                                      "spark-c": dict(peer_vars, checkpoint_dir=str(tmp / "c" / "m"),
                                                      checkpoint_peer_user=NOT_OURS)})

    def run(name, plays):
        path = tmp / (name + ".yml")
        path.write_text(yaml.safe_dump(plays))
        return steps_by_play(play_json(path, inventory=inventory, env=env), HOST, "spark-c")

    def ssh(*words):
        return subprocess.run(["ssh", "-i", str(tmp / "etc" / "peer.key"), "-o", "UserKnownHostsFile=%s" % (tmp / "known_hosts"),
                               "-o", "StrictHostKeyChecking=yes", "%s@127.0.0.1" % USER] + list(words),
                              env=env, capture_output=True, text=True, check=False)

    w = {"d": d, "log": log, "share": share}
    try:
        w.update(run("fresh", [peer_play("fresh", "r1")]))
        w["after_fresh"] = snapshot(d)
        w["user"] = pwd.getpwnam(USER)
        w["authorized"] = open(os.path.join(share, "home", ".ssh", "authorized_keys")).read()
        w["known_hosts"] = (tmp / "known_hosts").read_text()
        w["host_key"] = (host_key.parent / (host_key.name + ".pub")).read_text()
        # the peer stages r2 (same-size change in one shard) beside the copy it serves
        staged = peer_dir + ".staged"
        shutil.copytree(peer_dir, staged)
        os.remove(os.path.join(staged, ck.MANIFEST_NAME))
        with open(os.path.join(staged, CHANGED), "r+b") as f:
            f.write(bytes(b ^ 0x5A for b in f.read(64)))
        publish(staged, "r2")
        w["peer_r2"] = snapshot(staged)
        w["log_before_stage"] = log.read_text() if log.exists() else ""
        w.update(run("stage", [peer_play("stage", "r2"), peer_play("stage again", "r2")]))
        w["after_stage"] = snapshot(d)
        w["staged_copy"] = snapshot(d + ".staged")
        w["layout"] = {"dir": revision_at(d), "staged": revision_at(d + ".staged")}
        w["staged_intact"] = ck.intact(d + ".staged", "r2")
        w["linked"] = sorted(k for k in SHARDS if os.stat(os.path.join(d, k)).st_ino == os.stat(os.path.join(d + ".staged", k)).st_ino)
        w["rsync_calls"] = [line for line in (log.read_text() if log.exists() else "").splitlines()[len(w["log_before_stage"].splitlines()):]
                            if "rsync --server" in line]
        # what else the key can do on the peer: a shell command, and a write through rsync
        w["shell"] = ssh("cat", "/etc/hostname")
        w["peer_before_push"] = snapshot(peer_dir)
        w["push"] = subprocess.run(["rsync", "-e", "ssh -i %s -o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes" % (
            tmp / "etc" / "peer.key", tmp / "known_hosts"), str(tmp / "progress.json") if (tmp / "progress.json").exists() else "/etc/hostname",
            "%s@127.0.0.1:m/" % USER], env=env, capture_output=True, text=True, check=False)
        w["peer_after_push"] = snapshot(peer_dir)
        # a user of that name that sparkops did not make
        subprocess.run(["useradd", "--system", "--comment", "someone else", "--no-create-home", NOT_OURS], check=True)
        w["not_ours"] = run("not-ours", [dict(peer_play("not ours", "r2"), hosts="spark-c")])
        w["not_ours_dir"] = os.path.exists(str(tmp / "c" / "m"))
    finally:
        for user in (USER, NOT_OURS):
            subprocess.run(["userdel", user], capture_output=True, check=False)
        shutil.rmtree(share, ignore_errors=True)
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


def test_the_peer_copies_run_as_an_unprivileged_user_of_ours_with_this_hosts_own_key(world):
    """Not root to root: a system user the role made (no password, a home of its own), whose one
    authorized key is this host's own, restricted to rrsync -ro on the peer's models directory; the
    peer's host key known from Ansible, not accepted on first use."""
    user = world["user"]
    assert user.pw_uid != 0 and user.pw_uid < 1000 and user.pw_gecos == "sparkops checkpoint peer copies"
    assert user.pw_dir == os.path.join(world["share"], "home")
    lines = world["authorized"].splitlines()
    assert len(lines) == 1
    assert lines[0].startswith('restrict,command="/usr/bin/rrsync -ro %s" ssh-ed25519 ' % os.path.join(world["share"], "models"))
    assert lines[0].endswith("sparkops-peer-copy@%s" % HOST)
    assert world["known_hosts"] == "127.0.0.1 %s\n" % " ".join(world["host_key"].split()[:2])
    # every login of the run went through rrsync (the trust check included: a listing, not a shell)
    assert all("rsync --server" in line for line in world["log_before_stage"].splitlines()), world["log_before_stage"]


def test_the_key_opens_no_shell_and_writes_nothing_on_the_peer(world):
    assert world["shell"].returncode != 0 and "rrsync" in world["shell"].stderr, world["shell"]
    assert world["push"].returncode != 0, world["push"]
    assert world["peer_after_push"] == world["peer_before_push"]


def test_a_user_of_that_name_that_is_not_ours_is_refused_before_anything_changes(world):
    steps = world["not_ours"]["not ours"]
    failed = failures(steps)
    assert [t for t, _m in failed] == ["Checkpoint | refuse a user on the peer that is not ours"], failed
    msg = " ".join(failed[0][1].split())
    for words in ('checkpoint_peer_user is "%s"' % NOT_OURS, '"someone else"', "Nothing was changed",
                  "checkpoint_peer_manage_trust: false"):
        assert words in msg, msg
    assert not world["not_ours_dir"]


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
