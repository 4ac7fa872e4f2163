# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint role's peer source with the trust left to the user (checkpoint_peer_manage_trust:
false) checks its precondition first: this host must log in to the peer by SSH key. Here nothing
answers SSH on the peer address (127.0.0.1 on a port nobody listens on), so the run stops with a
message that names the variables and the fix, before the checkpoint directory exists. The trust the
role makes itself: test_checkpoint_peer.py."""
import json
import shutil
import socket
import sys

import pytest
import yaml

from ansible_json import stdout_json
from harness import run_playbook
from ansible_collections.sparkops.appliance.plugins.plugin_utils._role_inputs import input_problems, load_role_checks, load_role_options


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs an ssh client")
def test_an_untrusted_peer_stops_the_run_naming_the_fix_before_any_change(tmp_path):
    ckpt = tmp_path / "ckpt"
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                         "hosts": {"spark-b": {}, "spark-a": {}}}}
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([{
        "hosts": "spark-b", "gather_facts": False,
        "vars": {"checkpoint_source": "peer", "checkpoint_peer_host": "spark-a", "checkpoint_peer_manage_trust": False, "checkpoint_peer_address": "127.0.0.1",
                 "checkpoint_peer_ssh_opts": "-p %d -o UserKnownHostsFile=/dev/null" % free_port(), "checkpoint_dir": str(ckpt),
                 "checkpoint_peer_dir": str(tmp_path / "peer")},
        "roles": ["sparkops.appliance.checkpoint"]}]))
    proc = run_playbook(tmp_path / "pb.yml", inventory=tmp_path / "hosts.json", connection=None)
    assert proc.returncode != 0
    failed = [(t["task"]["name"], h) for t in stdout_json(proc)["plays"][0]["tasks"] for h in t["hosts"].values() if h.get("failed")]
    assert [name.split(" : ")[-1] for name, _h in failed] == ["Checkpoint | the peer does not accept this host"]
    msg = failed[0][1]["msg"]
    for words in ("checkpoint_peer_user (sparkops-peer)", "checkpoint_peer_address (127.0.0.1)", "authorized_keys on spark-a",
                  "Connection refused", "Nothing was changed"):
        assert words in msg, msg
    assert not ckpt.exists()


@pytest.mark.parametrize("values, refused", [
    ({"checkpoint_peer_user": "root"}, ["checkpoint_peer_user = \"root\"", "never root to root", "Fix: keep the default sparkops-peer"]),
    ({"checkpoint_peer_user": "Peer Copies"}, ["checkpoint_peer_user = \"Peer Copies\"", "a user name"]),
    ({"checkpoint_peer_user": "root", "checkpoint_peer_manage_trust": False}, []),   # the trust is the user's then
    ({}, []),                                                                          # the default: sparkops-peer
], ids=["root", "not-a-user-name", "root-unmanaged", "default"])
def test_the_peer_user_is_never_root_where_the_role_makes_the_trust(values, refused):
    """What the first play's check refuses (checks.yml through input_problems), before any host is touched."""
    values = dict({"checkpoint_source": "peer", "checkpoint_peer_address": "10.0.0.2", "checkpoint_peer_dir": "/srv/m"}, **values)
    problems = " ".join(input_problems(values, load_role_options(roles=["checkpoint"]), load_role_checks(roles=["checkpoint"])))
    for words in refused:
        assert words in problems, problems
    assert bool(problems) == bool(refused), problems
