"""Every task of the serve role whose arguments carry the container environment (the API key, and
serve_env, where a user may keep a secret of their own) or the spark_serve fact (the key) hides
its output and diff, also when serve_api_key is empty: a secret in serve_env showed in --diff."""
import glob
import os
import re

import yaml

import harness

ROLE = os.path.join(harness.ROOT, "roles", "serve")
# the variables whose value holds the environment file's text or the key
CARRIERS = ("serve_api_key", "serve_env", "__serve_unit_files", "__serve_all_files", "__serve_export", "spark_serve")
NOT_ARGUMENTS = ("name", "when", "loop_control", "no_log", "tags", "register", "changed_when", "failed_when", "check_mode")


def carries_a_secret(task):
    text = yaml.safe_dump({k: v for k, v in task.items() if k not in NOT_ARGUMENTS})
    return any(re.search(r"\{\{[^}]*\b%s\b" % name, text) for name in CARRIERS)


def test_every_task_that_carries_the_environment_or_the_key_has_no_log():
    seen = []
    for path in sorted(glob.glob(os.path.join(ROLE, "tasks", "*.yml"))):
        for task in harness.walk_tasks(yaml.safe_load(open(path))):
            if "block" in task or "ansible.builtin.include_tasks" in task or not carries_a_secret(task):
                continue
            seen.append("%s: %s" % (os.path.basename(path), task.get("name")))
            assert task.get("no_log") == "{{ __serve_no_log }}", "%s lacks no_log" % seen[-1]
    # the files call (check mode and apply), spark_serve's set_facts, the rollback report
    assert len(seen) >= 5, seen


def test_no_log_holds_for_a_secret_in_serve_env_without_an_api_key():
    with open(os.path.join(ROLE, "vars", "main.yml")) as handle:
        expression = yaml.safe_load(handle)["__serve_no_log"]
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    for variables, hidden in (({"serve_api_key": "", "serve_env": {"MY_TOKEN": "s"}}, True),
                              ({"serve_api_key": "k", "serve_env": {}}, True),
                              ({"serve_api_key": "", "serve_env": {}}, False)):
        result = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))
        assert str(result).lower() == str(hidden).lower(), (variables, result)
