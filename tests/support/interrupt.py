"""A playbook run killed half-way, for the scenario tests of an interrupted rollout.

The run is started in its own session and, the moment a condition on the host holds, its whole
process group is killed (SIGKILL), as a lost controller or a Ctrl-C would leave it: no handler, no
rescue, no always of the playbook runs after that.
"""
import os
import signal
import subprocess
import time


def run_and_kill_when(argv, log_path, condition, env, cwd, timeout=1200, poll=0.2):
    """Run ``argv`` (its output to ``log_path``) and kill its process group as soon as ``condition()``
    is true, polled every ``poll`` s. Returns ``(killed, returncode, output)``; ``killed`` is false
    where the run ended, or ``timeout`` s passed (then it is killed too), before the condition held."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        deadline = time.monotonic() + timeout
        killed = False
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if condition():
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = True
                    break
                time.sleep(poll)
        finally:
            if proc.poll() is None and not killed:
                os.killpg(proc.pid, signal.SIGKILL)   # timed out, or the condition raised
            proc.wait(timeout=60)
    with open(log_path) as handle:
        return killed, proc.returncode, handle.read()
