# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster role (a TP=2 pair over Ray, SPEC §8): the example inventory's pair_a passes the
input checks as it is; a bad pair is refused with a message naming the variable and the host,
before any change; the Ray units and the head's serve unit render with every transport pinned to
the interconnect, the dashboard off, TP=2 over Ray and a bounded wait for both nodes; memwatch on
a worker stops the Ray unit.

One ansible-playbook start does it all (a module-scoped fixture; each test reads its own part):
plays that render every template variant the tests read (one task per variant, on the example
host it names, with that variant's values as task vars: above the role defaults and vars that the
play loads, as the -e of one start per variant was), then the input checks on the example
inventory's sparks and on a batch of bad pairs (each pair its own cluster_name, so the pairs do not
see each other), and a last play on the example's singles with a tensor-parallel plan. A bad value
that the input_problems lookup refuses from the pair's own values alone (meta/checks.yml) is checked
in this process instead (BAD_DATA); the play keeps the refusals of the role's tasks and of the data
that reads a default (BAD)."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml

from ansible_collections.sparkops.appliance.plugins.plugin_utils._role_inputs import (
    input_problems,
    load_role_checks,
    load_role_options,
)
from harness import ROOT, batch_inventory, host_results, play_json

EXAMPLE = os.path.join(ROOT, "inventories", "example")
EXAMPLE_SPARKS = ["spark-01", "spark-02", "spark-03", "spark-04", "spark-pa-head", "spark-pa-worker"]

VALIDATE_TASKS = """
    - name: Cluster validate
      ansible.builtin.include_role:
        name: sparkops.appliance.cluster
        tasks_from: validate
    - name: Serve validate (TP refusal lifted for pairs only)
      ansible.builtin.include_role:
        name: sparkops.appliance.serve
        tasks_from: validate
      vars:
        spark_memory_plan:
          gmu: 0.5
          kv_cache_memory_bytes: 1
          budget_bytes: 1
          docker_memory_gib: 1
          inputs: {tensor_parallel_size: "{{ memory_plan_tensor_parallel_size }}", max_model_len: 1,
                   max_num_seqs: 1, max_num_batched_tokens: 1, mtp_enabled: false, mtp_num_speculative_tokens: 0,
                   kv_cache_dtype: auto}
"""
# The singles' play: memory_plan_tensor_parallel_size 2 as play vars (above the inventory's 1, as
# the -e of a start of its own was; nothing between the two levels sets it: no vars_files, role
# vars, set_fact or include vars of these tasks do).
VALIDATE = """
- name: Validate
  hosts: sparks:cases
  gather_facts: false
  tasks:%(tasks)s
- name: Validate singles
  hosts: singles
  gather_facts: false
  vars:
    memory_plan_tensor_parallel_size: 2
  tasks:%(tasks)s
""" % {"tasks": VALIDATE_TASKS}

# Refused by the role's tasks as a play runs them: the argument spec of the validate entry point
# (Ansible's own message), validate_pair.yml (what reads the pair's other host and the plan), and a
# check of the data that reads a role default (cluster_container_model_path).
BAD = [
    ({"worker": {"cluster_role": "head"}}, "exactly one with cluster_role head"),
    ({"worker": {"cluster_role": "wrker"}}, "cluster_role must be one of: , head, worker, got: wrker"),
    ({"worker": {"spark_interconnect_ip": "10.10.0.1"}}, 'different on the two nodes'),
    ({"group": {"memory_plan_tensor_parallel_size": 1}}, "memory_plan_tensor_parallel_size must be 2"),
    # the serve role's data refuses the executor flags on a pair's hosts (its refuse_flags, when cluster_role)
    ({"group": {"serve_extra_args": ["--distributed-executor-backend", "uni"]}},
     'serve_extra_args = ["--distributed-executor-backend", "uni"]: --distributed-executor-backend is refused here'),
    ({"group": {"serve_container_model_path": "/srv/model"}},
     'cluster_container_model_path = "/model": not equal to serve_container_model_path ("/srv/model")'),
]
# Refused by the input_problems lookup from a value of the pair's own (meta/checks.yml of cluster and
# common): checked in this process, input_problems with the options and checks of the roles the two
# validate entry points ask for (cluster and common, serve and common), each case a pair's values.
BAD_DATA = [
    ({"worker": {"cluster_role": ""}}, 'cluster_role = "": not one of "head", "worker"'),
    ({"worker": {"spark_interconnect_ip": ""}}, 'spark_interconnect_ip = "": not an IPv4 address'),
    ({"worker": {"spark_interconnect_ip": "10.10.0.300"}}, 'spark_interconnect_ip = "10.10.0.300": not an IPv4 address'),
    ({"group": {"spark_interconnect_if": ""}}, 'spark_interconnect_if = "": not a network interface name'),
    ({"group": {"spark_ib_hca": "mlx5 0"}}, 'spark_ib_hca = "mlx5 0": not an NCCL_IB_HCA value'),
    # the Ray settings (meta/checks.yml), each its own message
    ({"group": {"spark_ray_port": 0}}, "spark_ray_port = 0: below 1"),
    ({"group": {"cluster_ray_ports": {"node_manager_port": 0, "gcs_port": 6390}}},
     'the value of "node_manager_port" (0) is not a port number from 1 to 65535'),
    ({"group": {"cluster_ray_ports": {"node-manager": 6380}}}, 'the key "node-manager" is not a name ending in _port'),
    ({"group": {"cluster_ray_object_store_bytes": 1000}}, "cluster_ray_object_store_bytes = 1000: below 78643200"),
    ({"group": {"cluster_join_timeout_s": 0}}, "cluster_join_timeout_s = 0: below 1"),
    ({"group": {"cluster_ipc": "hosts"}}, 'cluster_ipc = "hosts": not host, private, shareable, none or container:NAME'),
]
VALIDATE_ROLES = (("cluster", "common"), ("serve", "common"))


def pair_hosts(index, head=None, worker=None, group=None):
    """The hosts h<index> and w<index> of a pair of its own (cluster_name p<index>)."""
    hosts = {"h": {"cluster_role": "head", "spark_interconnect_ip": "10.10.0.1"},
             "w": {"cluster_role": "worker", "spark_interconnect_ip": "10.10.0.2"}}
    hosts["h"].update(head or {})
    hosts["w"].update(worker or {})
    group_vars = {"cluster_name": "p%d" % index, "memory_plan_tensor_parallel_size": 2,
                  "spark_interconnect_if": "enp1s0f1np1"}
    group_vars.update(group or {})
    return {name + str(index): dict(group_vars, **values) for name, values in hosts.items()}


# A pair of one: host h, alone with cluster_name p.
PAIR_OF_ONE = {"h": {"cluster_name": "p", "cluster_role": "head", "spark_interconnect_ip": "10.0.0.1",
                     "spark_interconnect_if": "eth1", "memory_plan_tensor_parallel_size": 2}}
CASES = dict(PAIR_OF_ONE)
for _index, (_change, _message) in enumerate(BAD):
    CASES.update(pair_hosts(_index, **_change))

PLAN = {"gmu": 0.5, "kv_cache_memory_bytes": 1, "docker_memory_bytes": 107374182400, "budget_bytes": 101874182400,
        "inputs": {"max_model_len": 1024, "max_num_seqs": 8, "max_num_batched_tokens": 8192, "kv_cache_dtype": "fp8",
                   "mtp_enabled": False, "mtp_num_speculative_tokens": 0, "tensor_parallel_size": 2}}
RENDER_VARS = {"spark_runtime_image": "sparkops/vllm-runtime:0123456789ab", "spark_memory_plan": PLAN}
# variant: (role, template, host, its own values over RENDER_VARS)
RENDERS = {
    "head-ray-service": ("cluster", "ray.service.j2", "spark-pa-head", {}),
    "head-ray-service-no-firewall": ("cluster", "ray.service.j2", "spark-pa-head", {"cluster_firewall": False}),
    "worker-ray-service": ("cluster", "ray.service.j2", "spark-pa-worker", {}),
    "worker-ray-env": ("cluster", "ray.env.j2", "spark-pa-worker", {}),
    "worker-ray-env-no-hca": ("cluster", "ray.env.j2", "spark-pa-worker", {"spark_ib_hca": "", "cluster_nccl_buffsize": 8388608}),
    "head-ray-nft": ("cluster", "ray.nft.j2", "spark-pa-head", {}),
    "head-ray-nft-own-port": ("cluster", "ray.nft.j2", "spark-pa-head", {"serve_port": 8443, "cluster_firewall_allow_tcp": [2222]}),
    "worker-ray-nft": ("cluster", "ray.nft.j2", "spark-pa-worker", {}),
    "worker-ray-nft-nothing-allowed": ("cluster", "ray.nft.j2", "spark-pa-worker", {"cluster_firewall_allow_tcp": []}),
    "head-serve-service": ("serve", "serve.service.j2", "spark-pa-head", {"serve_image": "sparkops/vllm-runtime:0123456789ab"}),
    "head-serve-env": ("serve", "serve.env.j2", "spark-pa-head", {"serve_image": "x:y"}),
    "single-serve-service": ("serve", "serve.service.j2", "spark-01", {
        "serve_image": "x:y",
        "spark_memory_plan": {"gmu": 0.5, "kv_cache_memory_bytes": 1, "docker_memory_gib": 1, "budget_bytes": 1,
                              "inputs": {"max_model_len": 1, "max_num_seqs": 1, "max_num_batched_tokens": 1,
                                         "kv_cache_dtype": "auto", "mtp_enabled": False,
                                         "mtp_num_speculative_tokens": 0}}}),
    "worker-memwatch": ("memwatch", "memwatch.json.j2", "spark-pa-worker", {}),
    "head-memwatch": ("memwatch", "memwatch.json.j2", "spark-pa-head", {}),
}


def render_plays(out_dir):
    """A play per role: its defaults and vars loaded as vars_files, the common role for the shared
    defaults (role-default precedence, below the inventory), a template task per variant."""
    plays = []
    for role in ("cluster", "serve", "memwatch"):
        variants = {name: v for name, v in RENDERS.items() if v[0] == role}
        tasks = [{"name": "Render " + name,
                  "ansible.builtin.template": {"src": "%s/roles/%s/templates/%s" % (ROOT, role, template),
                                               "dest": os.path.join(out_dir, name), "mode": "0644"},
                  "delegate_to": "localhost",
                  "when": "inventory_hostname == %s" % json.dumps(host),
                  "vars": dict(RENDER_VARS, **extra)}
                 for name, (_role, template, host, extra) in variants.items()]
        if role == "serve":
            # what the cluster role exports for a pair's head ({} on a single Spark): serve reads only that
            tasks.insert(0, {"name": "The cluster role's additions to the head's server",
                             "ansible.builtin.include_role": {"name": "sparkops.appliance.cluster",
                                                              "tasks_from": "serve_facts"}})
        plays.append({"name": "Render " + role,
                      "hosts": ":".join(sorted({v[2] for v in variants.values()})),
                      "gather_facts": False,
                      "roles": ["sparkops.appliance.common"],
                      "vars_files": ["%s/roles/%s/defaults/main.yml" % (ROOT, role),
                                     "%s/roles/%s/vars/main.yml" % (ROOT, role)],
                      "tasks": tasks})
    return yaml.safe_dump(plays, sort_keys=False, width=1000)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cluster-role")
    out_dir = tmp_path / "rendered"
    out_dir.mkdir()
    # the renders first: a host that fails a check leaves the later plays
    (tmp_path / "play.yml").write_text(render_plays(str(out_dir)) + VALIDATE)
    inventory = batch_inventory(tmp_path, CASES, group="cases")
    # site.yml validates after gathering facts (the jemalloc path names the architecture)
    doc = play_json(tmp_path / "play.yml", inventory=EXAMPLE, args=["-i", inventory],
                    extra_vars={"ansible_python_interpreter": sys.executable,
                                "ansible_facts": {"architecture": "aarch64"},
                                # a user's key in the example's vault.yml (shipped empty, and refused so)
                                "vault_serve_api_key": "k-example"})
    return doc, out_dir


def validate(doc, hosts, play="Validate"):
    """(failed, messages) of these hosts in a validate play, as a start of their own returned them:
    whether one failed (its rc), the failed results' messages joined."""
    results = [r for host in hosts for p, _t, r in host_results(doc, host) if p == play]
    assert results, "%s ran no task in %s" % (hosts, play)
    messages = [r.get("msg", "") for r in results if r.get("failed") or r.get("unreachable")]
    return bool(messages), " | ".join(messages)


def render(run, variant):
    """The file a variant rendered (the test fails with the task's result where it did not)."""
    doc, out_dir = run
    _role, _template, host, _extra = RENDERS[variant]
    result = [r for _p, t, r in host_results(doc, host) if t == "Render " + variant]
    assert len(result) == 1 and not result[0].get("failed") and not result[0].get("skipped"), (variant, result)
    return (out_dir / variant).read_text()


def test_example_inventory_passes_as_it_is(run):
    doc, _out = run
    ran = {h for play in doc["plays"] if play["play"]["name"] == "Validate" for t in play["tasks"] for h in t["hosts"]}
    assert sorted(ran - set(CASES)) == EXAMPLE_SPARKS
    assert validate(doc, EXAMPLE_SPARKS) == (False, "")


def test_a_single_spark_keeps_the_tp_refusal(run):
    failed, msg = validate(run[0], ["spark-01", "spark-02", "spark-03"], play="Validate singles")
    assert failed
    assert "memory_plan_tensor_parallel_size is 2 on spark-01" in msg


@pytest.mark.parametrize("change, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_pair_is_refused_naming_it(run, change, message):
    failed, msg = validate(run[0], list(pair_hosts(BAD.index((change, message)), **change)))
    assert failed
    assert message in msg, msg


@pytest.mark.parametrize("change, message", BAD_DATA, ids=[str(i) for i in range(len(BAD_DATA))])
def test_bad_pair_value_is_refused_by_the_checks_naming_it(change, message):
    """What the two validate entry points' "Refuse values of the wrong type" tasks join for the pair's
    hosts (their input_problems lookups), in this process."""
    problems = [problem for roles in VALIDATE_ROLES
                for values in pair_hosts(BAD_DATA.index((change, message)), **change).values()
                for problem in input_problems(values, load_role_options(roles=list(roles)), load_role_checks(roles=list(roles)))]
    assert problems
    assert message in " | ".join(problems), problems


def test_a_good_pair_passes_the_checks():
    """The pair every case above changes one value of: nothing refused (so each refusal is its change's)."""
    for roles in VALIDATE_ROLES:
        for values in pair_hosts(0).values():
            assert input_problems(values, load_role_options(roles=list(roles)), load_role_checks(roles=list(roles))) == []


def test_a_pair_of_one_is_refused(run):
    failed, msg = validate(run[0], list(PAIR_OF_ONE))
    assert failed
    assert 'got members ["h"]' in msg


def test_ray_head_unit_binds_the_interconnect_without_dashboard(run):
    unit = render(run, "head-ray-service")
    flat = unit.replace(" \\\n    ", " ")
    assert "--network host --ipc host" in unit
    assert "--gpus all" in unit
    assert "--memory 107374182400 --memory-swap 107374182400" in unit
    assert "--entrypoint ray" in flat
    assert "--gpus all sparkops/vllm-runtime:0123456789ab start --block --node-ip-address 10.10.0.1 " in flat
    assert "--head --port 6379 --include-dashboard=false" in unit
    assert "--num-gpus" not in unit        # Ray counts a Spark's GPU itself
    assert "--node-manager-port 6380 --object-manager-port 6381 --metrics-export-port 6382" in flat
    assert "type=volume,src=sparkops-ray-tmp,dst=/tmp/ray" in unit
    assert "/srv/sparkops/models/my-model:/model:ro" in unit
    assert "Restart=always" in unit and "StartLimitIntervalSec=0" in unit
    assert "\nTimeoutStopSec=60\n" in unit       # docker stop's grace (30) and 30 s for the removal


def test_ray_worker_unit_joins_the_head_on_the_interconnect(run):
    unit = render(run, "worker-ray-service")
    assert "--address 10.10.0.1:6379" in unit
    assert "--node-ip-address 10.10.0.2" in unit
    assert "--head" not in unit


def test_ray_env_pins_every_transport_and_keeps_the_memory_defaults(run):
    env = render(run, "worker-ray-env")
    lines = set(env.splitlines())
    assert {"VLLM_HOST_IP=10.10.0.2", "NCCL_SOCKET_IFNAME=enp1s0f1np1", "GLOO_SOCKET_IFNAME=enp1s0f1np1",
            "UCX_NET_DEVICES=enp1s0f1np1", "NCCL_IB_HCA=rocep1s0f1", "NCCL_BUFFSIZE=16777216",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "LD_PRELOAD=/usr/lib/aarch64-linux-gnu/libjemalloc.so.2", "VLLM_RPC_BASE_PATH=/tmp/ray"} <= lines
    # Ray's memory monitor off: it counts the GPU's allocations on unified memory (SPEC §11)
    assert "RAY_memory_monitor_refresh_ms=0" in lines
    env = render(run, "worker-ray-env-no-hca")
    assert "NCCL_BUFFSIZE=8388608" in env and "NCCL_IB_HCA" not in env


def test_head_serve_unit_runs_tp2_over_ray_after_a_bounded_wait(run):
    unit = render(run, "head-serve-service")
    assert "--tensor-parallel-size 2 --distributed-executor-backend ray" in unit
    # Requires=, not BindsTo=: Ray's restart after a crash restarts the server (BindsTo= left it stopped)
    assert "Requires=sparkops-ray.service" in unit and "After=sparkops-ray.service" in unit
    assert "\nBindsTo=" not in unit
    assert ("ExecStartPre=/usr/local/libexec/sparkops/serve-unit wait-pair --unit sparkops-serve.service "
            "--state-dir /run/sparkops/serve --timeout-s 600 --rest-s 2070 "
            "--script /usr/local/libexec/sparkops/cluster-nodes.py -- "
            "/usr/bin/docker exec -i sparkops-ray python3 - 10.10.0.1:6379 2\n") in unit
    # the wait (an ExecStartPre process) may extend the start's timeout while the worker is away
    assert "NotifyAccess=exec" in unit
    # until READY=1: ExecStartPre 120 + the Ray wait 600 + the stall backoff 30 x 2^2 + health 1200 + one probe 30
    assert "TimeoutStartSec=2070" in unit and "Restart=always" in unit
    assert "type=volume,src=sparkops-ray-tmp,dst=/tmp/ray --pid container:sparkops-ray" in unit
    assert " --init " not in unit      # the Ray container's PID namespace has its own init
    env = render(run, "head-serve-env")
    assert "RAY_ADDRESS=10.10.0.1:6379" in env and "GLOO_SOCKET_IFNAME=enp1s0f1np1" in env
    # the driver's ZeroMQ ipc:// sockets where the head's Ray worker sees them (the shared session volume)
    assert "VLLM_RPC_BASE_PATH=/tmp/ray" in env


def test_single_spark_serve_unit_is_unchanged(run):
    unit = render(run, "single-serve-service")
    assert "ray" not in unit.lower()
    assert "Restart=on-failure" in unit and "TimeoutStartSec=1470" in unit   # no Ray wait: 120 + 120 + 1200 + 30
    assert "NotifyAccess=main" in unit and "wait-pair" not in unit


def test_memwatch_on_a_worker_stops_the_ray_unit(run):
    cfg = json.loads(render(run, "worker-memwatch"))
    assert cfg["targets"] == [{"name": "", "unit": "sparkops-ray.service", "container": "sparkops-ray", "priority": 0}]
    cfg = json.loads(render(run, "head-memwatch"))
    assert [t["unit"] for t in cfg["targets"]] == ["sparkops-serve.service"]


def test_nodes_check_script_compiles():
    path = os.path.join(ROOT, "roles", "cluster", "files", "cluster-nodes.py")
    with open(path, encoding="utf-8") as f:
        compile(f.read(), path, "exec")
    assert textwrap.dedent("x") == "x"


def test_a_pair_node_answers_on_its_other_interfaces_only_on_the_allowed_ports(run, tmp_path):
    """Ray 2.60, its client server (10001) and vLLM's tensor-parallel listeners bind 0.0.0.0: the
    node's nftables table is an allow-list on every interface but the interconnect and loopback,
    ssh and node exporter, and the head's server port (the Molecule cluster scenario probes every
    listening port of the head from a second network)."""
    def rules(variant):
        table = render(run, variant)
        chain = table[table.index("chain input {"):]
        return table, [line.strip() for line in chain.splitlines()[2:] if line.strip() not in ("}", "")]

    table, head = rules("head-ray-nft")
    assert head == ['iifname { "lo", "enp1s0f1np1" } accept', "ct state established,related accept",
                    "tcp dport { 22, 8000, 9100 } accept", "meta l4proto tcp drop"]
    assert table.index("delete table inet sparkops_ray") < table.index("table inet sparkops_ray {")
    assert rules("head-ray-nft-own-port")[1][2] == "tcp dport { 2222, 8443 } accept"
    assert rules("worker-ray-nft")[1][2] == "tcp dport { 22, 9100 } accept"          # no server on a worker
    assert rules("worker-ray-nft-nothing-allowed")[1][2:] == ["meta l4proto tcp drop"]
    nft = shutil.which("nft") or ("/usr/sbin/nft" if os.path.exists("/usr/sbin/nft") else None)
    if nft:   # nft's own parser (check only: nothing is loaded); the Molecule scenario loads it for real
        for variant in ("head-ray-nft", "worker-ray-nft-nothing-allowed"):
            (tmp_path / "ray.nft").write_text(render(run, variant))
            r = subprocess.run([nft, "-c", "-f", str(tmp_path / "ray.nft")], capture_output=True, text=True, check=False)
            assert r.returncode == 0, (variant, r.stderr)
    unit = render(run, "head-ray-service")
    starts = [line for line in unit.splitlines() if line.startswith("ExecStartPre=")]
    assert starts[0] == "ExecStartPre=/usr/sbin/nft -f /etc/sparkops/sparkops-ray.nft"
    off = render(run, "head-ray-service-no-firewall")
    assert "nft" not in off


def test_the_firewall_reads_serve_port_with_serves_own_default():
    """The cluster role runs without the serve role's options: roles/cluster/vars/main.yml reads
    serve_port with a copy of its default, which must follow serve's."""
    with open(os.path.join(ROOT, "roles", "serve", "defaults", "main.yml")) as handle:
        serve_port = yaml.safe_load(handle)["serve_port"]
    with open(os.path.join(ROOT, "roles", "cluster", "vars", "main.yml")) as handle:
        copies = re.findall(r"serve_port \| default\((\d+)\)", handle.read())
    assert copies and all(int(port) == serve_port for port in copies), (copies, serve_port)
