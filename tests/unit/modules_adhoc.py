"""For the module tests (group "modules"): one module call through Ansible itself, as
`ansible localhost -m sparkops.appliance.NAME -a JSON` (local connection, this Python) under the
JSON stdout callback, for the one test per module that checks the wiring (the module found by its
collection name, its module_utils shipped with it, the result as Ansible returns it). Everything
else calls the module in this process with harness.run_module."""
import json
import os
import subprocess
import sys

from ansible_json import stdout_json
from harness import ROOT, ansible_env


def adhoc(module, args, check=False, diff=False, path_prefix=None, timeout=120):
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
