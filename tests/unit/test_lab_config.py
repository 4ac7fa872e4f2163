"""The lab's variables live in ONE file, inventories/lab/group_vars/sparks/lab_overrides.yml, that
both the lab inventory and the Molecule role scenarios read; a copy of them anywhere else fails.

Each role scenario links the file as molecule/<scenario>/group_vars/all/lab_overrides.yml
(playbook group_vars/all: above the roles' defaults, below the scenario's own inventory
group_vars), so it runs the roles' defaults plus the lab overrides plus its own values. The
production scenario links the whole lab group_vars (the example inventory's values too).
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

import harness

ROOT = harness.ROOT
LAB_FILE = os.path.join(ROOT, "inventories", "lab", "group_vars", "sparks", "lab_overrides.yml")
LINK = os.path.join("group_vars", "all", "lab_overrides.yml")
SCENARIOS = sorted(d for d in os.listdir(os.path.join(ROOT, "molecule"))
                   if os.path.isfile(os.path.join(ROOT, "molecule", d, "molecule.yml")))


def load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


LAB = load(LAB_FILE)
EXAMPLE = load(os.path.join(ROOT, "inventories", "example", "group_vars", "sparks", "main.yml"))
BASE = load(os.path.join(ROOT, ".config", "molecule", "config.yml"))


def scenario_config(name):
    return load(os.path.join(ROOT, "molecule", name, "molecule.yml")) or {}


def links_the_lab_inventory(config):
    links = ((config.get("provisioner") or {}).get("inventory") or {}).get("links") or {}
    return os.path.normpath(links.get("group_vars", "")) == os.path.normpath("../../inventories/lab/group_vars")


ROLE_SCENARIOS = [s for s in SCENARIOS if not links_the_lab_inventory(scenario_config(s))]


def test_the_lab_file_is_the_one_the_lab_inventory_reads():
    assert os.path.isfile(LAB_FILE) and not os.path.islink(LAB_FILE)
    assert LAB and "spark_expect_gpu" in LAB
    assert "production" in SCENARIOS and "production" not in ROLE_SCENARIOS and ROLE_SCENARIOS


@pytest.mark.parametrize("scenario", ROLE_SCENARIOS)
def test_a_role_scenario_links_the_one_file(scenario):
    link = os.path.join(ROOT, "molecule", scenario, LINK)
    assert os.path.islink(link), "molecule/%s/%s must be a symlink to %s, not a copy or nothing" % (
        scenario, LINK, os.path.relpath(LAB_FILE, ROOT))
    assert os.path.realpath(link) == os.path.realpath(LAB_FILE)


def test_the_molecule_base_carries_no_copy():
    inventory = (BASE.get("provisioner") or {}).get("inventory") or {}
    for section in ("group_vars", "host_vars"):
        for group, values in (inventory.get(section) or {}).items():
            again = sorted(set(values or {}) & set(LAB))
            assert not again, ".config/molecule/config.yml %s.%s repeats lab overrides %s: read them from %s" % (
                section, group, again, os.path.relpath(LAB_FILE, ROOT))
    assert not inventory.get("links"), "a link in the base config makes Molecule drop every scenario's group_vars"


def _mappings(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _mappings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _mappings(value)


def test_no_yaml_file_repeats_the_lab_overrides():
    """A mapping that holds more than half of the lab's variables with the lab's values is a copy."""
    found = []
    for top in ("molecule", ".config", "inventories", "playbooks", "tests"):
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                path = os.path.join(dirpath, name)
                if not name.endswith((".yml", ".yaml")) or os.path.realpath(path) == os.path.realpath(LAB_FILE):
                    continue
                try:
                    data = load(path)
                except yaml.YAMLError:
                    continue
                for mapping in _mappings(data):
                    same = [k for k in LAB if k in mapping and mapping[k] == LAB[k]]
                    if len(same) > len(LAB) // 2:
                        found.append("%s (%d of %d lab values)" % (os.path.relpath(path, ROOT), len(same), len(LAB)))
    assert not found, "copies of %s: %s" % (os.path.relpath(LAB_FILE, ROOT), found)


# ansible-inventory as a program, once per scenario, with the Python start and Ansible's imports
# paid once: this runner imports the CLI, then forks a child per scenario that chdirs to the
# scenario's folder, sends its stdout/stderr to files and runs InventoryCLI.cli_executor with the
# argv ansible-inventory would get (the same entry point as the ansible-inventory script). Each child
# is a fresh copy of the freshly imported process: no state carries from one scenario to the next.
RUNNER = r"""
import json, os, sys
from ansible.cli.inventory import InventoryCLI
rcs = {}
for job in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.chdir(job["cwd"])
            for fd, name in ((1, "stdout"), (2, "stderr")):
                out = os.open(os.path.join(job["cwd"], name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(out, fd)
                os.close(out)
            try:
                InventoryCLI.cli_executor(["ansible-inventory"] + job["args"])
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    rcs[job["name"]] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(rcs))
"""


def _inventory(tmp_path, scenario):
    """Molecule's inventory for the scenario (the base's and the scenario's inventory.group_vars);
    returns (the ansible-inventory arguments, the host, the sparks group's own values)."""
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    host = "sparkops-molecule-%s" % scenario
    (inv / "ansible_inventory.yml").write_text(yaml.safe_dump({"all": {"children": {"sparks": {"hosts": {host: {}}}}}}))
    groups = {}
    for config in (BASE, scenario_config(scenario)):
        for group, values in (((config.get("provisioner") or {}).get("inventory") or {}).get("group_vars") or {}).items():
            groups.setdefault(group, {}).update(values or {})
    for group, values in groups.items():
        (inv / "group_vars" / group).write_text(yaml.safe_dump(values))
    args = ["-i", str(inv / "ansible_inventory.yml"), "--playbook-dir", os.path.join(ROOT, "molecule", scenario),
            "--host", host]
    return args, groups.get("sparks", {})


@pytest.fixture(scope="module")
def scenario_host_vars(tmp_path_factory):
    """What a play of each scenario sees: Molecule's inventory read with the scenario's playbook
    directory, by ansible-inventory --host (all scenarios in one runner start, see RUNNER)."""
    base = tmp_path_factory.mktemp("lab-config")
    jobs, own = [], {}
    for scenario in ROLE_SCENARIOS:
        work = base / scenario
        work.mkdir()
        args, own[scenario] = _inventory(work, scenario)
        jobs.append({"name": scenario, "cwd": str(work), "args": args})
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".collections"))
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(jobs)], capture_output=True, text=True, env=env,
                          cwd=str(base), check=True, timeout=300)
    rcs = json.loads(proc.stdout)
    out = {}
    for job in jobs:
        work = base / job["name"]
        out[job["name"]] = (rcs[job["name"]], (work / "stdout").read_text(), (work / "stderr").read_text(),
                            own[job["name"]])
    return out


def _host_vars(scenario_host_vars, scenario):
    rc, stdout, stderr, own = scenario_host_vars[scenario]
    assert rc == 0, "ansible-inventory for %s: rc %s\n%s" % (scenario, rc, stderr[-3000:])
    return json.loads(stdout), own


@pytest.mark.parametrize("scenario", ROLE_SCENARIOS)
def test_a_role_scenario_sees_the_lab_overrides_under_its_own_values(scenario_host_vars, scenario):
    seen, own = _host_vars(scenario_host_vars, scenario)
    for key, value in LAB.items():
        expected = own[key] if key in own else value
        assert seen.get(key) == expected, "%s: %s is %r, want %r" % (scenario, key, seen.get(key), expected)
    # the example inventory's values stay out (the roles' defaults apply)
    leaked = sorted(k for k in EXAMPLE if k not in LAB and k not in own and k in seen)
    assert not leaked, "%s sees example-inventory variables %s" % (scenario, leaked)
