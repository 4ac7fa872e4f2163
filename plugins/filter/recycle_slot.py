# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.recycle_slot: a serving host's place in its fleet's nightly recycle."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: recycle_slot
short_description: The seconds a serving host's drained recycle waits, so that a fleet recycles one host at a time
version_added: 0.1.0
description:
  - Every serving host of the fleet group O(group) (a pair's worker runs no server and has no slot)
    gets a place in the group's inventory order, 0 for the first; its recycle waits place times
    O(slot_s) after the timer fires. The order does not depend on C(--limit), so every host of a
    fleet keeps its slot whatever a run touched.
  - A host outside the group waits 0. O(slot_s) 0 gives every host 0 (no slots).
options:
  _input:
    description: The host (normally C(inventory_hostname)).
    type: str
    required: true
  hostvars:
    description: C(hostvars) (for each host's C(cluster_role)).
    type: dict
    required: true
  groups:
    description: C(groups).
    type: dict
    required: true
  group:
    description: The fleet's group.
    type: str
    required: true
  slot_s:
    description: Seconds per slot.
    type: int
    required: true
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: This host's wait before its recycle
  ansible.builtin.debug:
    msg: "{{ inventory_hostname | sparkops.appliance.recycle_slot(hostvars, groups, 'sparks', 1800) }}"
"""

RETURN = r"""
_value:
  description: Seconds to wait (place in the fleet times O(slot_s)).
  type: int
"""

from ansible.errors import AnsibleFilterError


def serving_hosts(hostvars, groups, group):
    """The group's hosts that run a server (not a pair's worker), in inventory order."""
    if group not in groups:
        raise AnsibleFilterError("serve_recycle_fleet_group: no inventory group %r; name the group of the Sparks "
                                 "that recycle one at a time (e.g. sparks)." % (group,))
    members = []
    for host in groups[group]:
        if host not in members and (hostvars.get(host) or {}).get("cluster_role") != "worker":
            members.append(host)
    return members


def recycle_slot(host, hostvars, groups, group, slot_s):
    """Seconds `host` waits after the recycle timer fires: its place among the serving hosts times slot_s."""
    slot_s = int(slot_s)
    if slot_s < 0:
        raise AnsibleFilterError("serve_recycle_slot_s = %d: below 0. Fix: give 0 (no slots) or the seconds one "
                                 "host's recycle takes." % slot_s)
    members = serving_hosts(hostvars, groups, group)
    return members.index(host) * slot_s if host in members else 0


class FilterModule(object):
    """sparkops.appliance.recycle_slot"""

    def filters(self):
        return {"recycle_slot": recycle_slot}
