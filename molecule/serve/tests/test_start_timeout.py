# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A start that never answers /health fails within the bound its unit declares (SPEC §11).

The serve unit is Type=notify: the helper (serve-unit run) sends READY=1 only once /health answers
and a first liveness probe passed, so systemd's TimeoutStartSec is what ends a start that never
gets there. The role renders it as 120 s + the liveness backoff + serve_health_timeout_s + one
probe (roles/serve/vars/main.yml, __serve_start_timeout_s). This scenario's serve_health_timeout_s
is 400 s (the lab's vLLM on a loaded CI machine needs it), so its bound is about 9 minutes.

How the bound is shortened, and why this way: the role itself is asked, with Ansible, what
TimeoutStartSec it renders for this scenario (checked against the installed unit) and for
serve_health_timeout_s = SHORT_HEALTH_S; that second value goes into a runtime drop-in
(/run/systemd/system/<unit>.d/), removed afterwards. Only TimeoutStartSec changes, to a value the
role really renders, and the unit, its helper and the server are the ones the role installed. A
converge with -e serve_health_timeout_s would rewrite the unit and restart the server (minutes of
CI) for the same one line; a drop-in with a hand-picked number would test a bound the role never
renders. The floor is the role's fixed 120 s for the ExecStartPre steps, so the drill costs that
bound (~2.5 min) plus one load of the server afterwards.

The start is made never to answer by `docker pause` of the server's container as soon as it runs
(a transient unit on the lab Spark watches for it): vLLM is frozen while it loads, before /health.
What is shown: systemd ends the start with result 'timeout', measured from its own start time to
its "timed out" journal line, within (and not before) the declared bound; /health never answered;
the helper counted a failed start; afterwards the server is started by hand and serves again, with
the failed-start count started afresh and the drop-in gone."""
import json
import os
import re
import shlex
import time

from test_unit_semantics import (CONTAINER, CONVERGE, PROJECT, SVC, _converge, clear_dropin, ensure_serving, journal, now, prop, set_dropin,
                                 stop_server, wait_for)

SHORT_HEALTH_S = 10
PAUSER = "sparkops-test-pause-server"
TIMED_OUT = "%s: start operation timed out" % SVC      # systemd's own line when TimeoutStartSec ends a start
RENDER = """\
- name: What TimeoutStartSec the serve role renders (its own formula; nothing is changed)
  hosts: sparks
  gather_facts: false
  tasks:
    - name: The serve role's variables (facts.yml only sets a fact)
      ansible.builtin.include_role:
        name: sparkops.appliance.serve
        tasks_from: facts.yml
        public: true
    - name: As this scenario renders it
      ansible.builtin.debug:
        msg: "start-timeout-as-deployed={{ __serve_start_timeout_s }}"
    - name: With a short health timeout
      ansible.builtin.debug:
        msg: "start-timeout-short={{ __serve_start_timeout_s }}"
      vars:
        serve_health_timeout_s: %d
""" % SHORT_HEALTH_S
# Pauses the first running container of that name it sees (the unit is stopped when it starts).
PAUSE_SCRIPT = ("for i in $(seq 1500); do if [ \"$(docker inspect -f '{{.State.Running}}' %s 2>/dev/null)\" = true ]; "
                "then docker pause %s && echo paused && exit 0; fi; sleep 0.2; done; echo 'no container'; exit 1"
                % (CONTAINER, CONTAINER))


def seconds(span):
    """systemd's time span as `systemctl show` prints it ("2min 25s", "535ms") in seconds."""
    units = {"ms": 0.001, "s": 1, "min": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"([0-9.]+)(ms|s|min|h)", span):
        total += float(number) * units[unit]
    return total


def rendered_bounds(host, tmp_path):
    playbook = tmp_path / "render.yml"
    playbook.write_text(RENDER)
    # the scenario's playbook group_vars (the lab overrides) beside it, as beside converge.yml
    (tmp_path / "group_vars").symlink_to(os.path.join(os.path.dirname(CONVERGE), "group_vars"))
    r = _converge(playbook=playbook)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    deployed = int(re.search(r"start-timeout-as-deployed=([0-9]+)", out).group(1))
    short = int(re.search(r"start-timeout-short=([0-9]+)", out).group(1))
    unit = host.file("/etc/systemd/system/%s" % SVC).content_string
    assert "\nTimeoutStartSec=%d\n" % deployed in unit, "the render differs from the installed unit"
    return deployed, short


def journal_monotonic_s(host, since, needle):
    """The monotonic time (s) of the serve unit's first journal message since `since` holding `needle`."""
    out = host.check_output("journalctl -u %s --since '%s' -o json --output-fields=MESSAGE --no-pager" % (SVC, since))
    for line in out.splitlines():
        entry = json.loads(line)
        if needle in str(entry.get("MESSAGE", "")):
            return int(entry["__MONOTONIC_TIMESTAMP"]) / 1e6
    return None


def test_a_start_that_never_answers_health_fails_within_the_declared_bound(host, tmp_path):
    ensure_serving(host)
    deployed, short = rendered_bounds(host, tmp_path)
    assert short == deployed - (400 - SHORT_HEALTH_S), (deployed, short)   # only the health timeout differs
    stop_server(host)
    set_dropin(host, SVC, "[Service]\nTimeoutStartSec=%d\n" % short)
    try:
        assert seconds(prop(host, SVC, "TimeoutStartUSec")) == short
        host.run("systemctl stop %s; systemctl reset-failed %s" % (PAUSER, PAUSER))
        host.run_expect([0], "systemd-run --unit %s --collect /bin/sh -c %s" % (PAUSER, shlex.quote(PAUSE_SCRIPT)))
        since = now(host)
        host.run_expect([0], "systemctl start --no-block %s" % SVC)
        wait_for("the container to be paused", lambda: host.run("docker inspect -f '{{.State.Paused}}' %s" % CONTAINER)
                 .stdout.strip() == "true", 180, step=2)
        began = int(prop(host, SVC, "InactiveExitTimestampMonotonic")) / 1e6

        def ended():
            if journal_monotonic_s(host, since, TIMED_OUT) is not None:
                return True
            # READY=1 without /health would make it active: the bound would no longer apply
            assert prop(host, SVC, "ActiveState") != "active", "the unit reported ready, /health never answered"
            return False

        wait_for("systemd to end the start", ended, short + 120, step=5)
        timed_out = journal_monotonic_s(host, since, TIMED_OUT)
        took = round(timed_out - began, 1)
        print("never-healthy start: ended by systemd after %.1f s (declared TimeoutStartSec=%d s)" % (took, short))
        os.makedirs(os.path.join(PROJECT, "build"), exist_ok=True)
        with open(os.path.join(PROJECT, "build", "start-timeout-drill.json"), "w", encoding="utf-8") as f:
            json.dump({"start_to_timeout_s": took, "timeout_start_s": short, "at": time.time()}, f)
        # the frozen server ends at once (the stop would otherwise wait for TimeoutStopSec)
        host.run("docker rm -f %s" % CONTAINER)
        host.run_expect([0], "systemctl stop %s" % SVC)
        # systemd's own word on the start's result (the Result property is reset when Restart=
        # begins a new start, which may come before the stop above on a loaded machine)
        log = journal(host, SVC, since)
        # systemd's timer: not before the bound, and not long after it (its event loop's accuracy)
        assert short - 1 <= took <= short + 5, (took, short, log[-3000:])
        assert "answers: this start succeeded" not in log, "the paused server answered /health"
        assert "%s: Failed with result 'timeout'" % SVC in log, log[-3000:]
        assert "failed start 1 of at most 3 (result timeout" in log, log[-3000:]
        assert "paused" in host.check_output("journalctl -u %s --since '%s' -o cat --no-pager" % (PAUSER, since))
    finally:
        host.run("systemctl stop %s; docker rm -f %s" % (PAUSER, CONTAINER))
        host.run("systemctl stop %s" % SVC)
        clear_dropin(host, SVC)
        host.run("systemctl reset-failed %s" % SVC)
    # back as the scenario was: the role's own bound, a start by hand (a fresh failed-start count), serving
    assert seconds(prop(host, SVC, "TimeoutStartUSec")) == deployed
    since = now(host)
    ensure_serving(host)
    assert "the failed-start count (1) starts afresh" in journal(host, SVC, since)
    assert prop(host, SVC, "ActiveState") == "active"
