# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.serve_instances: the servers of one host, each with its own unit, container
and port (one per entry of spark_models, or the host's one server); serve_stale_instances: the
servers an earlier run made on the host that the inventory no longer names, with their files."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: serve_instances
short_description: The servers of one host, each with the names of its unit and container
version_added: 0.1.0
description:
  - One source of the names that the serve, memwatch, status and monitoring roles give to a host's
    servers, so that each acts on the same unit and container.
  - O(_input) is the host's C(spark_models). Empty (the default) means one server, named by
    O(unit) and O(container) as they are, its C(name) empty and its C(priority) 0.
  - Otherwise each model gets the unit C(<unit>-<name>) and the container C(<container>-<name>),
    in the order given (the order the serve role starts them in).
  - O(order) C(stop) gives them lowest C(priority) first instead, the order memwatch stops them in.
  - C(serve_stale_instances) (record, instances, unit, container, dirs) gives the servers of the
    collection's ownership record (C(record), the paths it wrote on the host) that O(_input)'s
    C(instances) no longer hold, a renamed or removed model or the one server of a host that now
    serves several, each with C(name), C(unit), C(container), C(files) and C(dirs), the paths the
    serve role makes for it under the folders of C(dirs) (config, state, liveness, textfile,
    report, cache). A server is one whose unit file and container environment file are both in the
    record; nothing else on the host is named.
  - C(serve_claims) (instances, config_dir, report_path, cache_dir) gives the names the serve role
    takes on the host for each of O(_input)'s C(instances), as claims for preflight's name checks
    (the filter C(name_clashes) and the module C(spark_facts)); a model's are named by C(spark_models).
options:
  _input:
    description: The host's C(spark_models) (each with its C(name), C(priority) and C(port)).
    type: list
    elements: dict
    required: true
  unit:
    description: C(spark_serve_unit_name), without C(.service).
    type: str
    required: true
  container:
    description: C(spark_serve_container_name).
    type: str
    required: true
  order:
    description: C(start) (as given) or C(stop) (lowest priority first).
    type: str
    default: start
  agent_port:
    description:
      - C(serve_agent_port), the gateway's agent check port of the one server. Given, each server also
        gets its C(agent_port), this plus its place in O(_input) (the first model's is this one).
    type: int
    required: false
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Each server's unit
  ansible.builtin.debug:
    msg: "{{ spark_models | sparkops.appliance.serve_instances(unit=spark_serve_unit_name, container=spark_serve_container_name) }}"
"""

RETURN = r"""
_value:
  description: >-
    [{name, priority, port, unit, container}], and agent_port where O(agent_port) is given; unit without
    .service, port none for the one server of a host without spark_models.
  type: list
  elements: dict
"""

import re

from ansible.errors import AnsibleFilterError

_NAME_OK = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_BASE_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _check_base(unit, container):
    for what, value in (("unit", unit), ("container", container)):
        if not isinstance(value, str) or not _BASE_OK.match(value):
            raise AnsibleFilterError("serve_instances: %s is %r: give spark_serve_%s_name, a name of letters, digits, "
                                     "'.', '_' and '-'" % (what, value, what))


def serve_instances(models, unit, container, order="start", agent_port=None):
    _check_base(unit, container)
    if order not in ("start", "stop"):
        raise AnsibleFilterError("serve_instances: order is %r: give start or stop" % (order,))
    if agent_port is not None:
        try:
            agent_port = int(agent_port)
        except (TypeError, ValueError):
            raise AnsibleFilterError("serve_instances: agent_port is %r: give serve_agent_port, a port number"
                                     % (agent_port,))
    out = _instances(models, unit, container)
    if agent_port is not None:
        for place, item in enumerate(out):
            item["agent_port"] = agent_port + place
    if order == "stop":
        out.sort(key=lambda item: item["priority"])
    return out


def _instances(models, unit, container):
    """The servers in the order of `models` (the one server where there is none)."""
    if models is None or models == []:
        return [{"name": "", "priority": 0, "port": None, "unit": unit, "container": container}]
    if not isinstance(models, list):
        raise AnsibleFilterError("serve_instances: spark_models is %r: give a list of models" % (models,))
    out, seen = [], set()
    for i, model in enumerate(models):
        name = model.get("name") if isinstance(model, dict) else None
        if not isinstance(name, str) or not _NAME_OK.match(name) or name in seen:
            raise AnsibleFilterError("serve_instances: spark_models[%d].name is %r: give each model a name of its own "
                                     "([a-z0-9][a-z0-9._-]*)" % (i, name))
        seen.add(name)
        priority = model.get("priority")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise AnsibleFilterError("serve_instances: spark_models[%d].priority is %r: give a whole number"
                                     % (i, priority))
        out.append({"name": name, "priority": priority, "port": model.get("port"),
                    "unit": "%s-%s" % (unit, name), "container": "%s-%s" % (container, name)})
    return out


_DIRS = ("config", "state", "liveness", "textfile", "report", "cache")
_UNIT_DIR = "/etc/systemd/system"
# A server's systemd units besides its own (roles/serve/vars/main.yml: the recycle units, the agent
# socket), and the files that are not units: the recycle script and the agent's template unit (systemd
# shows no properties of a template without an instance).
_UNIT_TAILS = (".service", "-recycle.service", "-recycle.timer", "-agent.socket")


def _unit_files(unit):
    """The recycle script's and the agent template unit's paths of one server."""
    return ["/usr/local/sbin/%s-recycle" % unit, "%s/%s-agent@.service" % (_UNIT_DIR, unit)]


def _instance_paths(name, unit, dirs):
    """The files and folders the serve role makes for one server (roles/serve/vars/main.yml,
    tasks/models.yml), whatever of them exists."""
    files = ["%s/%s%s" % (_UNIT_DIR, unit, tail) for tail in _UNIT_TAILS] + _unit_files(unit)
    files += ["%s/%s%s" % (dirs["config"], unit, tail) for tail in (
        ".env", ".env.previous", ".env.good", ".service.previous", ".service.good", ".good.json", ".rollout.json")]
    files += ["%s/%s.service.args-checked" % (dirs["state"], unit), "%s/%s.service.kv-spec" % (dirs["state"], unit),
              "%s/%s-liveness.prom" % (dirs["textfile"], unit)]
    folders = ["%s/%s-liveness" % (dirs["liveness"], unit)]
    if name:        # a model's own report and cache (tasks/models.yml); the one server's are shared paths
        files.append("%s/%s-plan-vs-actual.json" % (dirs["report"], unit))
        folders.append("%s/%s" % (dirs["cache"], name))
    return files, folders


def serve_stale_instances(record, instances, unit, container, dirs):
    _check_base(unit, container)
    bad = not isinstance(dirs, dict) or any(not isinstance(dirs.get(k), str) or not dirs[k].startswith("/") for k in _DIRS)
    if bad:
        raise AnsibleFilterError("serve_stale_instances: dirs is %r: give an absolute path for each of %s"
                                 % (dirs, ", ".join(_DIRS)))
    paths = set(p for p in (record or []) if isinstance(p, str))
    current = set(i["unit"] for i in instances)
    stale = []
    for path in sorted(paths):
        match = re.match(r"^%s/(%s(?:-([a-z0-9][a-z0-9._-]*))?)\.service$" % (_UNIT_DIR, re.escape(unit)), path)
        if not match or match.group(1) in current:
            continue
        found, name = match.group(1), match.group(2) or ""
        if "%s/%s.env" % (dirs["config"], found) not in paths:
            continue        # not a server's unit (a recycle or agent unit has no environment file)
        files, folders = _instance_paths(name, found, dirs)
        stale.append({"name": name, "unit": found, "container": "%s-%s" % (container, name) if name else container,
                      "files": files, "dirs": folders})
    return stale


def serve_claims(instances, config_dir, report_path, cache_dir):
    """preflight's claims (plugins/module_utils/_owned.py) of each server's unit, recycle and agent
    units, container, environment file, report and cache folder."""
    claims = [{"var": "serve_config_dir", "value": config_dir, "kind": "directory", "name": config_dir, "mode": "0755"}]
    report_dir = report_path.rsplit("/", 1)[0] or "/"
    if any(not i["name"] for i in instances):
        claims += [{"var": "serve_report_path", "value": report_path, "kind": "file", "name": report_path}]
    claims += [{"var": "serve_report_path", "value": report_path, "kind": "directory", "name": report_dir, "mode": "0755"},
               {"var": "serve_cache_dir", "value": cache_dir, "kind": "directory", "name": cache_dir, "mode": "0755"}]
    for i in instances:
        unit = i["unit"]
        var, value = ("spark_models", i["name"]) if i["name"] else ("spark_serve_unit_name", unit)
        cvar, cvalue = ("spark_models", i["name"]) if i["name"] else ("spark_serve_container_name", i["container"])
        claims += [{"var": var, "value": value, "kind": "unit", "name": unit + tail} for tail in _UNIT_TAILS]
        claims += [{"var": var, "value": value, "kind": "file", "name": path} for path in _unit_files(unit)]
        claims += [{"var": cvar, "value": cvalue, "kind": "container", "name": i["container"], "label": unit,
                    "unit_file": "%s/%s.service" % (_UNIT_DIR, unit)},
                   {"var": var if i["name"] else "serve_config_dir", "value": value if i["name"] else config_dir,
                    "kind": "file", "name": "%s/%s.env" % (config_dir, unit)}]
        if i["name"]:
            claims += [{"var": var, "value": value, "kind": "file", "name": "%s/%s-plan-vs-actual.json" % (report_dir, unit)},
                       {"var": var, "value": value, "kind": "directory", "name": "%s/%s" % (cache_dir, i["name"]),
                        "mode": "0755"}]
    return claims


class FilterModule(object):
    def filters(self):
        return {"serve_instances": serve_instances, "serve_stale_instances": serve_stale_instances,
                "serve_claims": serve_claims}
