# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's agent check (roles/serve/files/serve-unit `agent`, docs/gateway.md): one line, `up`
or `down #why`, from systemd's state of the unit (a stand-in `systemctl` answering ActiveState and
InvocationID) and the liveness state file as `run` writes it. A stalled server whose /health still
answers is `down`; so is a unit that is not active (starting, restarting, failed); a unit without
liveness is judged by systemd alone; the reply is never `ready` or `drain` (they would change the
gateway's administrative state, which is the rollout's)."""
import json
import os
import subprocess
import sys

import pytest

import harness

HELPER = os.path.join(harness.ROOT, "roles", "serve", "files", "serve-unit")
UNIT = "sparkops-serve.service"


@pytest.fixture(name="box")
def box_fixture(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "live").mkdir()
    return tmp_path


def systemd(box, active="active", invocation="inv-now"):
    script = box / "bin" / "systemctl"
    # as systemd prints `systemctl show --property=A,B UNIT`: NAME=value lines, in its own order
    script.write_text('#!/bin/sh\n[ "$1" = show ] || exit 1\nprintf "InvocationID=%s\\nActiveState=%s\\n"\n'
                      % (invocation, active))
    script.chmod(0o755)


def state(box, **fields):
    data = {"state": "live", "reason": "x", "invocation": "inv-now", "unit": UNIT}
    data.update(fields)
    (box / "live" / "state.json").write_text(json.dumps(data))


def agent(box, liveness=True):
    env = dict(os.environ, PATH="%s:%s" % (box / "bin", os.environ["PATH"]))
    r = subprocess.run([sys.executable, HELPER, "agent", "--unit", UNIT, "--liveness-dir", str(box / "live") if liveness else ""],
                       capture_output=True, text=True, env=env, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n") and r.stdout.count("\n") == 1, r.stdout
    return r.stdout.rstrip("\n")


def test_an_active_live_server_is_up(box):
    systemd(box)
    state(box)
    assert agent(box) == "up #live"


@pytest.mark.parametrize("verdict", ["stalled", "starting", "given_up"])
def test_a_server_liveness_does_not_find_live_is_down_though_active(box, verdict):
    systemd(box)
    state(box, state=verdict, reason="no progress for 45 s\nand a # in it")
    reply = agent(box)
    assert reply.startswith("down #liveness: %s (no progress for 45 s" % verdict), reply
    assert reply.count("#") == 1     # the reason's own # and newline never reach the gateway


@pytest.mark.parametrize("active", ["activating", "deactivating", "failed", "inactive"])
def test_a_unit_that_is_not_active_is_down(box, active):
    systemd(box, active=active)
    state(box)
    assert agent(box) == "down #%s is %s" % (UNIT, active)


def test_a_unit_without_liveness_or_with_an_older_state_is_judged_by_systemd(box):
    systemd(box)
    assert agent(box) == "up #active; no liveness state (a unit without liveness)"
    assert agent(box, liveness=False) == "up #active; liveness off"
    state(box, state="stalled", invocation="inv-before")
    assert agent(box) == "up #active; the liveness state is of an earlier start"


def test_no_answer_from_systemd_is_down(box):
    (box / "bin" / "systemctl").write_text("#!/bin/sh\nexit 1\n")
    (box / "bin" / "systemctl").chmod(0o755)
    assert agent(box).startswith("down #")
