# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.deb_installed: dpkg-query output to installed packages."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: deb_installed
short_description: The installed packages from dpkg-query output, shaped as package_facts shapes them
version_added: 0.1.0
author:
  - sparkops contributors (@sparkops)
description:
  - "Input: the output of C(dpkg-query -W -f '${Package}\\t${db:Status-Abbrev}\\t${Version}\\n' NAMES...)."
  - "Output: C({name: [{name, version}]}) for the installed packages only (a removed package whose
    configuration files remain, or a name dpkg only knows of, is left out), as
    C(ansible_facts.packages) holds them, for C(sparkops.appliance.deb_pins)."
  - Reading only the packages named is much cheaper than M(ansible.builtin.package_facts), which
    reads the whole package database.
options:
  _input:
    description: The dpkg-query output.
    type: str
    required: true
"""

EXAMPLES = r"""
installed: "{{ dpkg_query.stdout | sparkops.appliance.deb_installed }}"
"""

RETURN = r"""
_value:
  description: Installed package name to a list of one C({name, version}).
  type: dict
  sample: {"nvidia-container-toolkit": [{"name": "nvidia-container-toolkit", "version": "1.18.0-1"}]}
"""


def deb_installed(text):
    """dpkg-query's "Package<TAB>Status-Abbrev<TAB>Version" lines -> {name: [{name, version}]}, installed only."""
    installed = {}
    for line in str(text).splitlines():
        fields = line.split("\t")
        if len(fields) != 3:
            continue
        name, status, version = fields[0].strip(), fields[1], fields[2].strip()
        # Status-Abbrev: desired action, then package status; "i" as the status is installed.
        if len(status) >= 2 and status[1] == "i" and version:
            installed.setdefault(name, []).append({"name": name, "version": version})
    return installed


class FilterModule(object):
    def filters(self):
        return {"deb_installed": deb_installed}
