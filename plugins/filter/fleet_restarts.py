# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.fleet_restarts: the servers serving now that a run would restart, and why."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: fleet_restarts
short_description: The servers serving now that a run would restart, each with the reasons
version_added: 0.1.0
description:
  - Takes one forecast per host of the play (roles/preflight/tasks/restarts.yml builds them) and returns
    the servers that serve now and that something of this run restarts, in the order of the input.
  - A server is a single Spark's or a pair's head's (a worker runs none). What restarts a pair's worker
    (Docker, a reboot, its Ray node) stops its head's server too, so the worker's reasons count against
    the head's server of the same O(cluster_name), each prefixed with the worker's name.
options:
  _input:
    description:
      - One dict per host, with C(host), C(cluster_name), C(cluster_role) (C(""), C(head) or C(worker)),
        C(serving) (bool, the server serves now; ignored on a worker) and C(reasons) (a list of strings).
    type: list
    elements: dict
    required: true
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: The servers this run would restart
  ansible.builtin.debug:
    msg: "{{ ansible_play_hosts | map('extract', hostvars, '__preflight_forecast') | list | sparkops.appliance.fleet_restarts }}"
"""

RETURN = r"""
_value:
  description: C([{host, reasons, text}]), one per server that serves now and would restart; C(text) is
    C(host (reason; reason)) for a message.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError

KEYS = ("host", "cluster_name", "cluster_role", "serving", "reasons")


def check(forecast):
    if not isinstance(forecast, dict) or any(key not in forecast for key in KEYS):
        raise AnsibleFilterError("fleet_restarts: each forecast needs the keys %s, got %r" % (", ".join(KEYS), forecast))
    if not isinstance(forecast["reasons"], list):
        raise AnsibleFilterError("fleet_restarts: reasons of %s must be a list, got %r" % (forecast["host"], forecast["reasons"]))
    if forecast["cluster_role"] not in ("", "head", "worker"):
        raise AnsibleFilterError("fleet_restarts: cluster_role of %s must be '', head or worker, got %r"
                                 % (forecast["host"], forecast["cluster_role"]))
    return forecast


def fleet_restarts(forecasts):
    if not isinstance(forecasts, list):
        raise AnsibleFilterError("fleet_restarts: expects a list of forecasts, got %r" % (forecasts,))
    forecasts = [check(forecast) for forecast in forecasts]
    workers = {}
    for forecast in forecasts:
        if forecast["cluster_role"] == "worker":
            workers.setdefault(forecast["cluster_name"], []).append(forecast)
    out = []
    for forecast in forecasts:
        if forecast["cluster_role"] == "worker" or not forecast["serving"]:
            continue
        reasons = [str(reason) for reason in forecast["reasons"]]
        if forecast["cluster_role"] == "head":
            for worker in workers.get(forecast["cluster_name"], []):
                reasons += ["its worker %s: %s" % (worker["host"], reason) for reason in worker["reasons"]]
        if reasons:
            out.append({"host": forecast["host"], "reasons": reasons,
                        "text": "%s (%s)" % (forecast["host"], "; ".join(reasons))})
    return out


class FilterModule(object):
    def filters(self):
        return {"fleet_restarts": fleet_restarts}
