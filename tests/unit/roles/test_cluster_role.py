# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster role (a TP=2 pair over Ray, SPEC §8): the example inventory's pair_a passes the
input checks as it is; a bad pair is refused with a message naming the variable and the host,
before any change; the Ray units and the head's serve unit render with every transport pinned to
the interconnect, the dashboard off, TP=2 over Ray and a bounded wait for both nodes; memwatch on
a worker stops the Ray unit."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from ansible_json import stdout_json

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EXAMPLE = os.path.join(ROOT, "inventories", "example")

VALIDATE = """
- hosts: %(hosts)s
  gather_facts: false
  tasks:
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
          docker_memory_gib: 1
          inputs: {tensor_parallel_size: "{{ memory_plan_tensor_parallel_size }}", max_model_len: 1,
                   max_num_seqs: 1, max_num_batched_tokens: 1, mtp_enabled: false, mtp_num_speculative_tokens: 0,
                   kv_cache_dtype: auto}
"""


def run_validate(tmp_path, inventory=EXAMPLE, hosts="sparks", extra=None):
    (tmp_path / "play.yml").write_text(VALIDATE % {"hosts": hosts})
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    cmd = ["ansible-playbook", "-i", str(inventory), "-c", "local",
           "-e", "ansible_python_interpreter=" + sys.executable, str(tmp_path / "play.yml")]
    # site.yml validates after gathering facts (the jemalloc path names the architecture)
    cmd += ["-e", json.dumps(dict({"ansible_facts": {"architecture": "aarch64"}}, **(extra or {})))]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    out = stdout_json(proc)
    messages = [h.get("msg", "") for p in out["plays"] for t in p["tasks"] for h in t["hosts"].values() if h.get("failed")]
    return proc.returncode, " | ".join(messages)


def pair_inventory(tmp_path, head=None, worker=None, group=None):
    hosts = {"h": {"cluster_role": "head", "spark_interconnect_ip": "10.10.0.1"},
             "w": {"cluster_role": "worker", "spark_interconnect_ip": "10.10.0.2"}}
    hosts["h"].update(head or {})
    hosts["w"].update(worker or {})
    group_vars = {"cluster_name": "p", "memory_plan_tensor_parallel_size": 2, "spark_interconnect_if": "enp1s0f1np1"}
    group_vars.update(group or {})
    inv = {"all": {"children": {"sparks": {"children": {"p": {"hosts": hosts, "vars": group_vars}}}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(json.dumps(inv))
    return path


def test_example_inventory_passes_as_it_is(tmp_path):
    assert run_validate(tmp_path) == (0, "")


def test_a_single_spark_keeps_the_tp_refusal(tmp_path):
    rc, msg = run_validate(tmp_path, hosts="singles", extra={"memory_plan_tensor_parallel_size": 2})
    assert rc != 0
    assert "memory_plan_tensor_parallel_size is 2 on spark-01" in msg


BAD = [
    ({"worker": {"cluster_role": "head"}}, "exactly one with cluster_role head"),
    ({"worker": {"cluster_role": "wrker"}}, "cluster_role must be one of: , head, worker, got: wrker"),
    ({"worker": {"spark_interconnect_ip": ""}}, 'spark_interconnect_ip an IPv4 address'),
    ({"worker": {"spark_interconnect_ip": "10.10.0.1"}}, 'different on the two nodes'),
    ({"worker": {"spark_interconnect_ip": "10.10.0.300"}}, '"10.10.0.300"'),
    ({"group": {"spark_interconnect_if": ""}}, 'spark_interconnect_if an interface name (got "")'),
    ({"group": {"memory_plan_tensor_parallel_size": 1}}, "memory_plan_tensor_parallel_size must be 2"),
    ({"group": {"serve_extra_args": ["--distributed-executor-backend", "uni"]}}, "serve_extra_args on h"),
    ({"group": {"spark_ib_hca": "mlx5 0"}}, 'spark_ib_hca empty or an NCCL_IB_HCA value (got "mlx5 0")'),
]


@pytest.mark.parametrize("change, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_pair_is_refused_naming_it(tmp_path, change, message):
    rc, msg = run_validate(tmp_path, pair_inventory(tmp_path, **change))
    assert rc != 0
    assert message in msg, msg


def test_a_pair_of_one_is_refused(tmp_path):
    host = {"cluster_name": "p", "cluster_role": "head", "spark_interconnect_ip": "10.0.0.1",
            "spark_interconnect_if": "eth1", "memory_plan_tensor_parallel_size": 2}
    inv = {"all": {"children": {"sparks": {"hosts": {"h": host}}}}}
    (tmp_path / "one.yml").write_text(json.dumps(inv))
    rc, msg = run_validate(tmp_path, tmp_path / "one.yml")
    assert rc != 0
    assert 'got members ["h"]' in msg


RENDER = """\
- hosts: %(host)s
  gather_facts: false
  roles:
    - sparkops.appliance.common       # shared defaults at role-default precedence (below the inventory)
  vars_files:
    - %(root)s/roles/%(role)s/defaults/main.yml
    - %(root)s/roles/%(role)s/vars/main.yml
  tasks:
    - ansible.builtin.template:
        src: %(root)s/roles/%(role)s/templates/%(template)s
        dest: "%(out)s"
        mode: "0644"
      delegate_to: localhost
"""


def render(tmp_path, role, template, host, **extra):
    out = tmp_path / (host + "-" + template)
    (tmp_path / "render.yml").write_text(RENDER % {"root": ROOT, "role": role, "template": template, "host": host,
                                                   "out": out})
    extra_vars = {"ansible_python_interpreter": sys.executable, "ansible_facts": {"architecture": "aarch64"},
                  "spark_runtime_image": "sparkops/vllm-runtime:0123456789ab",
                  "spark_memory_plan": {"gmu": 0.5, "kv_cache_memory_bytes": 1, "docker_memory_bytes": 107374182400,
                                        "inputs": {"max_model_len": 1024, "max_num_seqs": 8,
                                                   "max_num_batched_tokens": 8192, "kv_cache_dtype": "fp8",
                                                   "mtp_enabled": False, "mtp_num_speculative_tokens": 0,
                                                   "tensor_parallel_size": 2}}}
    extra_vars.update(extra)
    (tmp_path / "vars.json").write_text(json.dumps(extra_vars))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    r = subprocess.run(["ansible-playbook", "-c", "local", "-i", EXAMPLE, str(tmp_path / "render.yml"),
                        "-e", "@" + str(tmp_path / "vars.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return out.read_text()


def test_ray_head_unit_binds_the_interconnect_without_dashboard(tmp_path):
    unit = render(tmp_path, "cluster", "ray.service.j2", "spark-pa-head")
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


def test_ray_worker_unit_joins_the_head_on_the_interconnect(tmp_path):
    unit = render(tmp_path, "cluster", "ray.service.j2", "spark-pa-worker")
    assert "--address 10.10.0.1:6379" in unit
    assert "--node-ip-address 10.10.0.2" in unit
    assert "--head" not in unit


def test_ray_env_pins_every_transport_and_keeps_the_memory_defaults(tmp_path):
    env = render(tmp_path, "cluster", "ray.env.j2", "spark-pa-worker")
    lines = set(env.splitlines())
    assert {"VLLM_HOST_IP=10.10.0.2", "NCCL_SOCKET_IFNAME=enp1s0f1np1", "GLOO_SOCKET_IFNAME=enp1s0f1np1",
            "UCX_NET_DEVICES=enp1s0f1np1", "NCCL_IB_HCA=rocep1s0f1", "NCCL_BUFFSIZE=16777216",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "LD_PRELOAD=/usr/lib/aarch64-linux-gnu/libjemalloc.so.2", "VLLM_RPC_BASE_PATH=/tmp/ray"} <= lines
    env = render(tmp_path, "cluster", "ray.env.j2", "spark-pa-worker", spark_ib_hca="", cluster_nccl_buffsize=8388608)
    assert "NCCL_BUFFSIZE=8388608" in env and "NCCL_IB_HCA" not in env


def test_head_serve_unit_runs_tp2_over_ray_after_a_bounded_wait(tmp_path):
    unit = render(tmp_path, "serve", "serve.service.j2", "spark-pa-head", serve_image="sparkops/vllm-runtime:0123456789ab")
    assert "--tensor-parallel-size 2 --distributed-executor-backend ray" in unit
    assert "BindsTo=sparkops-ray.service" in unit and "After=sparkops-ray.service" in unit
    assert ("ExecStartPre=/bin/sh -c 'exec /usr/bin/docker exec -i sparkops-ray python3 - 10.10.0.1:6379 2 600 "
            "< /usr/local/libexec/sparkops/cluster-nodes.py'") in unit
    assert "TimeoutStartSec=720" in unit and "Restart=always" in unit
    assert "type=volume,src=sparkops-ray-tmp,dst=/tmp/ray --pid container:sparkops-ray" in unit
    env = render(tmp_path, "serve", "serve.env.j2", "spark-pa-head", serve_image="x:y")
    assert "RAY_ADDRESS=10.10.0.1:6379" in env and "GLOO_SOCKET_IFNAME=enp1s0f1np1" in env
    # the driver's ZeroMQ ipc:// sockets where the head's Ray worker sees them (the shared session volume)
    assert "VLLM_RPC_BASE_PATH=/tmp/ray" in env


def test_single_spark_serve_unit_is_unchanged(tmp_path):
    unit = render(tmp_path, "serve", "serve.service.j2", "spark-01", serve_image="x:y",
                  spark_memory_plan={"gmu": 0.5, "kv_cache_memory_bytes": 1, "docker_memory_gib": 1,
                                     "inputs": {"max_model_len": 1, "max_num_seqs": 1, "max_num_batched_tokens": 1,
                                                "kv_cache_dtype": "auto", "mtp_enabled": False,
                                                "mtp_num_speculative_tokens": 0}})
    assert "ray" not in unit.lower()
    assert "Restart=on-failure" in unit and "TimeoutStartSec=120" in unit


def test_memwatch_on_a_worker_stops_the_ray_unit(tmp_path):
    cfg = json.loads(render(tmp_path, "memwatch", "memwatch.json.j2", "spark-pa-worker"))
    assert cfg["serve_unit"] == "sparkops-ray.service" and cfg["container_name"] == "sparkops-ray"
    cfg = json.loads(render(tmp_path, "memwatch", "memwatch.json.j2", "spark-pa-head"))
    assert cfg["serve_unit"] == "sparkops-serve.service"


def test_nodes_check_script_compiles():
    path = os.path.join(ROOT, "roles", "cluster", "files", "cluster-nodes.py")
    with open(path, encoding="utf-8") as f:
        compile(f.read(), path, "exec")
    assert textwrap.dedent("x") == "x"


def test_ray_ports_answer_on_the_interconnect_and_loopback_only(tmp_path):
    """Ray 2.60 listens on 0.0.0.0: the node's nftables table drops its ports on every other interface
    (the Molecule cluster scenario probes it from a second network)."""
    table = render(tmp_path, "cluster", "ray.nft.j2", "spark-pa-head")
    rule = [line.strip() for line in table.splitlines() if "drop" in line]
    assert rule == ['iifname != { "lo", "enp1s0f1np1" } tcp dport { 6379, 6380, 6381, 6382, 6383, 6384, 6385, '
                    '10002-10999 } drop']
    assert table.index("delete table inet sparkops_ray") < table.index("table inet sparkops_ray {")
    nft = shutil.which("nft") or ("/usr/sbin/nft" if os.path.exists("/usr/sbin/nft") else None)
    if nft:   # nft's own parser (check only: nothing is loaded); the Molecule scenario loads it for real
        (tmp_path / "ray.nft").write_text(table)
        r = subprocess.run([nft, "-c", "-f", str(tmp_path / "ray.nft")], capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
    unit = render(tmp_path, "cluster", "ray.service.j2", "spark-pa-head")
    starts = [line for line in unit.splitlines() if line.startswith("ExecStartPre=")]
    assert starts[0] == "ExecStartPre=/usr/sbin/nft -f /etc/sparkops/sparkops-ray.nft"
    off = render(tmp_path, "cluster", "ray.service.j2", "spark-pa-head", cluster_firewall=False)
    assert "nft" not in off
