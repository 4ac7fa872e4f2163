"""The one harness the unit tests use to run the collection's code: a module in this process (as
community.docker tests its modules), or Ansible itself in a subprocess where the wiring is the thing
tested (a role's tasks, a playbook, a callback).

- ROOT: the repository root (the collection root).
- run_module(module, args, check=False, diff=False): the module's main() in this process under
  ansible.module_utils.testing.patch_module_args; returns its result dict (failed results too).
- ansible_env(**extra): the environment for an ansible / ansible-playbook subprocess (the repo's
  ansible.cfg, no colour, the JSON stdout callback unless told otherwise).
- run_adhoc(module, args, check=, diff=, path_prefix=): one call of a module through Ansible itself
  (`ansible localhost -m ... -a JSON`, local connection, this Python, the JSON callback): the
  localhost result, for the one test per module that checks the wiring.
- run_playbook(playbook, inventory=..., extra_vars=..., ...): ansible-playbook in a subprocess;
  returns the CompletedProcess. play_json(...) the same, parsed from the JSON callback.
- host_results(doc, host): every task result of one host in a JSON-callback document, in order.
- trusted(value): value with every string in it marked trusted for templating (ansible-core 2.19
  templates only trusted strings, as it trusts a role's defaults and vars files), for a test that
  templates a role's files with Ansible's own Templar.
- batch_inventory(tmp_path, hosts): an inventory file where every host is this machine (local
  connection, this Python), each with its own variables: one ansible-playbook start checks many
  values at once (each host a case), instead of one start per value.
"""
import contextlib
import io
import json
import os
import subprocess
import sys

from ansible.module_utils.testing import patch_module_args

from ansible_json import stdout_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_module(module, args, check=False, diff=False):
    """module.main() in this process with args; the result dict it printed (exit_json or fail_json)."""
    args = dict(args)
    if check:
        args["_ansible_check_mode"] = True
    if diff:
        args["_ansible_diff"] = True
    out = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(out):
        try:
            module.main()
        except SystemExit:
            pass
    text = out.getvalue()
    try:
        return json.loads(text)
    except ValueError:
        raise AssertionError("%s printed no JSON result: %r" % (module.__name__, text[-3000:]))


def ansible_env(stdout_callback="ansible.builtin.json", **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="0")
    if stdout_callback:
        env["ANSIBLE_STDOUT_CALLBACK"] = stdout_callback
        env["ANSIBLE_LOAD_CALLBACK_PLUGINS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_adhoc(module, args, check=False, diff=False, path_prefix=None, timeout=120):
    """The localhost result of one ad-hoc call of sparkops.appliance.<module> (or a full name)."""
    name = module if "." in module else "sparkops.appliance." + module
    extra = {"PATH": str(path_prefix) + os.pathsep + os.environ["PATH"]} if path_prefix else {}
    cmd = ["ansible", "localhost", "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
           "-m", name, "-a", json.dumps(args)]
    cmd += ["--check"] if check else []
    cmd += ["--diff"] if diff else []
    proc = subprocess.run(cmd, env=ansible_env(**extra), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          check=False)
    return stdout_json(proc)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def run_playbook(playbook, inventory="localhost,", extra_vars=None, args=(), env=None, timeout=300, connection="local"):
    """ansible-playbook in a subprocess from the repo root; extra_vars go in as one JSON -e."""
    cmd = ["ansible-playbook", "-i", str(inventory), str(playbook)]
    if connection:
        cmd += ["-c", connection]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    cmd += list(args)
    return subprocess.run(cmd, env=env or ansible_env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def play_json(playbook, **kwargs):
    """run_playbook under the JSON callback, parsed (the test fails with stderr when it is not JSON)."""
    kwargs.setdefault("env", ansible_env())
    return stdout_json(run_playbook(playbook, **kwargs))


def walk_tasks(tasks):
    """Every task of a task list, those inside block, rescue and always too, in file order."""
    for task in tasks or []:
        yield task
        for part in ("block", "rescue", "always"):
            yield from walk_tasks(task.get(part))


def host_results(doc, host):
    """[(play name, task name, result)] of one host in a JSON-callback document, in run order."""
    out = []
    for play in doc.get("plays", []):
        for task in play.get("tasks", []):
            if host in task.get("hosts", {}):
                out.append((play["play"]["name"], task["task"]["name"], task["hosts"][host]))
    return out


def host_outcomes(doc, hosts):
    """{host: (whether it failed or was unreachable, {task name without its role prefix: result})}."""
    out = {}
    for host in hosts:
        stats = doc["stats"][host]
        out[host] = (stats["failures"] + stats["unreachable"] > 0,
                     {t.split(" : ", 1)[-1]: r for _p, t, r in host_results(doc, host)})
    return out


def host_failure(doc, host):
    """The first failed (or unreachable) result of a host, or None."""
    for _play, _task, result in host_results(doc, host):
        if result.get("failed") or result.get("unreachable"):
            return result
    return None


def batch_inventory(tmp_path, hosts, group="sparks", name="batch-inventory.json", group_vars=None):
    """An inventory where every host runs on this machine with its own variables (one case each)."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    members = {h: dict(local, **(v or {})) for h, v in hosts.items()}
    inventory = {"all": {"children": {group: {"hosts": members, "vars": dict(group_vars or {})}}}}
    path = os.path.join(str(tmp_path), name)
    with open(path, "w") as handle:
        json.dump(inventory, handle)
    return path


VALIDATE_PLAY = """
- name: Validate
  hosts: validate
  gather_facts: false
  tasks:
    - name: Validate
      ansible.builtin.include_role:
        name: sparkops.appliance.%s
        tasks_from: validate
"""


def validate_batch(tmp_path, role, cases, name="validate.json"):
    """A role's validate entry point (as site.yml's first play runs it) on one local host per case
    ({host: its variables}), in one ansible-playbook start: the JSON callback's document."""
    playbook = os.path.join(str(tmp_path), "validate-%s.yml" % role)
    with open(playbook, "w") as handle:
        handle.write(VALIDATE_PLAY % role)
    return play_json(playbook, inventory=batch_inventory(tmp_path, cases, group="validate", name=name))


def trusted(value):
    """value with every string in it (lists and mappings walked) marked trusted for templating."""
    from ansible.template import trust_as_template
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    return value
