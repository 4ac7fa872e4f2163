# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.meminfo_gib: /proc/meminfo text to GiB figures."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: meminfo_gib
short_description: Parse /proc/meminfo into GiB figures
version_added: 0.1.0
description:
  - "Every C(Name: N kB) line becomes C(Name) -> N x 1024 / 2^30 (GiB, float). Lines without
    a kB unit (HugePages counts) are left out. Fails when there is no MemTotal line."
  - On a DGX Spark C(nvidia-smi) reports memory as N/A; /proc/meminfo is the source.
options:
  _input:
    description: The text of /proc/meminfo.
    type: str
    required: true
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Read /proc/meminfo (read-only, works in check mode)
  ansible.builtin.slurp:
    src: /proc/meminfo
  register: __meminfo

- name: MemTotal in GiB
  ansible.builtin.debug:
    msg: "{{ (__meminfo.content | b64decode | sparkops.appliance.meminfo_gib).MemTotal }}"
"""

RETURN = r"""
_value:
  description: Field name -> GiB.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import (
    MemoryPlanError,
    parse_meminfo,
)


def meminfo_gib(text):
    """{field: GiB} of a /proc/meminfo text."""
    try:
        return parse_meminfo(text)
    except MemoryPlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule(object):
    """sparkops.appliance.meminfo_gib"""

    def filters(self):
        return {'meminfo_gib': meminfo_gib}
