"""The JSON document that a finished `ansible` / `ansible-playbook` run printed on stdout (the
ansible.builtin.json stdout callback), for the unit tests that read a run's results from it.

When the run printed nothing, or something that is not JSON, the test fails with what explains
it (the command, its return code, the start of stdout, the end of stderr) instead of a bare
JSONDecodeError that hides stderr."""
import json

STDOUT_HEAD = 2000
STDERR_TAIL = 3000


def stdout_json(proc):
    """proc.stdout parsed as JSON; proc is a finished subprocess.CompletedProcess (text or bytes)."""
    out = proc.stdout or ""
    try:
        return json.loads(out)
    except ValueError as e:  # json.JSONDecodeError, or bytes that are not UTF-8
        problem = "stdout is empty" if not out.strip() else "stdout is not JSON (%s)" % e
    command = proc.args if isinstance(proc.args, (str, bytes)) else " ".join(str(a) for a in proc.args)
    raise AssertionError("%s\nprinted no JSON: %s, rc %s\n--- stdout, the first %d characters:\n%s\n--- stderr, the last %d characters:\n%s" % (
        command, problem, proc.returncode, STDOUT_HEAD, _text(out)[:STDOUT_HEAD], STDERR_TAIL, _text(proc.stderr or "")[-STDERR_TAIL:]))


def _text(data):
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data
