# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.known_bad: match observed driver, kernel, NCCL and vLLM versions against the known-bad list."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: known_bad
short_description: Match a host's and an image's versions against the list of known-bad versions
version_added: 0.1.0
author:
  - sparkops contributors (@sparkops)
description:
  - "Input: the entries of the known-bad list (C(roles/preflight/files/known_bad.yml), docs/drivers.md),
    each C({id, component, versions, action, reason, reported_at, fix}): C(component) is one of
    C(driver), C(kernel), C(nccl), C(vllm); C(action) is C(refuse) or C(warn)."
  - "C(versions) is one or more clauses joined by commas, all of which must hold: C(590.*) (the branch
    590: C(590) itself or anything starting C(590.)), C(< 2.30.4), C(<=), C(>), C(>=), C(==) or C(!=)
    and a version, or a bare version (C(==)). Versions are ordered as dpkg orders them
    (sparkops.appliance.deb_pins), which orders dotted numbers numerically."
  - "O(observed): what was seen, each C({component, version, source}) (C(source) names where the
    version comes from: a variable or a fact). An empty version was not seen and is not checked:
    its component is listed in C(unchecked). The version C(none) says the component is not there
    (a runtime image without NCCL, as a CPU build): no entry matches it, and it is not unchecked."
  - "O(accept): entry ids whose C(refuse) is taken knowingly: a match then warns instead. An id that
    names no entry is refused (a typo would otherwise accept nothing, silently)."
  - A malformed entry (missing key, unknown component or action, unreadable clause, duplicate id) is
    an error naming the entry.
options:
  _input:
    description: The entries.
    type: list
    elements: dict
    required: true
  observed:
    description: The versions seen.
    type: list
    elements: dict
    required: true
  accept:
    description: Entry ids accepted knowingly (C(preflight_accept_known_bad)).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
known: >-
  {{ (lookup('ansible.builtin.file', 'known_bad.yml') | from_yaml).known_bad
     | sparkops.appliance.known_bad([{'component': 'kernel', 'version': ansible_facts.spark_kernel_release,
                                      'source': 'the running kernel'}], preflight_accept_known_bad) }}
"""

RETURN = r"""
_value:
  description:
    - "C(refusals) and C(warnings), one message per match
      (C(<source> = <version>: known bad (<id>, <component> <versions>): <reason> Reported: <reported_at>. Fix: <fix>.)),
      and C(unchecked), the components of O(observed) seen with no version."
  type: dict
  sample: {"refusals": ["drivers_driver_branch = 590: known bad (driver-590-cudagraph-deadlock, ...): ..."],
           "warnings": [], "unchecked": ["nccl"]}
"""

import re

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.appliance.plugins.filter.deb_pins import deb_version_compare

COMPONENTS = ("driver", "kernel", "nccl", "vllm")
ACTIONS = ("refuse", "warn")
KEYS = ("id", "component", "versions", "action", "reason", "reported_at", "fix")
ACCEPT_VAR = "preflight_accept_known_bad"
NOT_SHIPPED = "none"        # the component is not there (e.g. an image without NCCL): nothing to match
_ID = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_CLAUSE = re.compile(r"^\s*(?:(?P<branch>[^\s*<>=!,]+)\.\*|(?P<op><=|>=|==|!=|<|>)?\s*(?P<version>[^\s<>=!,*]+))\s*$")
_OPS = {"<": lambda c: c < 0, "<=": lambda c: c <= 0, ">": lambda c: c > 0, ">=": lambda c: c >= 0,
        "==": lambda c: c == 0, "!=": lambda c: c != 0}


def parse_versions(text):
    """'590.*' or '< 2.30.4' or '>= 0.23.0, < 0.24.0' -> [(op, version)], op 'branch' for a prefix."""
    clauses = []
    for part in str(text).split(","):
        found = _CLAUSE.match(part)
        if not found:
            raise ValueError("%r is not a version clause (590.*, < 2.30.4, == 6.17.0-1014-nvidia, ...)" % part.strip())
        if found.group("branch"):
            clauses.append(("branch", found.group("branch")))
        else:
            clauses.append((found.group("op") or "==", found.group("version")))
    return clauses


def version_matches(version, clauses):
    version = str(version).strip()
    for op, want in clauses:
        if op == "branch":
            if not (version == want or version.startswith(want + ".")):
                return False
        elif not _OPS[op](deb_version_compare(version, want)):
            return False
    return True


def check_entries(entries):
    """The entries with their clauses parsed; AnsibleFilterError naming the first bad one."""
    if not isinstance(entries, list):
        raise AnsibleFilterError("known_bad: the list of known-bad versions must be a list of entries, got %s" % type(entries).__name__)
    seen, checked = set(), []
    for index, entry in enumerate(entries):
        name = entry.get("id", "#%d" % (index + 1)) if isinstance(entry, dict) else "#%d" % (index + 1)
        problem = None
        if not isinstance(entry, dict):
            problem = "is not a mapping"
        elif [key for key in KEYS if not str(entry.get(key) or "").strip()]:
            problem = "lacks %s" % ", ".join(key for key in KEYS if not str(entry.get(key) or "").strip())
        elif sorted(set(entry) - set(KEYS)):
            problem = "has unknown keys %s (known: %s)" % (", ".join(sorted(set(entry) - set(KEYS))), ", ".join(KEYS))
        elif not _ID.match(str(entry["id"])):
            problem = "has the id %r: lower-case letters, digits, '.' and '-'" % entry["id"]
        elif entry["id"] in seen:
            problem = "repeats an id"
        elif entry["component"] not in COMPONENTS:
            problem = "has the component %r, not one of %s" % (entry["component"], ", ".join(COMPONENTS))
        elif entry["action"] not in ACTIONS:
            problem = "has the action %r, not one of %s" % (entry["action"], ", ".join(ACTIONS))
        if problem is None:
            try:
                clauses = parse_versions(entry["versions"])
            except ValueError as exc:
                problem = "versions: %s" % exc
        if problem:
            raise AnsibleFilterError("known-bad entry %s %s. Fix the entry (docs/drivers.md, \"Adding an entry\")." % (name, problem))
        seen.add(entry["id"])
        checked.append((entry, clauses))
    return checked


def known_bad(entries, observed, accept=None):
    checked = check_entries(entries)
    accept = list(accept or [])
    ids = set(entry["id"] for entry, _clauses in checked)
    result = {"refusals": [], "warnings": [], "unchecked": []}
    for unknown in [name for name in accept if name not in ids]:
        result["refusals"].append("%s = %s: %r names no known-bad entry (known: %s). Fix: give the id of an entry, or remove it."
                                  % (ACCEPT_VAR, _json_list(accept), unknown, ", ".join(sorted(ids))))
    for seen in observed:
        version = str(seen.get("version") or "").strip()
        if not version:
            if seen["component"] not in result["unchecked"]:
                result["unchecked"].append(seen["component"])
            continue
        if version == NOT_SHIPPED:
            continue
        for entry, clauses in checked:
            if entry["component"] != seen["component"]:
                continue
            try:
                hit = version_matches(version, clauses)
            except AnsibleFilterError:
                hit = False         # not a version dpkg could order: no range can hold for it
            if not hit:
                continue
            head = "%s = %s: known bad (%s, %s %s): %s Reported: %s." % (
                seen.get("source") or seen["component"], version, entry["id"], entry["component"], entry["versions"],
                _sentence(entry["reason"]), str(entry["reported_at"]).strip())
            if entry["action"] == "warn":
                result["warnings"].append("%s Fix: %s" % (head, _sentence(entry["fix"])))
            elif entry["id"] in accept:
                result["warnings"].append("%s Accepted knowingly (%s lists %s). Fix: %s" % (
                    head, ACCEPT_VAR, entry["id"], _sentence(entry["fix"])))
            else:
                result["refusals"].append("%s Fix: %s Or, to run it knowingly, add %s to %s." % (
                    head, _sentence(entry["fix"]), entry["id"], ACCEPT_VAR))
    return result


def _sentence(text):
    text = " ".join(str(text).split())
    return text if text.endswith((".", "!", "?")) else text + "."


def _json_list(items):
    return "[%s]" % ", ".join('"%s"' % item for item in items)


class FilterModule(object):
    def filters(self):
        return {"known_bad": known_bad}
