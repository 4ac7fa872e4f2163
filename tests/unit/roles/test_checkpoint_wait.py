# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint role's wait for its async transfer (tasks/wait.yml): one async_status task with
until/retries bounded by checkpoint_fetch_timeout_s, no include that includes itself, and a clear
message when the bound runs out while the job still runs. Runs on the local host; the async job is
a plain `sleep` standing in for the transfer.

Both cases run in ONE ansible-playbook start: each is a host of a batch inventory (this machine,
local connection) with its own job length, bound, checkpoint dir and progress file as host vars
(the role's vars/ names none of them, which would outrank them; the play sets none)."""
import os

import pytest
import yaml

from harness import ROOT, batch_inventory, host_results, play_json

WAIT = os.path.join(ROOT, "roles", "checkpoint", "tasks", "wait.yml")

# case host: (job_s, timeout_s)
CASES = {
    # 12 s against a 1 s poll interval: at least 3 polls even where each poll takes 3 s more on a
    # busy machine (a 4 s job ended after 2 polls under `pytest -n 2` on 2 cores).
    "outlasts-polls": (12, 60),
    "still-running": (30, 2),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ckpt-wait")
    hosts = {}
    for host, (job_s, timeout_s) in CASES.items():
        hosts[host] = {"job_s": job_s, "checkpoint_dir": str(tmp_path / host / "ckpt"),
                       "checkpoint_progress_file": str(tmp_path / host / "progress.json"),
                       "checkpoint_progress_interval_s": 1, "checkpoint_fetch_timeout_s": timeout_s}
    playbook = tmp_path / "pb.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "sparks", "gather_facts": False,
        "tasks": [
            {"name": "a stand-in transfer", "ansible.builtin.command": "sleep {{ job_s }}",
             "async": 120, "poll": 0, "register": "__checkpoint_fetch_job"},
            {"name": "the role's wait", "ansible.builtin.include_role": {"name": "sparkops.appliance.checkpoint", "tasks_from": "wait"}},
            {"name": "result", "ansible.builtin.debug": {"var": "__checkpoint_fetch_result.finished"}},
        ]}]))
    doc = play_json(playbook, inventory=batch_inventory(tmp_path, hosts))
    out = {}
    for host in CASES:
        tasks = {}
        for _play, name, result in host_results(doc, host):
            tasks[name.split(" : ")[-1]] = result
        stats = doc["stats"][host]
        out[host] = (stats, tasks)
    return out


def test_the_wait_is_one_bounded_async_status_task_not_a_recursive_include():
    tasks = yaml.safe_load(open(WAIT))
    assert not [t for t in tasks if "ansible.builtin.include_tasks" in t or "ansible.builtin.import_tasks" in t]
    polls = [t for t in tasks if "ansible.builtin.async_status" in t]
    assert len(polls) == 1 and polls[0]["until"] and "checkpoint_fetch_timeout_s" in polls[0]["retries"]


def test_waits_for_a_job_that_outlasts_several_polls(runs):
    stats, tasks = runs["outlasts-polls"]
    # the host's own run succeeded (what returncode 0 said when it ran alone)
    assert stats["failures"] == 0 and stats["unreachable"] == 0 and "result" in tasks, (stats, tasks)
    wait = tasks["Checkpoint | wait for the transfer"]
    assert wait["finished"] == 1 and wait["attempts"] >= 3, wait
    assert tasks["Checkpoint | the transfer did not finish in time"].get("skipped")


def test_a_job_still_running_at_the_bound_fails_saying_so_and_how_to_resume(runs):
    stats, tasks = runs["still-running"]
    # the host's own run failed (what a non-zero returncode said when it ran alone)
    assert stats["failures"] != 0 and tasks["Checkpoint | the transfer did not finish in time"].get("failed")
    msg = tasks["Checkpoint | the transfer did not finish in time"]["msg"]
    assert "checkpoint_fetch_timeout_s (2 s)" in msg and "may still be running" in msg and "Run the play again" in msg, msg
    assert tasks["Checkpoint | wait for the transfer"]["attempts"] == 4  # ceil(2 / 1) + 2 polls
