# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway role's HAProxy configuration, run by a real HAProxy (Debian's package; `make deps`
installs it): the files are the role's own (its vars, rendered by Ansible from the serving hosts'
spark_serve facts, checked by `haproxy -c` in the files module), the servers stand-in vLLMs on
loopback, the agents stand-in agent checks answering what serve-unit's `agent` answers. What is
asserted, through the gateway: routing by the request's model to that model's servers with the
servers' key (never the client's), an unknown model's JSON 404, a missing or wrong client key's JSON
401, /v1/models, a server whose agent says `down` leaving rotation while its /health answers 200, and
the rollout's drain and return through the role's balancer tasks (community.general.haproxy over the
runtime API). The gateway's bad inputs are refused with the variable named."""
import csv
import http.server
import json
import os
import re
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import harness
from ansible_collections.sparkops.appliance.plugins.filter.gateway_backends import gateway_moves

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = pytest.mark.skipif(not os.path.exists(HAPROXY), reason="no haproxy here: `make deps` installs Debian's")

CLIENT_KEY = "client-key-0123456789abcdef"
SERVER_KEY = "server-key-abcdef0123456789"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandIn:
    """A stand-in vLLM: /health 200, POST answers with its name, the Authorization it got, the body."""

    def __init__(self, name):
        me = self
        self.name, self.seen = name, []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):      # pylint: disable=arguments-differ
                pass

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):                  # pylint: disable=invalid-name
                self._send(200, {"path": self.path})

            def do_POST(self):                 # pylint: disable=invalid-name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                me.seen.append(self.headers.get("Authorization"))
                self._send(200, {"server": me.name, "auth": self.headers.get("Authorization"), "model": body.get("model")})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class Agent:
    """A stand-in agent check: one line per connection, `word` (what serve-unit's agent says)."""

    def __init__(self):
        me = self
        self.word = "up #live"

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                self.wfile.write((me.word + "\n").encode())

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


PLAY = """
- name: The serving hosts note how a gateway reaches them (as serve's facts do)
  hosts: sparks
  gather_facts: false
  tasks:
    - name: spark_serve
      ansible.builtin.set_fact:
        spark_serve: {model: "{{ served_model }}", api_key: "%(server_key)s",
                      gateway: {host: 127.0.0.1, port: "{{ served_port | int }}", agent_port: "{{ served_agent_port | int }}"}}

- name: The gateway's files, as the role renders and checks them
  hosts: gateways
  gather_facts: false
  module_defaults:
    sparkops.appliance.files:
      record: ""       # no ownership record on this machine
  tasks:
    - name: Check the inputs
      ansible.builtin.include_role:
        name: sparkops.appliance.gateway
        tasks_from: validate
    - name: Write the configuration (haproxy -c in the files module)
      ansible.builtin.include_role:
        name: sparkops.appliance.gateway
        tasks_from: config
"""

BALANCER = """
- name: A serving host leaves or rejoins the gateway, as the rollout does it
  hosts: "{{ target }}"
  gather_facts: false
  tasks:
    - name: spark_serve
      ansible.builtin.set_fact:
        spark_serve: {model: "{{ served_model }}"}
    - name: balancer
      ansible.builtin.include_role:
        name: sparkops.appliance.gateway
        tasks_from: balancer
      vars:
        rollout_lb_action: "{{ action }}"
"""


@pytest.fixture(name="fleet", scope="module")
def fleet_fixture(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway")
    servers = {name: StandIn(name) for name in ("spark-a", "spark-b", "spark-c")}
    agents = {name: Agent() for name in servers}
    models = {"spark-a": "tiny-llama", "spark-b": "tiny-llama", "spark-c": "org/other-model"}
    port, stats_port = free_port(), free_port()
    # the runtime API is /run/<unit>/admin.sock (systemd's RuntimeDirectory on a gateway): a unit
    # name of this test's own, its folder made here
    unit = "sparkops-gateway-test-%d" % os.getpid()
    os.makedirs("/run/" + unit, exist_ok=True)
    config_dir = tmp / "etc"
    gateway_vars = {"gateway_config_dir": str(config_dir), "gateway_port": port, "gateway_bind_address": "127.0.0.1",
                    "gateway_stats_address": "127.0.0.1", "gateway_stats_port": stats_port,
                    "spark_gateway_unit_name": unit, "gateway_client_api_keys": [CLIENT_KEY],
                    "gateway_check_inter_s": 1, "gateway_agent_inter_s": 1, "gateway_check_fall": 2, "gateway_check_rise": 1}
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"children": {
        "sparks": {"hosts": {name: dict(local, served_model=models[name], served_port=servers[name].port,
                                        served_agent_port=agents[name].port) for name in servers}},
        "gateways": {"hosts": {"gw": dict(local, **gateway_vars)}}}}}
    inv = tmp / "inventory.json"
    inv.write_text(json.dumps(inventory))
    playbook = tmp / "render.yml"
    playbook.write_text(PLAY % {"server_key": SERVER_KEY})
    proc = harness.run_playbook(playbook, inventory=inv, connection=None, env=harness.ansible_env(stdout_callback=None),
                                extra_vars={"__gateway_unit_path": str(tmp / "sparkops-gateway.service")})
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    config = config_dir / "haproxy.cfg"
    # the role's configuration as it is, but for what a test process cannot do: drop to the
    # haproxy user in its chroot (the files under tmp are root's), log to stdout
    text = config.read_text().replace("    chroot /var/lib/haproxy\n", "").replace("    user haproxy\n", "").replace("    group haproxy\n", "")
    run_config = tmp / "run.cfg"
    run_config.write_text(text)
    log = open(tmp / "haproxy.log", "w")   # pylint: disable=consider-using-with
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(run_config)], stdout=log, stderr=subprocess.STDOUT)
    box = {"tmp": tmp, "inv": inv, "servers": servers, "agents": agents, "port": port, "stats_port": stats_port,
           "config": config.read_text(), "proc": proc, "base": "http://127.0.0.1:%d" % port}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rows = stats(box)
        if len(rows) == 3 and all(r["status"] == "UP" for r in rows.values()):
            break
        time.sleep(0.3)
    else:
        raise AssertionError("the gateway's servers are not UP: %s\n%s" % (
            {k: r["status"] for k, r in stats(box).items()}, (tmp / "haproxy.log").read_text()[-3000:]))
    yield box
    proc.terminate()
    proc.wait(timeout=10)
    log.close()
    shutil.rmtree("/run/" + unit, ignore_errors=True)


def stats(box):
    """{backend/server: row} from the stats page's CSV."""
    try:
        with _NO_PROXY.open("http://127.0.0.1:%d/stats;csv" % box["stats_port"], timeout=5) as resp:
            rows = csv.DictReader(resp.read().decode().lstrip("# ").splitlines())
            return {"%s/%s" % (r["pxname"], r["svname"]): r for r in rows if r["svname"] not in ("FRONTEND", "BACKEND")}
    except OSError:
        return {}


def call(box, body=None, key=CLIENT_KEY, path="/v1/completions"):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(box["base"] + path, data=data, headers=headers)
    try:
        with _NO_PROXY.open(req, timeout=10) as resp:
            body = json.loads(resp.read())
            if isinstance(body, dict) and "server" in body:     # the gateway names the server that answered
                assert resp.headers["X-Sparkops-Server"] == body["server"], dict(resp.headers)
            return resp.status, body
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_status(box, server, want, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = stats(box).get(server, {}).get("status", "")
        if status.startswith(want):
            return status
        time.sleep(0.3)
    return stats(box).get(server, {}).get("status", "")


def test_requests_go_to_the_servers_of_their_model_with_the_servers_key(fleet):
    seen = set()
    for _n in range(8):
        status, body = call(fleet, {"model": "tiny-llama", "prompt": "x"})
        assert status == 200 and body["model"] == "tiny-llama", body
        assert body["auth"] == "Bearer " + SERVER_KEY    # the servers' key, never the client's
        seen.add(body["server"])
    assert seen == {"spark-a", "spark-b"}
    status, body = call(fleet, {"model": "org/other-model", "prompt": "x"})
    assert status == 200 and body["server"] == "spark-c"
    assert "backend model_org_other-model" in fleet["config"]


def test_an_unknown_model_gets_a_json_404_and_a_bad_key_a_json_401(fleet):
    status, body = call(fleet, {"model": "no\"such", "prompt": "x"})
    assert status == 404 and body["error"]["type"] == "NotFoundError" and 'no"such' in body["error"]["message"], body
    for key in ("", "wrong-key-0123456789abcdef"):
        status, body = call(fleet, {"model": "tiny-llama"}, key=key)
        assert status == 401 and body["error"]["code"] == 401, body
    assert not any(s.seen.count("Bearer wrong-key-0123456789abcdef") for s in fleet["servers"].values())


def test_v1_models_lists_the_fleets_models(fleet):
    status, body = call(fleet, path="/v1/models")
    assert status == 200 and sorted(m["id"] for m in body["data"]) == ["org/other-model", "tiny-llama"], body


def test_a_server_whose_agent_says_down_leaves_rotation_though_its_health_answers(fleet):
    agent = fleet["agents"]["spark-a"]
    agent.word = "down #liveness: stalled (no progress)"
    try:
        assert wait_status(fleet, "model_tiny-llama/spark-a", "DOWN").startswith("DOWN")
        before = len(fleet["servers"]["spark-a"].seen)
        for _n in range(6):
            status, body = call(fleet, {"model": "tiny-llama", "prompt": "x"})
            assert status == 200 and body["server"] == "spark-b", body
        assert len(fleet["servers"]["spark-a"].seen) == before
    finally:
        agent.word = "up #live"
    assert wait_status(fleet, "model_tiny-llama/spark-a", "UP") == "UP"


def active_servers(box):
    """{backend: haproxy_backend_active_servers} from the gateway's Prometheus endpoint, the series
    the monitoring role's SparkGatewayModelWithoutServer alert reads."""
    with _NO_PROXY.open("http://127.0.0.1:%d/metrics" % box["stats_port"], timeout=5) as resp:
        text = resp.read().decode()
    return {proxy: float(value) for proxy, value
            in re.findall(r'^haproxy_backend_active_servers\{proxy="([^"]+)"\} (\S+)$', text, re.M)}


def test_a_model_whose_only_server_is_down_shows_no_active_server_on_the_metrics(fleet):
    assert active_servers(fleet)["model_org_other-model"] == 1 and active_servers(fleet)["model_tiny-llama"] == 2
    agent = fleet["agents"]["spark-c"]
    agent.word = "down #liveness: stalled (no progress)"
    try:
        assert wait_status(fleet, "model_org_other-model/spark-c", "DOWN").startswith("DOWN")
        assert active_servers(fleet)["model_org_other-model"] == 0
        status, body = call(fleet, {"model": "org/other-model", "prompt": "x"})
        assert status == 503 and body["error"]["type"] == "ServiceUnavailableError", body   # JSON, not HTML
    finally:
        agent.word = "up #live"
    assert wait_status(fleet, "model_org_other-model/spark-c", "UP") == "UP"


def test_a_server_moved_to_another_model_or_unknown_to_the_gateway_is_found_in_its_installed_configuration(fleet):
    """rollout.yml's first play refuses these (roles/gateway/tasks/servers.yml), read from the configuration
    the role rendered: a server whose model changes, a server the gateway does not list."""
    hosts = ["spark-a", "spark-b", "spark-c", "spark-new"]
    hostvars = {"spark-a": {"spark_serve": {"model": "tiny-llama"}}, "spark-b": {"spark_serve": {"model": "tiny-llama"}},
                "spark-c": {"spark_serve": {"model": "org/other-model"}}, "spark-new": {"cluster_role": "worker"}}
    assert gateway_moves({"gw": fleet["config"], "gw-2": None}, hosts, hostvars) == []
    hostvars["spark-b"] = {"spark_serve": {"model": "org/other-model"}}
    hostvars["spark-new"] = {"spark_serve": {"model": "tiny-llama"}}
    (moved, new) = gateway_moves({"gw": fleet["config"]}, hosts, hostvars)
    assert moved.startswith("spark-b: the gateway gw routes it as model_tiny-llama, and this run would serve it as "
                            "org/other-model (serve_served_model_name)") and "site.yml --tags serve,gateway" in moved, moved
    assert new.startswith("spark-new: not a server of the gateway gw yet"), new


def balancer(fleet, target, action, model):
    playbook = fleet["tmp"] / "balancer.yml"
    playbook.write_text(BALANCER)
    return harness.run_playbook(playbook, inventory=fleet["inv"], connection=None,
                                extra_vars={"target": target, "action": action, "served_model": model},
                                env=harness.ansible_env(stdout_callback=None))


def test_the_rollouts_drain_and_return_go_through_the_runtime_api(fleet):
    proc = balancer(fleet, "spark-b", "out", "tiny-llama")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert wait_status(fleet, "model_tiny-llama/spark-b", "DRAIN").startswith("DRAIN")
    for _n in range(6):
        status, body = call(fleet, {"model": "tiny-llama", "prompt": "x"})
        assert status == 200 and body["server"] == "spark-a", body
    proc = balancer(fleet, "spark-b", "in", "tiny-llama")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert stats(fleet)["model_tiny-llama/spark-b"]["status"] == "UP"


def test_the_configuration_check_refuses_a_broken_file(fleet, tmp_path):
    broken = tmp_path / "broken.cfg"
    broken.write_text(fleet["config"].replace("balance leastconn", "balance nosuchalgo", 1))
    proc = subprocess.run([HAPROXY, "-c", "-q", "-f", str(broken)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0


BAD = {
    "no-keys": ({"gateway_client_api_keys": []}, "gateway_client_api_keys"),
    "short-key": ({"gateway_client_api_keys": ["short"]}, "gateway_client_api_keys: 1 key(s)"),
    "stats-wildcard": ({"gateway_stats_address": "0.0.0.0"}, "gateway_stats_address"),
    "port": ({"gateway_port": 70000}, "gateway_port"),
    "stats-port": ({"gateway_stats_port": 8080}, "gateway_stats_port = 8080: the same as gateway_port"),
    "tls-missing": ({"gateway_tls_pem": "/nonexistent/gw.pem"}, "gateway_tls_pem"),
}


VALIDATE = """
- hosts: sparks
  gather_facts: false
  tasks:
    - ansible.builtin.set_fact:
        spark_serve: {model: m, api_key: "", gateway: {host: 127.0.0.1, port: 8000, agent_port: 0}}
      when: inventory_hostname in noted
- hosts: gateways
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: sparkops.appliance.gateway
        tasks_from: validate
"""


def validate(tmp_path, sparks, noted, gateways):
    """The gateway role's validate on local hosts: `sparks` (those in `noted` with a spark_serve fact)
    and `gateways` ({name: variables}); the JSON callback's document."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"children": {
        "sparks": {"hosts": {name: dict(local) for name in sparks}},
        "gateways": {"hosts": {name: dict(local, **values) for name, values in gateways.items()}}}}}
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps(inventory))
    playbook = tmp_path / "validate.yml"
    playbook.write_text(VALIDATE)
    return harness.play_json(playbook, inventory=inv, connection=None, extra_vars={"noted": noted})


def test_a_fleet_with_a_server_outside_the_run_is_refused(tmp_path):
    """A run limited to some Sparks (their spark_serve facts not noted) would render a gateway without
    the others: refused, naming them and the fix."""
    doc = validate(tmp_path, ["spark-a", "spark-b"], ["spark-a"], {"gw": {"gateway_client_api_keys": [CLIENT_KEY]}})
    failure = harness.host_failure(doc, "gw")
    assert failure and "spark-b: no spark_serve fact" in failure["msg"] and "--limit" in failure["msg"], failure


def test_bad_gateway_settings_are_refused_naming_the_variable(tmp_path):
    ok = {"gateway_client_api_keys": [CLIENT_KEY]}
    doc = validate(tmp_path, ["spark-a"], ["spark-a"], {name: dict(ok, **values) for name, (values, _m) in BAD.items()})
    for name, (_values, message) in BAD.items():
        failure = harness.host_failure(doc, name)
        assert failure and message in failure["msg"], (name, failure)
