"""The ple role through ansible-playbook: its two paths suffice, and every bad ple_* value is
refused on the controller, before anything connects to the host, with a message that names the
variable, the value and the fix. The bad values are checked in this process (input_problems, what
the role's check calls) and a dozen of them, of every kind, also through the role in the sweep's play."""
import json
import os
import sys
import textwrap

import pytest

from ansible_json import stdout_json
from harness import ROOT, ansible_env, host_results, run_playbook

sys.path.insert(0, os.path.join(ROOT, "tests", "unit", "plugins"))

from ple_checkpoints import PLE, PLE_AUDIO, build_checkpoint  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.sparkops.appliance.plugins.plugin_utils._role_inputs import (  # noqa: E402  pylint: disable=wrong-import-position
    input_problems,
    load_role_checks,
    load_role_options,
)


def playbook(tmp_path, inventory, play, extra=()):
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(textwrap.dedent(play))
    return run_playbook(tmp_path / "play.yml", inventory=tmp_path / "inventory.json", args=extra, connection=None,
                        env=ansible_env())


def test_the_two_ple_paths_suffice_without_spark_model_vars(sweep):
    """No spark_model_dir, no spark_model_name: ple_checkpoint_dir and ple_pack_file are enough.
    The host "spark" of the sweep's run (its last play: this machine, the role's main entry point)."""
    spark = sweep["spark"]
    pack = spark["pack"]
    # the host's own run succeeded (what returncode 0 said when it ran alone)
    assert spark["stats"]["failures"] == 0 and spark["stats"]["unreachable"] == 0, spark["results"][-3:]
    # every task name and result of this host (what the default callback printed for it)
    assert "spark_model_dir" not in json.dumps(spark["results"])
    facts = json.loads(spark["facts"].read_text())
    assert facts["file"] == str(pack) and pack.is_file()
    tables = json.loads(pack.read_bytes()[24:24 + int.from_bytes(pack.read_bytes()[16:24], "little")])["tables"]
    assert [t["name"] for t in tables] == [PLE, PLE_AUDIO]
    assert int(facts["bytes"]) == sum(t["nbytes"] for t in tables)


GOOD = {"ple_checkpoint_dir": "/srv/sparkops/models/m", "ple_pack_file": "/srv/sparkops/models/m.ple"}

# (case id, variables, the variable the message must name, its value, a piece of the fix)
BAD = [
    ("ckpt-relative", {"ple_checkpoint_dir": "models/m"}, "ple_checkpoint_dir", "models/m", "starts with /"),
    ("pack-relative", {"ple_pack_file": "m.ple"}, "ple_pack_file", "m.ple", "starts with /"),
    ("ckpt-dotdot", {"ple_checkpoint_dir": "/srv/sparkops/../etc"}, "ple_checkpoint_dir", "/srv/sparkops/../etc",
     'no ".."'),
    ("pack-dotdot", {"ple_pack_file": "/srv/sparkops/models/../../etc/m.ple"}, "ple_pack_file",
     "/srv/sparkops/models/../../etc/m.ple", 'no ".."'),
    ("pack-dotdot-end", {"ple_pack_file": "/srv/sparkops/.."}, "ple_pack_file", "/srv/sparkops/..", 'no ".."'),
    ("ckpt-newline", {"ple_checkpoint_dir": "/srv/sparkops/models/m\nx"}, "ple_checkpoint_dir",
     "/srv/sparkops/models/m\nx", "holds a newline"),
    ("pack-trailing-newline", {"ple_pack_file": "/srv/sparkops/models/m.ple\n"}, "ple_pack_file",
     "/srv/sparkops/models/m.ple\n", "holds a newline"),
    ("ckpt-tab", {"ple_checkpoint_dir": "/srv/sparkops/models/m\t"}, "ple_checkpoint_dir",
     "/srv/sparkops/models/m\t", "holds a tab"),
    ("ckpt-list", {"ple_checkpoint_dir": ["/srv/sparkops/models/m"]}, "ple_checkpoint_dir",
     ["/srv/sparkops/models/m"], "a list, not a path"),
    ("ckpt-number", {"ple_checkpoint_dir": 17}, "ple_checkpoint_dir", 17, "a whole number, not a path"),
    ("pack-is-dir", {"ple_pack_file": "/srv/sparkops/models/"}, "ple_pack_file", "/srv/sparkops/models/",
     "trailing /"),
    ("pack-is-ckpt", {"ple_pack_file": "/srv/sparkops//models/m"}, "ple_pack_file", "/srv/sparkops//models/m",
     "not a normalised path"),
    ("pack-is-a-shard", {"ple_pack_file": "/srv/sparkops/models/m/ple.safetensors"}, "ple_pack_file",
     "/srv/sparkops/models/m/ple.safetensors", "read as a shard"),
    # the pack in place of the checkpoint, or / itself: each refused with its own reason
    ("pack-is-ckpt-plain", {"ple_pack_file": "/srv/sparkops/models/m"}, "ple_pack_file", "/srv/sparkops/models/m",
     "the same as ple_checkpoint_dir"),
    ("pack-is-root", {"ple_pack_file": "/"}, "ple_pack_file", "/", "not / itself"),
    ("ckpt-empty", {"ple_checkpoint_dir": ""}, "ple_checkpoint_dir", "", "empty"),
    ("model-name-dotdot", {"ple_checkpoint_dir": None, "ple_pack_file": None, "spark_model_dir": "/srv/m",
                           "spark_model_name": "../x"}, "ple_checkpoint_dir", "/srv/m/../x", "not a normalised path"),
    ("align-5000", {"ple_alignment": 5000}, "ple_alignment", 5000, "power of two"),
    ("align-2048", {"ple_alignment": 2048}, "ple_alignment", 2048, "power of two"),
    ("align-0", {"ple_alignment": 0}, "ple_alignment", 0, "power of two"),
    ("align-negative", {"ple_alignment": -4096}, "ple_alignment", -4096, "power of two"),
    ("align-2GiB", {"ple_alignment": 2 ** 31}, "ple_alignment", 2 ** 31, "power of two"),
    ("align-float", {"ple_alignment": 4096.5}, "ple_alignment", 4096.5, "not a whole number"),
    ("align-word", {"ple_alignment": "abc"}, "ple_alignment", "abc", "not a whole number"),
    ("align-newline", {"ple_alignment": "4096\n"}, "ple_alignment", "4096\n", "holds a newline"),
    ("align-bool", {"ple_alignment": True}, "ple_alignment", True, "not a whole number"),
    ("patterns-string", {"ple_name_patterns": "embed_tokens_per_layer"}, "ple_name_patterns",
     "embed_tokens_per_layer", "write it as a YAML list"),
    ("patterns-empty", {"ple_name_patterns": []}, "ple_name_patterns", [], "non-empty YAML list"),
    ("patterns-number", {"ple_name_patterns": [1]}, "ple_name_patterns", [1], "not a string"),
    ("patterns-dict", {"ple_name_patterns": {"a": "b"}}, "ple_name_patterns", {"a": "b"}, "not a list"),
    ("patterns-bad-regex", {"ple_name_patterns": ["ok", "embed[("]}, "ple_name_patterns", ["ok", "embed[("],
     "not a Python regular expression"),
    ("patterns-newline", {"ple_name_patterns": ["embed\nx"]}, "ple_name_patterns", ["embed\nx"], "holds a newline"),
    ("patterns-empty-string", {"ple_name_patterns": [""]}, "ple_name_patterns", [""], "non-empty"),
    ("verify-string-false", {"ple_verify": "false"}, "ple_verify", "false", "without quotes"),
    ("verify-string-yes", {"ple_verify": "yes"}, "ple_verify", "yes", "without quotes"),
    ("verify-word", {"ple_verify": "maybe"}, "ple_verify", "maybe", "without quotes"),
    ("verify-number", {"ple_verify": 1}, "ple_verify", 1, "without quotes"),
    ("enabled-string-false", {"ple_enabled": "false"}, "ple_enabled", "false", "without quotes"),
    ("enabled-string-no", {"ple_enabled": "no"}, "ple_enabled", "no", "without quotes"),
    ("mode-number", {"ple_file_mode": 420}, "ple_file_mode", 420, "quote it"),
    ("mode-symbolic", {"ple_file_mode": "rw-r--r--"}, "ple_file_mode", "rw-r--r--", "quoted string"),
    ("mode-newline", {"ple_file_mode": "0644\n"}, "ple_file_mode", "0644\n", "holds a newline"),
]

# The cases the sweep's play runs through the role (validate.yml's one check, the input_problems
# lookup, as a play calls it): one or more of each kind, and the one whose value the lookup templates
# from the role's defaults (model-name-dotdot). Every case but that one is also checked in this
# process: input_problems with the ple role's options and checks, the host's values as given.
IN_PLAY = {"ckpt-relative", "pack-relative", "ckpt-dotdot", "ckpt-list", "pack-is-ckpt-plain", "model-name-dotdot",
           "align-5000", "patterns-bad-regex", "verify-string-false", "mode-number", "mode-symbolic", "mode-newline"}
TEMPLATED = {"model-name-dotdot"}

# Valid: refused by none of the checks (ple_enabled false skips the checks beyond type, as site.yml skips the role)
ACCEPTED = [
    ("defaults-from-spark-model", {"ple_checkpoint_dir": None, "ple_pack_file": None,
                                   "spark_model_dir": "/srv/sparkops/models", "spark_model_name": "m"}),
    ("paths-only", {}),
    ("all-set", {"ple_alignment": 2097152, "ple_name_patterns": [r"per_layer\.", "embed_tokens_per_layer"],
                 "ple_verify": True, "ple_file_mode": "0640", "ple_enabled": True}),
    ("alignment-from-the-command-line", {"ple_alignment": "8192"}),
    ("disabled-without-paths", {"ple_enabled": False, "ple_checkpoint_dir": None, "ple_pack_file": None}),
    # the checks beyond type (meta/checks.yml) hold only with ple_enabled true
    ("disabled-other-values", {"ple_enabled": False, "ple_alignment": 5000, "ple_pack_file": "/srv/sparkops/models/m",
                               "ple_name_patterns": [""], "ple_file_mode": "rw-r--r--"}),
]

SWEEP_PLAY = """
    - hosts: cases
      gather_facts: false
      tasks:
        - name: Run the role's entry point
          block:
            - name: The entry point
              ansible.builtin.include_role:
                name: sparkops.appliance.ple
                tasks_from: "{{ entry }}"
            - name: Passed
              ansible.builtin.set_fact:
                case_result: {failed: false}
          rescue:
            - name: Refused
              ansible.builtin.set_fact:
                case_result:
                  failed: true
                  task: "{{ ansible_failed_task.name | default('') }}"
                  msgs: "{{ [ansible_failed_result.msg | default('')]
                            + (ansible_failed_result.results | default([]) | selectattr('failed', 'defined')
                               | selectattr('failed') | map(attribute='msg') | list) }}"
    - hosts: localhost
      gather_facts: false
      tasks:
        - name: Save every case's result
          ansible.builtin.copy:
            content: "{{ dict(groups['cases'] | zip(groups['cases'] | map('extract', hostvars, 'case_result'))) | to_json }}"
            dest: "{{ out }}"
            mode: "0600"
    - hosts: spark
      gather_facts: false
      roles:
        - role: sparkops.appliance.ple
      tasks:
        - name: Save the facts handed to the memory plan
          ansible.builtin.copy:
            content: "{{ {'bytes': spark_ple_bytes, 'file': spark_ple_pack_file} | to_json }}"
            dest: "{{ facts_out }}"
            mode: "0600"
"""


def host_vars(overrides, entry):
    hv = dict(GOOD, entry=entry)
    hv.update(overrides)
    return {k: v for k, v in hv.items() if v is not None}  # None: not set at all


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Every case is a host of one inventory, its values as host vars (as an inventory would set
    them). The hosts are unreachable (ssh to a closed port): a check that contacted one would
    make it unreachable, which no rescue catches, and the case would have no result."""
    tmp = tmp_path_factory.mktemp("ple-sweep")
    hosts = {}
    for name, overrides, *_expected in BAD:
        if name in IN_PLAY:
            hosts["bad-" + name] = host_vars(overrides, "validate")
    for name, overrides in ACCEPTED:
        hosts["ok-" + name] = host_vars(overrides, "validate")
    # the role's main entry point runs the same checks first, before its first host task
    for name, overrides, *_expected in BAD[:3] + BAD[-3:]:
        hosts["main-" + name] = host_vars(overrides, "main")
    # the two-paths case: this machine, only ple_checkpoint_dir and ple_pack_file (last play)
    build_checkpoint(tmp / "ckpt")
    pack = tmp / "out" / "m.ple"
    spark = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "ple_checkpoint_dir": str(tmp / "ckpt"), "ple_pack_file": str(pack)}
    inventory = {"all": {
        "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                  "spark": spark},
        "children": {"cases": {"hosts": hosts, "vars": {
            "ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
            "ansible_python_interpreter": "/usr/bin/python3"}}}}}
    out = tmp / "results.json"
    proc = playbook(tmp, inventory, SWEEP_PLAY, ["-e", "out=%s" % out, "-e", "facts_out=%s" % (tmp / "facts.json"), "-f", "8"])
    doc = stdout_json(proc)
    # every host of the sweep ran clean (the cases rescued their refusals); "spark" is judged by its own test
    for host, stats in doc["stats"].items():
        if host != "spark":
            assert stats["failures"] == 0 and stats["unreachable"] == 0, (host, stats, proc.stderr[-2000:])
    results = json.loads(out.read_text())
    results["spark"] = {"pack": pack, "facts": tmp / "facts.json", "stats": doc["stats"].get("spark", {"failures": "no result"}),
                        "results": host_results(doc, "spark")}
    return results


def assert_names_variable_value_and_fix(msg, var, value, fix):
    assert msg.startswith(var + " = ") or (" " + var + " = ") in msg, msg
    assert json.dumps(value) in msg, msg
    assert fix in msg, msg


PLAY_BAD = [b for b in BAD if b[0] in IN_PLAY]


@pytest.mark.parametrize("name,overrides,var,value,fix", PLAY_BAD, ids=[b[0] for b in PLAY_BAD])
def test_bad_ple_value_is_refused_with_variable_value_and_fix(sweep, name, overrides, var, value, fix):
    res = sweep["bad-" + name]
    assert res["failed"] is True, "%s was accepted" % name
    # refused by validate.yml's input_problems lookup (not by the argument spec, whose messages lack the fix)
    assert res["task"].startswith("Refuse"), res
    assert_names_variable_value_and_fix(" ".join(m for m in res["msgs"] if m and m != "One or more items failed"), var, value, fix)


DATA_BAD = [b for b in BAD if b[0] not in TEMPLATED]


@pytest.mark.parametrize("name,overrides,var,value,fix", DATA_BAD, ids=[b[0] for b in DATA_BAD])
def test_bad_ple_value_is_refused_by_the_checks_in_process(name, overrides, var, value, fix):
    """What validate.yml's "Refuse ..." task joins: input_problems of the ple role's options and checks."""
    values = host_vars(overrides, "validate")
    del values["entry"]
    problems = input_problems(values, load_role_options(roles=["ple"]), load_role_checks(roles=["ple"]))
    assert problems, "%s was accepted" % name
    assert_names_variable_value_and_fix(" ".join(problems), var, value, fix)


@pytest.mark.parametrize("name", [a[0] for a in ACCEPTED])
def test_good_ple_values_pass_without_contacting_the_host(sweep, name):
    assert sweep["ok-" + name] == {"failed": False}


@pytest.mark.parametrize("name", [b[0] for b in BAD[:3] + BAD[-3:]])
def test_the_role_checks_first_before_any_host_task(sweep, name):
    res = sweep["main-" + name]
    assert res["failed"] is True and res["task"].startswith("Refuse"), res
