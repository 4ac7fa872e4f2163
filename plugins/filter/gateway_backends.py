# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.gateway_backends and gateway_backend_name: the gateway's backends (one per
served model) from the serving hosts' spark_serve facts."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: gateway_backends
short_description: The gateway's backends, one per served model, from the serving hosts' spark_serve facts
version_added: 0.1.0
description:
  - Every host of O(_input) with a C(spark_serve) fact (the serve role's export) and no
    C(cluster_role) of C(worker) (a pair's worker runs no server; its head serves the pair) is a
    server of the backend of its served model (C(spark_serve.model)), in the order given. A host
    with C(spark_models) is a server in each of its models' backends, from its C(spark_serve_models).
  - Returns C(backends) (each with C(name), C(model), C(api_key) and C(servers)), C(skipped) (hosts
    without C(spark_serve), with why) and C(problems), messages naming the variable and the fix, for
    two servers of one model with different API keys (the gateway sends one key per backend), two
    models whose backend names are the same, and a server address, name, key or model the HAProxy
    configuration cannot hold.
  - C(gateway_backend_name) gives the backend's name for one model (the rollout drains through it).
  - C(gateway_moves) (installed, hosts, hostvars) reads each gateway's installed configuration
    (C(installed) maps each gateway to its haproxy.cfg text, or none where it has none yet) and returns, for
    rollout.yml's first play, a message for each of O(_input)'s serving hosts that a rollout cannot
    drain and return, one the gateway does not list as a server, or lists in another model's backend
    than its C(spark_serve.model) (a change of the served model moves it between backends).
options:
  _input:
    description: The inventory names of the hosts the gateway routes to (normally C(groups['sparks'])).
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars).
    type: dict
    required: true
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: The backends
  ansible.builtin.debug:
    msg: "{{ groups['sparks'] | sparkops.appliance.gateway_backends(hostvars) }}"
"""

RETURN = r"""
_value:
  description: "{backends: [{name, model, api_key, servers: [{name, host, port, agent_port}]}], skipped: [str], problems: [str]}"
  type: dict
"""

import re

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.converters import to_text

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.:-]")
# what a model name may hold in HAProxy's map file (one key per line, split at whitespace) and in
# its JSON answers: printable, no whitespace, no quote or backslash
_MODEL_OK = re.compile(r"^[!#-\[\]-~]+$")
_HOST_OK = re.compile(r"^[A-Za-z0-9_.:\[\]-]+$")
# what the gateway can send as a bearer token in its configuration (a header value it formats)
_KEY_OK = re.compile(r"^[A-Za-z0-9._~+/=-]*$")


def gateway_backend_name(model):
    """The backend of a served model: `model_` and the name, every character HAProxy does not take
    in a proxy name made `_`."""
    if not isinstance(model, str) or not model:
        raise AnsibleFilterError("gateway_backend_name: a served model name (a non-empty string) is needed, got %r" % (model,))
    return "model_" + _NAME_BAD.sub("_", model)


def _add_server(host, serve, backends, skipped, problems):
    """One server (a host's spark_serve, or one model's of its spark_serve_models) in its model's backend."""
    if not isinstance(serve, dict) or not isinstance(serve.get("gateway"), dict):
        skipped.append("%s: no spark_serve fact (the serve role's facts did not run there)" % host)
        return
    model, gw = to_text(serve.get("model", "")), serve["gateway"]
    if not _MODEL_OK.match(model):
        problems.append(
            "serve_served_model_name = %r on %s: the gateway routes by it and cannot hold whitespace, "
            "quotes or backslashes in it. Fix: a name of printable characters without them." % (model, host))
        return
    address = to_text(gw.get("host", ""))
    if not _HOST_OK.match(address):
        problems.append("serve_gateway_host = %r on %s: not a host name or an address. Fix: the address the gateway "
                        "reaches the server at." % (address, host))
        return
    if _NAME_BAD.search(host):
        problems.append("%r: the gateway names its servers by inventory name, and HAProxy takes only letters, digits "
                        "and _ . : - in one. Fix: rename the host in the inventory." % host)
        return
    if not _KEY_OK.match(to_text(serve.get("api_key") or "")):
        problems.append("serve_api_key on %s: the gateway sends it on and takes only letters, digits and . _ ~ + / = - "
                        "in it. Fix: a key of those characters (a random hex or base64 string)." % host)
        return
    backend = backends.setdefault(model, {"name": gateway_backend_name(model), "model": model,
                                          "api_key": to_text(serve.get("api_key") or ""), "servers": [],
                                          "key_from": host})
    key = to_text(serve.get("api_key") or "")
    if key != backend["api_key"]:
        problems.append(
            "serve_api_key differs between %s and %s, which serve the same model %r: the gateway sends one key per "
            "model. Fix: give the servers of one model the same vaulted key." % (backend["key_from"], host, model))
    backend["servers"].append({"name": host, "host": address, "port": int(gw.get("port", 0)),
                               "agent_port": int(gw.get("agent_port", 0) or 0)})


def gateway_backends(hosts, hostvars):
    if not isinstance(hosts, (list, tuple)):
        raise AnsibleFilterError("gateway_backends: a list of inventory names is needed, got %r" % (hosts,))
    backends, skipped, problems = {}, [], []
    for host in hosts:
        host = to_text(host)
        hv = hostvars[host] if host in hostvars else {}
        if (hv.get("cluster_role") or "") == "worker":
            continue
        # a Spark with several models (spark_models): a server in each model's backend
        if hv.get("spark_models"):
            served = hv.get("spark_serve_models")
            servers = served if isinstance(served, list) and served else [None]
        else:
            servers = [hv.get("spark_serve")]
        for serve in servers:
            _add_server(host, serve, backends, skipped, problems)
    names = {}
    for backend in backends.values():
        other = names.setdefault(backend["name"], backend["model"])
        if other != backend["model"]:
            problems.append(
                "serve_served_model_name: %r and %r give the same gateway backend %s. Fix: names that differ in more "
                "than the characters outside A-Z a-z 0-9 _ . : -." % (other, backend["model"], backend["name"]))
    out = []
    for backend in backends.values():
        backend = dict(backend)
        backend.pop("key_from")
        out.append(backend)
    return {"backends": out, "skipped": skipped, "problems": problems}


_SECTION = re.compile(r"^(backend|frontend|listen|defaults|global|peers|resolvers|userlist|cache|program|http-errors|ring)\s+(\S+)?")
_SERVER = re.compile(r"^\s+server\s+(\S+)\s")


def installed_servers(text):
    """{server name: [backends]} of a haproxy.cfg's text."""
    out, backend = {}, None
    for line in (text or "").splitlines():
        section = _SECTION.match(line)
        if section:
            backend = section.group(2) if section.group(1) == "backend" else None
            continue
        server = _SERVER.match(line)
        if server and backend:
            out.setdefault(server.group(1), []).append(backend)
    return out


def gateway_moves(installed, hosts, hostvars):
    """Messages for the serving `hosts` whose server the gateways cannot drain and return as they
    are configured (see DOCUMENTATION)."""
    problems = []
    for gateway in sorted(installed or {}):
        text = installed[gateway]
        if text is None:
            continue
        servers = installed_servers(to_text(text))
        for host in hosts:
            hv = hostvars[host] if host in hostvars else {}
            serve = hv.get("spark_serve")
            # a worker serves nothing; a Spark with several models is not rolled (rollout.yml leaves it out)
            if ((hv.get("cluster_role") or "") == "worker" or hv.get("spark_models") or not isinstance(serve, dict)
                    or not serve.get("model")):
                continue
            want = gateway_backend_name(to_text(serve["model"]))
            have = servers.get(host, [])
            if want in have:
                continue
            if have:
                problems.append(
                    "%s: the gateway %s routes it as %s, and this run would serve it as %s (serve_served_model_name): "
                    "a rollout drains and returns a server in its own model's backend, it does not move it to "
                    "another. Fix: move it with site.yml --tags serve,gateway (its server restarts once, the "
                    "gateway is rendered again; docs/gateway.md#another-model-on-a-server), or keep its model."
                    % (host, gateway, ", ".join(have), to_text(serve["model"])))
            else:
                problems.append(
                    "%s: not a server of the gateway %s yet, which a rollout drains it through. Fix: run site.yml "
                    "(or --tags serve,gateway) once with the host in the inventory, then roll." % (host, gateway))
    return problems


class FilterModule(object):
    def filters(self):
        return {"gateway_backends": gateway_backends, "gateway_backend_name": gateway_backend_name,
                "gateway_moves": gateway_moves}
