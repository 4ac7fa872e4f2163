# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.rollout_batches: the hosts of a rollout in batches that never split a unit."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: rollout_batches
short_description: Order hosts into rollout batches that keep each rollout unit (a TP=2 pair) whole
version_added: 0.1.0
description:
  - Groups the hosts into rollout units. A host's unit is its C(rollout_unit) when set; else, for a
    host with a C(cluster_role) (C(head) or C(worker)), the smallest inventory group that holds
    both a head and a worker and only hosts with a C(cluster_role) (the pair's group); else the host itself.
  - Cuts the units, in the order of O(_input), into batches sized like Ansible's C(serial) list
    O(serial) (counts or percentages of all the hosts; the last value repeats). A batch takes whole
    units while it stays within its size, and always at least one unit, so a pair is never split
    and a pair as canary makes a canary batch of two.
  - Returns the list of batches (lists of host names), first batch first.
options:
  _input:
    description: The host names, in rollout order (normally C(ansible_play_hosts)).
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars) (for C(rollout_unit), C(cluster_role) and C(group_names)).
    type: dict
    required: true
  groups:
    description: C(groups) (to find a pair's group).
    type: dict
    required: true
  serial:
    description: Batch sizes, as Ansible's C(serial) (an int, C("N%"), or a list of them).
    type: raw
    required: true
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Batches of the rollout
  ansible.builtin.debug:
    msg: "{{ ansible_play_hosts | sparkops.appliance.rollout_batches(hostvars, groups, [1, '25%']) }}"
"""

RETURN = r"""
_value:
  description: Batches of host names; a unit's hosts are always in the same batch.
  type: list
  elements: list
"""

import math
import re

from ansible.errors import AnsibleFilterError

_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")
_COUNT = re.compile(r"^\s*([0-9]+)\s*$")
_SKIP_GROUPS = ("all", "ungrouped")


def batch_sizes(serial, total):
    """Ansible's serial values -> host counts (each at least 1), for `total` hosts."""
    values = serial if isinstance(serial, (list, tuple)) else [serial]
    if not values:
        raise AnsibleFilterError("rollout_serial is empty: give a count, a percentage or a list of them, e.g. [1, '25%'].")
    sizes = []
    for value in values:
        count = None if isinstance(value, bool) else _COUNT.match(str(value))
        percent = None if isinstance(value, bool) else _PERCENT.match(str(value))
        if count:
            size = int(count.group(1))
        elif percent:
            # Ansible's serial: a percentage of all the hosts, rounded down, at least one host.
            size = max(1, int(math.floor(float(percent.group(1)) * total / 100.0))) if float(percent.group(1)) > 0 else 0
        else:
            raise AnsibleFilterError(
                "rollout_serial: %r is neither a host count nor a percentage; use e.g. 1, 2 or '25%%'." % (value,))
        if size < 1:
            raise AnsibleFilterError("rollout_serial: %r gives no host per batch; use at least 1 or '1%%'." % (value,))
        sizes.append(size)
    return sizes


def _pair_group(host, hostvars, groups):
    """The smallest group holding `host` with both a head and a worker, every member with a cluster_role."""
    candidates = []
    for name in hostvars[host].get("group_names", []):
        if name in _SKIP_GROUPS:
            continue
        members = list(groups.get(name, []))
        roles = [hostvars[m].get("cluster_role") if m in hostvars else None for m in members]
        if all(r in ("head", "worker") for r in roles) and "head" in roles and "worker" in roles:
            candidates.append((len(members), name))
    if not candidates:
        raise AnsibleFilterError(
            "rollout: %s has cluster_role %r but no inventory group holds its pair (one head, one worker, "
            "only hosts with a cluster_role); put the pair in its own group or set rollout_unit on both hosts."
            % (host, hostvars[host].get("cluster_role")))
    return sorted(candidates)[0][1]


def unit_of(host, hostvars, groups):
    """A host's rollout unit: rollout_unit, else its pair's group, else the host itself."""
    hv = hostvars[host]
    unit = hv.get("rollout_unit")
    if unit is not None and str(unit) != "":
        return "unit:" + str(unit)
    if hv.get("cluster_role") in ("head", "worker"):
        return "unit:" + _pair_group(host, hostvars, groups)
    return "host:" + host


def rollout_batches(hosts, hostvars, groups, serial):
    """Hosts -> batches of whole units, sized like Ansible's serial."""
    hosts = list(hosts)
    if not hosts:
        return []
    units, order = {}, []
    for host in hosts:
        key = unit_of(host, hostvars, groups)
        if key not in units:
            units[key] = []
            order.append(key)
        units[key].append(host)
    sizes = batch_sizes(serial, len(hosts))
    batches, index = [], 0
    while index < len(order):
        size = sizes[min(len(batches), len(sizes) - 1)]
        batch = list(units[order[index]])
        index += 1
        while index < len(order) and len(batch) + len(units[order[index]]) <= size:
            batch.extend(units[order[index]])
            index += 1
        batches.append(batch)
    return batches


class FilterModule(object):
    """sparkops.appliance.rollout_batches"""

    def filters(self):
        return {"rollout_batches": rollout_batches}
