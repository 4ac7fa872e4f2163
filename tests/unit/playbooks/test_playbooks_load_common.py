"""Every play that reads a shared name (roles/common/defaults/main.yml: spark_serve_unit_name,
spark_serve_container_name, cluster_role, ...) loads roles/common, directly or through a role that
depends on it, and no playbook copies a shared name's default with `| default(...)`.

A play that reads such a name without common works only where the inventory sets it: the lab sets
spark_serve_container_name in lab_overrides.yml, the example inventory does not, so verify.yml
failed on the example inventory's values while every lab run passed.
"""
import glob
import os
import re

import pytest
import yaml

import harness

COMMON = sorted(yaml.safe_load(open(os.path.join(harness.ROOT, "roles", "common", "defaults", "main.yml"))))
PLAYBOOKS = sorted(glob.glob(os.path.join(harness.ROOT, "playbooks", "*.yml")))


def _short(name):
    return name.split(".")[-1]


def _dependencies(role):
    with open(os.path.join(harness.ROOT, "roles", role, "meta", "main.yml")) as handle:
        meta = yaml.safe_load(handle) or {}
    return [_short(dep["role"] if isinstance(dep, dict) else dep) for dep in meta.get("dependencies") or []]


def _loads_common(role):
    return role == "common" or any(_loads_common(dep) for dep in _dependencies(role))


def _uses(text, name):
    """`name` read as a variable: a whole word, not an attribute (x.name) and not quoted as a key."""
    return re.search(r"(?<![\w.'\"])%s\b" % re.escape(name), text) is not None


def plays():
    for path in PLAYBOOKS:
        with open(path) as handle:
            for index, play in enumerate(yaml.safe_load(handle) or []):
                yield pytest.param(path, play, id="%s#%d" % (os.path.basename(path), index + 1))


@pytest.mark.parametrize("path, play", plays())
def test_a_play_that_reads_a_shared_name_loads_common(path, play):
    text = yaml.safe_dump(play)
    used = [name for name in COMMON if _uses(text, name)]
    roles = [_short(entry["role"] if isinstance(entry, dict) else entry) for entry in play.get("roles") or []]
    assert not used or any(_loads_common(role) for role in roles), (
        "%s, play %r reads %s but loads no role that brings roles/common's defaults (roles: %s). "
        "Add `- role: sparkops.appliance.common` to its roles." % (os.path.basename(path), play.get("name"), used, roles))


@pytest.mark.parametrize("path", PLAYBOOKS, ids=os.path.basename)
def test_no_playbook_copies_a_shared_default(path):
    with open(path) as handle:
        text = handle.read()
    copies = [name for name in COMMON if re.search(r"\b%s\s*\|\s*default\(" % re.escape(name), text)]
    assert not copies, "%s copies the default of %s: load roles/common instead" % (os.path.basename(path), copies)


def test_the_check_sees_a_play_without_common():
    play = {"name": "x", "hosts": "sparks", "tasks": [{"debug": {"msg": "{{ spark_serve_container_name }}"}}]}
    text = yaml.safe_dump(play)
    assert _uses(text, "spark_serve_container_name")
    assert not _uses("{{ hostvars[h].spark_serve_container_name }}", "spark_serve_container_name")
    assert _loads_common("serve") and _loads_common("common")
