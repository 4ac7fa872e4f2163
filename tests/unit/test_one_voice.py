# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One collection, one voice: one licence, one author, one min_ansible_version, version_added =
the collection's version, and comments that cite the SPEC, not an internal note.

Everything is compared with galaxy.yml, COPYING and meta/runtime.yml, so a drift anywhere (a role
meta, a plugin header or DOCUMENTATION, a role's script) fails here with the file and the value.
"""
import ast
import functools
import glob
import os
import re
import subprocess

import pytest
import yaml

import harness

ROOT = harness.ROOT
LICENSE = "GPL-3.0-or-later"
AUTHOR = "sparkops contributors (@sparkops)"
HEADER = ["# Copyright: sparkops contributors",
          "# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)"]
# Words that point at a note outside the collection (a brief, an issue thread, a helper's note)
# instead of SPEC.md: a comment or docstring cites "SPEC §N" instead.
INTERNAL_NOTE = re.compile(r"\bbrief\b|\bissue\s*#?\d|\(issue\b|\bissue:|helper note|helpers-brief", re.I)


def _load(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return yaml.safe_load(f)


def _tracked(*patterns):
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--"] + list(patterns),
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(set(p for p in out.splitlines() if os.path.isfile(os.path.join(ROOT, p))))


GALAXY = _load("galaxy.yml")
REQUIRES = _load("meta/runtime.yml")["requires_ansible"]
MIN_ANSIBLE = ".".join(re.fullmatch(r">=\s*(\d+)\.(\d+)(?:\.\d+)?", REQUIRES).groups())
ROLE_METAS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "roles", "*", "meta", "main.yml")))
PLUGIN_PY = _tracked("plugins/*.py")
# The Python scripts a role installs on the host are the collection's code too.
ROLE_SCRIPTS = [p for p in _tracked("roles/*/files/*")
                if p.endswith(".py") or open(os.path.join(ROOT, p), "rb").read(32).startswith(b"#!/usr/bin/python")]


def test_the_collection_says_it_once():
    assert GALAXY["license"] == [LICENSE]
    assert GALAXY["authors"] == [AUTHOR]
    with open(os.path.join(ROOT, "COPYING"), encoding="utf-8") as f:
        copying = f.read(2000)
    assert "GNU GENERAL PUBLIC LICENSE" in copying and "Version 3" in copying
    assert ROLE_METAS and PLUGIN_PY and ROLE_SCRIPTS


@pytest.mark.parametrize("path", ROLE_METAS)
def test_role_meta(path):
    info = _load(path)["galaxy_info"]
    assert info.get("license") in (LICENSE, [LICENSE]), "%s: license %r, want %s" % (path, info.get("license"), LICENSE)
    assert info.get("author") == AUTHOR, "%s: author %r, want %r" % (path, info.get("author"), AUTHOR)
    assert str(info.get("min_ansible_version")) == MIN_ANSIBLE, \
        "%s: min_ansible_version %r, meta/runtime.yml requires_ansible %r" % (path, info.get("min_ansible_version"), REQUIRES)
    specs = os.path.join(os.path.dirname(path), "argument_specs.yml")
    if os.path.isfile(os.path.join(ROOT, specs)):
        for name, spec in (_load(specs).get("argument_specs") or {}).items():
            if "author" in spec:
                assert spec["author"] in (AUTHOR, [AUTHOR]), "%s %s: author %r" % (specs, name, spec["author"])


@pytest.mark.parametrize("path", PLUGIN_PY + ROLE_SCRIPTS)
def test_header(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    head = [line for line in text.splitlines()[:4] if not line.startswith("#!") and "coding:" not in line]
    assert head[:2] == HEADER, "%s: the first lines are %r, want %r" % (path, head[:2], HEADER)
    for word in ("Apache", "MIT License", "BSD", "SPDX-License-Identifier"):
        assert word not in text, "%s mentions %r: the collection is %s only" % (path, word, LICENSE)


# Parsed once per plugin (collection and the test read the same file), with libyaml's safe loader
# where PyYAML has it (the same documents; the pure-Python loader was most of this file's time).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def _documentation(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCUMENTATION" for t in node.targets):
            return yaml.load(node.value.value, Loader=_SAFE_LOADER)  # nosec B506: a safe loader
    return None


DOCUMENTED = [p for p in PLUGIN_PY if _documentation(p) is not None]


@pytest.mark.parametrize("path", DOCUMENTED)
def test_plugin_documentation(path):
    doc = _documentation(path)
    authors = doc.get("author")
    authors = [authors] if isinstance(authors, str) else authors
    assert authors == [AUTHOR], "%s: DOCUMENTATION author %r, want %r" % (path, authors, AUTHOR)
    assert str(doc.get("version_added")) == GALAXY["version"], \
        "%s: version_added %r, galaxy.yml version %r" % (path, doc.get("version_added"), GALAXY["version"])
    for name, option in (doc.get("options") or {}).items():
        if "version_added" in option:
            assert str(option["version_added"]) == GALAXY["version"], "%s option %s: version_added %r" % (
                path, name, option["version_added"])


def test_some_plugins_are_documented():
    assert len(DOCUMENTED) >= 10


# lab/runtime/ is left out: its files are the recipe the lab runtime image tag hashes, and an
# edit there means a rebuild of that image.
NOTE_SCOPE = [p for p in _tracked("roles", "plugins", "playbooks", "molecule", "tests", "benchmarks", "inventories",
                                  "lab", "meta", ".config", "Makefile", ".ci", "galaxy.yml", "ansible.cfg")
              if not p.startswith("lab/runtime/") and p != "tests/unit/test_one_voice.py"
              and not p.endswith((".md", ".safetensors", ".json", ".gz", ".tar"))]


def test_comments_cite_the_spec_not_an_internal_note():
    found = []
    for path in NOTE_SCOPE:
        try:
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        found += ["%s:%d: %s" % (path, n, line.strip()) for n, line in enumerate(lines, 1) if INTERNAL_NOTE.search(line)]
    assert not found, "cite the SPEC section (SPEC §N) instead of a brief, an issue or a helper's note:\n" + "\n".join(found)
