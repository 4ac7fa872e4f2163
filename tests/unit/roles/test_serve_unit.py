"""The serve role's unit and env file, rendered by Ansible from the role's own defaults and vars,
are accepted by systemd-analyze verify; a broken render is rejected; quoting survives JSON."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ROLE = os.path.join(ROOT, "roles", "serve")

PLAN = {"gmu": 0.786, "kv_cache_memory_bytes": 18049635041, "docker_memory_gib": 100.65,
        "docker_memory_bytes": 108072616755, "budget_gib": 95.65, "kv_exp_gib": 16.81,
        "inputs": {"max_model_len": 262144, "max_num_seqs": 8, "max_num_batched_tokens": 8192,
                   "kv_cache_dtype": "fp8", "mtp_enabled": True, "mtp_num_speculative_tokens": 3}}


def render(tmp_path, **extra):
    extra_vars = {"spark_memory_plan": PLAN, "spark_model_dir": "/srv/sparkops/models",
                  "spark_model_name": "gemma-3n",
                  "serve_image": "sparkops/vllm-runtime:0123456789ab", "out": str(tmp_path),
                  "ansible_python_interpreter": sys.executable}
    extra_vars.update(extra)
    playbook = tmp_path / "render.yml"
    playbook.write_text(textwrap.dedent("""\
        - hosts: localhost
          gather_facts: true
          gather_subset: [min]
          vars_files:
            - %(common)s/defaults/main.yml
            - %(role)s/defaults/main.yml
            - %(role)s/vars/main.yml
          tasks:
            - ansible.builtin.template:
                src: %(role)s/templates/serve.service.j2
                dest: "{{ out }}/sparkops-serve.service"
                mode: "0644"
            - ansible.builtin.template:
                src: %(role)s/templates/serve.env.j2
                dest: "{{ out }}/sparkops-serve.env"
                mode: "0600"
        """ % {"role": ROLE, "common": os.path.join(ROOT, "roles", "common")}))
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps(extra_vars))
    r = subprocess.run(["ansible-playbook", "-c", "local", "-i", "localhost,", str(playbook),
                        "-e", "@" + str(vars_file)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return (tmp_path / "sparkops-serve.service"), (tmp_path / "sparkops-serve.env")


needs_systemd = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or not os.path.exists("/usr/bin/docker"),
    reason="systemd-analyze and /usr/bin/docker are needed to verify the unit")


def verify(unit):
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False)


@needs_systemd
def test_rendered_unit_verifies_and_a_broken_one_does_not(tmp_path):
    unit, _env = render(tmp_path)
    r = verify(unit)
    assert r.returncode == 0, r.stderr
    broken = tmp_path / "broken" / "sparkops-serve.service"
    broken.parent.mkdir()
    broken.write_text(unit.read_text().replace("ExecStart=/usr/bin/docker", "ExecStart=docker-nowhere"))
    assert verify(broken).returncode != 0


def test_command_line_carries_the_plan_and_the_mtp_json(tmp_path):
    unit, env = render(tmp_path)
    text = unit.read_text()
    assert "--gpu-memory-utilization 0.786" in text
    assert "--memory 108072616755 --memory-swap 108072616755" in text
    assert "--kv-cache-dtype fp8 --max-model-len 262144 --max-num-seqs 8" in text
    assert "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'" in text
    assert "--gpus all" in text and "--ipc host" in text
    assert "docker stop -t 30 sparkops-vllm" in text and "TimeoutStopSec=60" in text
    assert "StartLimitBurst=3" in text and "Restart=on-failure" in text
    assert oct(env.stat().st_mode & 0o777) == "0o600"
    assert "LD_PRELOAD=/usr/lib/" in env.read_text()


def test_bytes_sizing_and_secrets_stay_off_the_command_line(tmp_path):
    plan = dict(PLAN, inputs=dict(PLAN["inputs"], mtp_enabled=False))  # the plan was made with MTP off
    unit, env = render(tmp_path, serve_kv_sizing="bytes", serve_api_key="s3cr%t$x", spark_memory_plan=plan)
    text = unit.read_text()
    assert "--kv-cache-memory-bytes 18049635041" in text
    assert "--gpu-memory-utilization" not in text and "--speculative-config" not in text
    assert "s3cr" not in text
    assert "VLLM_API_KEY=s3cr%t$x" in env.read_text()


def test_model_comes_from_the_shared_model_variables(tmp_path):
    unit, _env = render(tmp_path)
    text = unit.read_text()
    assert "/srv/sparkops/models/gemma-3n:/model:ro" in text
    assert "--served-model-name gemma-3n" in text
