# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint role's wait for its async transfer (tasks/wait.yml): one async_status task with
until/retries bounded by checkpoint_fetch_timeout_s, no include that includes itself, and a clear
message when the bound runs out while the job still runs. Runs on the local host; the async job is
a plain `sleep` standing in for the transfer."""
import os
import subprocess
import sys

import yaml

from ansible_json import stdout_json

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
WAIT = os.path.join(ROOT, "roles", "checkpoint", "tasks", "wait.yml")


def run(tmp_path, job_s, timeout_s):
    playbook = tmp_path / "pb.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_progress_file": str(tmp_path / "progress.json"),
                 "checkpoint_progress_interval_s": 1, "checkpoint_fetch_timeout_s": timeout_s},
        "tasks": [
            {"name": "a stand-in transfer", "ansible.builtin.command": "sleep %d" % job_s,
             "async": 120, "poll": 0, "register": "__checkpoint_fetch_job"},
            {"name": "the role's wait", "ansible.builtin.include_role": {"name": "sparkops.appliance.checkpoint", "tasks_from": "wait"}},
            {"name": "result", "ansible.builtin.debug": {"var": "__checkpoint_fetch_result.finished"}},
        ]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", str(playbook)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    tasks = {}
    for task in stdout_json(proc)["plays"][0]["tasks"]:
        tasks[task["task"]["name"].split(" : ")[-1]] = task["hosts"]["localhost"]
    return proc, tasks


def test_the_wait_is_one_bounded_async_status_task_not_a_recursive_include():
    tasks = yaml.safe_load(open(WAIT))
    assert not [t for t in tasks if "ansible.builtin.include_tasks" in t or "ansible.builtin.import_tasks" in t]
    polls = [t for t in tasks if "ansible.builtin.async_status" in t]
    assert len(polls) == 1 and polls[0]["until"] and "checkpoint_fetch_timeout_s" in polls[0]["retries"]


def test_waits_for_a_job_that_outlasts_several_polls(tmp_path):
    # 12 s against a 1 s poll interval: at least 3 polls even where each poll takes 3 s more on a
    # busy machine (a 4 s job ended after 2 polls under `pytest -n 2` on 2 cores).
    proc, tasks = run(tmp_path, job_s=12, timeout_s=60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    wait = tasks["Checkpoint | wait for the transfer"]
    assert wait["finished"] == 1 and wait["attempts"] >= 3, wait
    assert tasks["Checkpoint | the transfer did not finish in time"].get("skipped")


def test_a_job_still_running_at_the_bound_fails_saying_so_and_how_to_resume(tmp_path):
    proc, tasks = run(tmp_path, job_s=30, timeout_s=2)
    assert proc.returncode != 0
    msg = tasks["Checkpoint | the transfer did not finish in time"]["msg"]
    assert "checkpoint_fetch_timeout_s (2 s)" in msg and "may still be running" in msg and "Run the play again" in msg, msg
    assert tasks["Checkpoint | wait for the transfer"]["attempts"] == 4  # ceil(2 / 1) + 2 polls
