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


# The options of every role but common (roles/<role>/defaults/main.yml): a play that does not load the
# role (roles:, directly or through a dependency) has none of its defaults in scope. include_role
# does not expose them either (public: false), not even after the role ran.
ROLE_OPTIONS = {}
for _path in sorted(glob.glob(os.path.join(harness.ROOT, "roles", "*", "defaults", "main.yml"))):
    _role = _path.split(os.sep)[-3]
    if _role != "common":
        with open(_path) as _handle:
            ROLE_OPTIONS.update((name, _role) for name in (yaml.safe_load(_handle) or {}))


def _loaded(play):
    """The roles whose defaults a play has in scope: its roles: and their dependencies."""
    todo = [_short(entry["role"] if isinstance(entry, dict) else entry) for entry in play.get("roles") or []]
    seen = set()
    while todo:
        role = todo.pop()
        if role not in seen:
            seen.add(role)
            todo += _dependencies(role) if os.path.isdir(os.path.join(harness.ROOT, "roles", role)) else []
    return seen


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _expressions(play):
    """The Jinja a play evaluates itself: its tasks' conditions and every {{ }} of its tasks and vars."""
    found = []
    for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
        for task in harness.walk_tasks(play.get(section)):
            own = dict((k, v) for k, v in task.items() if k not in ("block", "rescue", "always"))
            when = own.pop("when", None)
            found += [str(w) for w in (when if isinstance(when, list) else [when] if when is not None else [])]
            found += [e for text in _strings(own) for e in re.findall(r"\{\{(.*?)\}\}", text, re.S)]
    found += [e for text in _strings(play.get("vars") or {}) for e in re.findall(r"\{\{(.*?)\}\}", text, re.S)]
    return found


def _unscoped(play):
    loaded = _loaded(play)
    return sorted(set(
        "%s (%s)" % (name, role) for expr in _expressions(play) for name, role in ROLE_OPTIONS.items()
        if role not in loaded and re.search(r"(?<![\w.'\"])%s\b(?!\s*\|\s*default\()" % re.escape(name), expr)))


@pytest.mark.parametrize("path, play", plays())
def test_a_play_reads_a_roles_option_only_where_it_is_in_scope(path, play):
    """site.yml's model play read `when: ple_enabled` outside the ple role: the lab sets ple_enabled,
    the example inventory leaves it to the role's default, so site.yml failed there on an undefined
    variable (tests/unit/playbooks/test_site_model_play.py runs that play on the example's values)."""
    unscoped = _unscoped(play)
    assert not unscoped, (
        "%s, play %r reads %s outside those roles, where their defaults are not in scope: an inventory that "
        "leaves them to the default fails on an undefined variable. Read each with the role's default "
        "(`| default(...)`) or load the role in the play's roles:." % (os.path.basename(path), play.get("name"), unscoped))


def test_the_scope_check_sees_a_role_option_read_outside_its_role():
    play = {"name": "x", "hosts": "sparks", "roles": [{"role": "sparkops.appliance.checkpoint"}],
            "tasks": [{"name": "t", "ansible.builtin.include_role": {"name": "sparkops.appliance.ple"}, "when": "ple_enabled"}]}
    assert _unscoped(play) == ["ple_enabled (ple)"]
    play["tasks"][0]["when"] = "ple_enabled | default(true) | bool"
    assert _unscoped(play) == []
    play["tasks"][0]["when"] = "checkpoint_source != 'none'"   # the play loads checkpoint
    assert _unscoped(play) == []
