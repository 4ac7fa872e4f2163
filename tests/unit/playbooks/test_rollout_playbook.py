"""playbooks/rollout.yml refuses a bad rollout_* value in its first play, before anything changes: a
wrong type (roles/rollout/meta/argument_specs.yml, through the preflight's check of every role's
options) and a value out of range (roles/rollout/meta/checks.yml, read by the same check; the drain
hook's file by roles/rollout/tasks/validate.yml). No fact is gathered, no host
is touched, the batch play never starts. One ansible-playbook start per failing task (the first play
stops every host at the first failed task: any_errors_fatal): the types and the bounds fail the same
task (the preflight's check), the hook a later one; each host of a start a case on this machine."""
import os

import pytest

from harness import ROOT, batch_inventory, host_results, play_json

ROLLOUT = os.path.join(ROOT, "playbooks", "rollout.yml")
FIRST_PLAY = "Rollout - check every host's inputs and plan, then order the hosts into batches"

# kind: {host: (its values, what the refusal says)}
CASES = {
    "types": {
        "tolerance-ten": ({"rollout_kv_tolerance_pct": "ten"},
                          'rollout_kv_tolerance_pct = "ten": a string, not a number'),
        "drain-300s": ({"rollout_drain_timeout_s": "300s"},
                       'rollout_drain_timeout_s = "300s": a string, not a whole number'),
    },
    "bounds": {
        "tolerance-negative": ({"rollout_kv_tolerance_pct": -5}, "rollout_kv_tolerance_pct = -5: below 0"),
        "poll-above-timeout": ({"rollout_drain_poll_s": 400},
                               "rollout_drain_poll_s = 400: not at most rollout_drain_timeout_s (300)"),
        "gate-prompt-empty": ({"rollout_gate_prompt": ""}, 'rollout_gate_prompt = "": empty'),
        "health-timeout-zero": ({"rollout_health_timeout_s": 0}, "rollout_health_timeout_s = 0: below 1"),
    },
    # the hook's file is looked for on the controller, by a task after the values' check
    "hook": {
        "hook-missing": ({"rollout_drain_hook": "/nonexistent/sparkops-hook.yml"},
                         'rollout_drain_hook = "/nonexistent/sparkops-hook.yml": not a file on the controller'),
    },
}


# the kinds whose hosts share a start: they fail in the same task, so none stops another before its own refusal
STARTS = [("types", "bounds"), ("hook",)]


@pytest.fixture(name="runs", scope="module")
def fixture_runs(tmp_path_factory):
    """{kind: the JSON callback's document of rollout.yml on the hosts of that kind's start}."""
    assert sorted(kind for kinds in STARTS for kind in kinds) == sorted(CASES)
    runs = {}
    for kinds in STARTS:
        tmp_path = tmp_path_factory.mktemp("-".join(kinds))
        hosts = {name: values for kind in kinds for name, (values, _msg) in CASES[kind].items()}
        doc = play_json(ROLLOUT, inventory=batch_inventory(tmp_path, hosts), connection=None)
        runs.update((kind, doc) for kind in kinds)
    return runs


@pytest.mark.parametrize("kind, host", [(kind, host) for kind, hosts in CASES.items() for host in hosts])
def test_a_bad_rollout_value_is_refused_in_the_first_play_before_any_change(runs, kind, host):
    doc = runs[kind]
    _values, message = CASES[kind][host]
    results = host_results(doc, host)
    failed = [(task, r.get("msg", "")) for _play, task, r in results if r.get("failed")]
    assert len(failed) == 1 and message in failed[0][1], (failed, results)
    # nothing after the refusal: no facts gathered, no other role's checks, no batch play
    assert {play for play, _task, _r in results} == {FIRST_PLAY}
    assert "Gather facts" not in [task for _play, task, _r in results]
    assert not any(r.get("changed") for _play, _task, r in results)
    assert doc["stats"][host]["changed"] == 0 and doc["stats"][host]["failures"] == 1
