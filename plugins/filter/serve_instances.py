# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.serve_instances: the servers of one host, each with its own unit, container
and port (one per entry of spark_models, or the host's one server)."""

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
  description: "[{name, priority, port, unit, container}]; unit without .service, port none for the one server of a host without spark_models."
  type: list
  elements: dict
"""

import re

from ansible.errors import AnsibleFilterError

_NAME_OK = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_BASE_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def serve_instances(models, unit, container, order="start"):
    for what, value in (("unit", unit), ("container", container)):
        if not isinstance(value, str) or not _BASE_OK.match(value):
            raise AnsibleFilterError("serve_instances: %s is %r: give spark_serve_%s_name, a name of letters, digits, "
                                     "'.', '_' and '-'" % (what, value, what))
    if order not in ("start", "stop"):
        raise AnsibleFilterError("serve_instances: order is %r: give start or stop" % (order,))
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
    if order == "stop":
        out.sort(key=lambda item: item["priority"])
    return out


class FilterModule(object):
    def filters(self):
        return {"serve_instances": serve_instances}
