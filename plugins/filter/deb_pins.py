# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.deb_pins: Debian version order and what to do about pinned packages."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: deb_pins
short_description: Decide, per pinned Debian package, whether to install, upgrade, keep or downgrade it
version_added: 0.1.0
author:
  - sparkops contributors (@sparkops)
description:
  - "Input: a list of pins, each C({name: ..., version: ...}) or a package name (pinned to
    O(version)); an empty version means any version will do (the package only has to be installed)."
  - "O(installed): installed packages as M(ansible.builtin.package_facts) gathers them
    (C(ansible_facts.packages)) or C(sparkops.appliance.deb_installed) reads them."
  - "Each pin gets an C(action): C(install) (absent), C(upgrade) (installed older than the pin),
    C(keep) (installed at the pin, or any version when unpinned), C(newer) (installed newer than
    the pin: left alone) or C(downgrade) (newer than the pin and O(force) is true), and C(spec),
    the argument for M(ansible.builtin.apt) (C(name=version), or C(name) when unpinned)."
  - The filter C(sparkops.appliance.deb_installed) makes that shape from C(dpkg-query) output.
  - Versions are ordered as dpkg orders them (deb-version(7)) - epoch, upstream version and
    revision; C(~) sorts before anything, even the end of the string.
options:
  _input:
    description: The pins.
    type: list
    elements: dict
    required: true
  installed:
    description: C(ansible_facts.packages).
    type: dict
    required: true
  force:
    description: Downgrade a package installed newer than its pin.
    type: bool
    default: false
  version:
    description: The version of the pins given as bare package names.
    type: str
    default: ""
"""

EXAMPLES = r"""
plan: "{{ [{'name': 'nvidia-container-toolkit', 'version': '1.18.0-1'}]
          | sparkops.appliance.deb_pins(ansible_facts.packages) }}"
"""

RETURN = r"""
_value:
  description: One entry per pin, in the order given.
  type: list
  elements: dict
  sample: [{"name": "nvidia-container-toolkit", "version": "1.18.0-1", "installed": "1.17.8-1",
            "action": "upgrade", "spec": "nvidia-container-toolkit=1.18.0-1"}]
"""

from ansible.errors import AnsibleFilterError


def _order(char):
    """dpkg's weight of one character of a non-digit run (the end of the string is 0)."""
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(left, right):
    """Compare an upstream version or a revision: alternate non-digit and digit runs."""
    i = j = 0
    while i < len(left) or j < len(right):
        while (i < len(left) and not left[i].isdigit()) or (j < len(right) and not right[j].isdigit()):
            lc = _order(left[i]) if i < len(left) and not left[i].isdigit() else 0
            rc = _order(right[j]) if j < len(right) and not right[j].isdigit() else 0
            if lc != rc:
                return -1 if lc < rc else 1
            i += 1
            j += 1
        start_i, start_j = i, j
        while i < len(left) and left[i].isdigit():
            i += 1
        while j < len(right) and right[j].isdigit():
            j += 1
        lnum, rnum = int(left[start_i:i] or "0"), int(right[start_j:j] or "0")
        if lnum != rnum:
            return -1 if lnum < rnum else 1
    return 0


def _split(version):
    text = str(version).strip()
    if not text:
        raise AnsibleFilterError("an empty Debian version cannot be compared")
    epoch, sep, rest = text.partition(":")
    if not sep:
        epoch, rest = "0", text
    if not epoch.isdigit():
        raise AnsibleFilterError("%r is not a Debian version: the epoch before ':' must be a number" % text)
    upstream, sep, revision = rest.rpartition("-")
    if not sep:
        upstream, revision = rest, ""
    return int(epoch), upstream, revision


def deb_version_compare(left, right):
    """-1, 0 or 1 as dpkg --compare-versions orders left and right."""
    lep, lup, lrev = _split(left)
    rep, rup, rrev = _split(right)
    if lep != rep:
        return -1 if lep < rep else 1
    return _compare_part(lup, rup) or _compare_part(lrev, rrev)


def deb_pins(pins, installed, force=False, version=""):
    if not isinstance(installed, dict):
        raise AnsibleFilterError("deb_pins: installed must be ansible_facts.packages (a dict), got %s" % type(installed).__name__)
    plan = []
    for pin in pins:
        if isinstance(pin, str):
            pin = {"name": pin, "version": version}
        name, want = pin["name"], str(pin.get("version") or "")
        versions = [entry.get("version") for entry in installed.get(name, []) if entry.get("version")]
        have = versions[0] if versions else ""
        if not have:
            action = "install"
        elif not want:
            action = "keep"
        else:
            order = deb_version_compare(have, want)
            if order == 0:
                action = "keep"
            elif order < 0:
                action = "upgrade"
            else:
                action = "downgrade" if force else "newer"
        plan.append({"name": name, "version": want, "installed": have, "action": action,
                     "spec": "%s=%s" % (name, want) if want else name})
    return plan


class FilterModule(object):
    def filters(self):
        return {"deb_pins": deb_pins}
