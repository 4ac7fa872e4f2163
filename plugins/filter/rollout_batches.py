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
  - With O(models), a batch also never takes the last servers of a model in the fleet; a unit that
    would leave a model with no server outside the batch starts the next batch instead (so the
    batch is smaller than O(serial) asks). The first unit of a batch is always taken, so a model
    that only one server has is out while that server restarts.
  - C(rollout_lone_models) (hosts, models) names those, each model whose one server is among the
    rolled hosts, with that server. C(rollout_served_models) (hosts, hostvars) gives O(models) for
    the fleet's hosts, from the serve role's C(spark_serve.model), else the inventory's
    C(serve_served_model_name) or C(spark_model_name), and for a host with C(spark_models) the list
    of its models' names; a pair's worker and a host without any are left out.
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
  models:
    description:
      - The model each serving host of the whole fleet serves (host name -> served model name; of a
        pair, its head only; a Spark with several models, the list of their names), the play's hosts
        and those outside it. Omitted or null, no model is looked at.
    type: dict
    required: false
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Batches of the rollout
  ansible.builtin.debug:
    msg: "{{ ansible_play_hosts | sparkops.appliance.rollout_batches(hostvars, groups, [1, '25%']) }}"

- name: Batches that keep a server of every model outside each batch
  ansible.builtin.debug:
    msg: >-
      {{ ansible_play_hosts | sparkops.appliance.rollout_batches(hostvars, groups, [1, 2],
                                                                 models={'spark-01': 'chat', 'spark-02': 'chat'}) }}
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


def _models_of(served):
    """A host's served models: one name, or a list (a Spark with several models)."""
    return list(served) if isinstance(served, (list, tuple)) else [served]


def _servers_per_model(hosts, models):
    """{model: number of `hosts` that serve it}."""
    count = {}
    for host in hosts:
        for model in _models_of(models[host]) if host in models else []:
            count[model] = count.get(model, 0) + 1
    return count


def _leaves_a_server(batch, unit, models, totals):
    """Whether every model of `unit` keeps a server outside `batch` + `unit`, or is one that
    `unit` alone serves (out while it restarts, in whichever batch)."""
    taken = _servers_per_model(batch + unit, models)
    own = _servers_per_model(unit, models)
    return all(taken[m] < totals[m] or own[m] == totals[m] for m in own)


def rollout_batches(hosts, hostvars, groups, serial, models=None):
    """Hosts -> batches of whole units, sized like Ansible's serial; with `models`, a batch never
    takes the last servers of a model unless its first unit alone does."""
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
    models = dict(models or {})
    totals = _servers_per_model(models, models)
    sizes = batch_sizes(serial, len(hosts))
    batches, index = [], 0
    while index < len(order):
        size = sizes[min(len(batches), len(sizes) - 1)]
        batch = list(units[order[index]])
        index += 1
        while (index < len(order) and len(batch) + len(units[order[index]]) <= size
               and _leaves_a_server(batch, units[order[index]], models, totals)):
            batch.extend(units[order[index]])
            index += 1
        batches.append(batch)
    return batches


def rollout_served_models(hosts, hostvars):
    """{host: model} for the serving hosts among `hosts` (a pair's worker serves nothing): the
    host fact spark_serve's model where the serve role noted it in this run, else the inventory's
    serve_served_model_name or spark_model_name; a host with none of them is left out (not counted
    as a server that stays in rotation). A host with spark_models serves each of its models: their
    names, in a list (rollout.yml restarts them one after the other, each a server of its model)."""
    out = {}
    for host in hosts:
        hv = hostvars[host] if host in hostvars else {}
        if (hv.get("cluster_role") or "") == "worker":
            continue
        if hv.get("spark_models"):
            names = [str(entry["name"]) for entry in hv["spark_models"]
                     if isinstance(entry, dict) and entry.get("name")]
            if names:
                out[host] = names
            continue
        serve = hv.get("spark_serve")
        model = serve.get("model") if isinstance(serve, dict) else None
        model = model or hv.get("serve_served_model_name") or hv.get("spark_model_name")
        if model:
            out[host] = str(model)
    return out


def rollout_lone_models(hosts, models):
    """{model: [its one server]} of the models that have one server (a host, a pair's head) and
    whose server is among the rolled `hosts`: those no batch can keep serving."""
    models = dict(models or {})
    hosts = set(hosts)
    out = {}
    for model in sorted(set(m for served in models.values() for m in _models_of(served))):
        servers = sorted(h for h, served in models.items() if model in _models_of(served))
        if len(servers) == 1 and servers[0] in hosts:
            out[model] = servers
    return out


class FilterModule(object):
    """sparkops.appliance.rollout_batches"""

    def filters(self):
        return {"rollout_batches": rollout_batches, "rollout_served_models": rollout_served_models,
                "rollout_lone_models": rollout_lone_models}
