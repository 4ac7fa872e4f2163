"""A re-converge is fast: the image's vLLM parser runs only when the image or the command line
changed (the memo roles/serve/tasks/main.yml reads back, check_args.yml writes), and modules reach the lab Spark pipelined.

Runs before test_production.py (file order) and leaves the server running with the converged line.
A changed flag that is then applied, and the no-op run after it, are test_production.py's
test_y_... (just before the drill that stops the server): no run is spent restoring the line."""
import json
import os
import re
import subprocess

import testinfra.utils.ansible_runner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("all")

UNIT = "sparkops-serve"                                   # spark_serve_unit_name's default (roles/common)
MEMO = "/run/sparkops/serve/%s.service.args-checked" % UNIT   # serve_state_dir's default
PARSER_TASK = "Validate the vLLM command line with the image's own parser"
PARSER_INCLUDE = "Check the command line with the image's vLLM, and remember it accepted it"   # its file


def _run(cmd):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(cmd, env=env, cwd=PROJECT, capture_output=True, text=True, timeout=900, check=False)


def _site(*extra):
    return _run(["ansible-playbook", "-i", INVENTORY, os.path.join(PROJECT, "playbooks", "site.yml")] + list(extra))


def _parser_result(out):
    """'ok' (the parser ran), 'skipping' (the include of its tasks was skipped: the memo held this
    image and line), or None (neither came)."""
    ran = _task_status(out, PARSER_TASK)
    return ran if ran is not None else _task_status(out, PARSER_INCLUDE)


def _task_status(out, task):
    """What a task (its name, without the role) reported on the one host: 'skipping', 'ok',
    'changed', 'failed' or 'fatal'; None when the task never came."""
    block = re.search(r"^TASK \[[^\]]*%s\] \**\n(.*?)(?=^TASK |^PLAY |^RUNNING HANDLER |\Z)" % re.escape(task),
                      out, re.M | re.S)
    if not block:
        return None
    status = re.findall(r"^(skipping|ok|changed|failed|fatal): ", block.group(1), re.M)
    assert len(status) == 1, block.group(0)
    return status[0]


def _memo(host):
    memo = host.file(MEMO)
    assert memo.exists, MEMO
    return memo.content_string, memo.mtime, memo.inode


def _invocation(host):
    return host.check_output("systemctl show -p InvocationID --value %s" % UNIT)


def test_converge_remembered_the_accepted_line(host):
    content, _mtime, _inode = _memo(host)
    memo = json.loads(content)
    image_id = host.check_output("docker inspect -f '{{.Image}}' sparkops-vllm-%s" % host.backend.get_hostname())
    assert memo["image_id"] == image_id
    unit = host.file("/etc/systemd/system/%s.service" % UNIT).content_string
    assert all(arg in unit for arg in memo["args"])   # the line the unit runs
    assert re.fullmatch(r"[0-9a-f]{64}", memo["key"])


def test_check_mode_with_a_changed_flag_runs_the_parser_and_writes_nothing(host):
    before = _memo(host)
    result = _site("--check", "-e", '{"serve_max_num_seqs": 7}')
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert _parser_result(out) == "ok", out[-4000:]     # it ran, in check mode too
    assert _memo(host) == before


def test_a_rejected_line_never_becomes_the_memo(host):
    before = _memo(host)
    invocation = _invocation(host)
    result = _site("-e", '{"serve_extra_args": ["--enforce-eager", "--distributed-executor-backend", "uni", "--no-such-flag"]}')
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert _parser_result(out) == "ok", out[-4000:]
    assert "rejects the command line" in out and "--no-such-flag" in out, out[-4000:]
    assert _memo(host) == before
    assert _invocation(host) == invocation   # the running service is untouched


def test_modules_reach_the_lab_spark_pipelined_with_become():
    # community.docker.docker follows the general [connection] pipelining (ansible.cfg): no module
    # file is put on the host; become (sudo, the example inventory's) works without a tty.
    result = _run(["ansible", "-i", INVENTORY, "all", "-m", "ansible.builtin.command", "-a", "id -u", "-vvv"])
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert re.search(r"\| CHANGED \| rc=0 >>\n0$", out, re.M), out[-4000:]   # root, through sudo
    assert "ESTABLISH DOCKER CONNECTION" in out
    assert not re.search(r"^<[^>]*> PUT ", out, re.M), out[-4000:]
