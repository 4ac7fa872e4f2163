"""Several models on one lab Spark under one host plan (SPEC §13, docs/runtime.md "Several models on
one Spark"): two tiny models served at once, each by its own unit, container and port with its share
of the plan, each answering and each KV pool within 10 % of its plan; the one server the Spark had
before is removed first; then a model taken out of spark_models leaves no unit, container, env or
file of its own behind, and the other keeps serving, not restarted.

Runs last in the scenario (its server is the scenario's last state; the scenario's destroy removes
the lab Spark only, so the module's last step stops both models' containers on the shared engine)."""
import json
import os

import pytest

from test_unit_semantics import PROJECT, _converge, prop, wait_for
from lab_key import curl_auth   # noqa: E402 tests/support, put on the path by test_unit_semantics

SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "serve")
CONTAINER = "sparkops-molecule-%s-vllm" % SCENARIO      # spark_serve_container_name of the scenario
MODELS = [{"name": "tiny-chat", "priority": 10, "port": 8000},
          {"name": "tiny-embed", "priority": 5, "port": 8001}]
# the tiny model's plan inputs, as the lab gives the one model (inventories/lab lab_overrides.yml)
TINY = {"weight_bytes": 16777216, "overhead_gib": 1.0, "mtp_gib": 0, "max_model_len": 1024,
        "kv_bytes_per_token": 512, "kv_cache_dtype": "auto", "kv_target_gib": 0.0625,
        "max_num_seqs": 4, "max_num_batched_tokens": 1024}
PLAY = """\
- name: Several models on the lab Spark, under one host plan
  hosts: sparks
  gather_facts: true           # the runtime image and serve read the architecture, as the converge
  vars:
    spark_models: %s
  roles:
    - role: sparkops.appliance.common   # spark_model_dir, before the copy
  tasks:
    - name: Put each model's checkpoint where the checkpoint role would (the tiny model, copied)
      ansible.builtin.copy:
        src: "{{ serve_model_path }}/"
        dest: "{{ spark_model_dir }}/{{ item.name }}/"
        remote_src: true
        mode: preserve
      loop: "{{ spark_models }}"
    - name: Plan the host
      ansible.builtin.include_role:
        name: sparkops.appliance.memory_plan
    - name: The runtime image (built by the converge)
      ansible.builtin.include_role:
        name: sparkops.appliance.runtime_image
    - name: Serve
      ansible.builtin.include_role:
        name: sparkops.appliance.serve
"""
RECORD = "/var/lib/sparkops/owned.json"


def unit(model):
    return "sparkops-serve-%s" % model["name"]


def container(model):
    return "%s-%s" % (CONTAINER, model["name"])


def run(tmp_path, models):
    play = tmp_path / "models.yml"
    play.write_text(PLAY % json.dumps([dict(TINY, **m) for m in models]))
    if not (tmp_path / "group_vars").exists():
        (tmp_path / "group_vars").symlink_to(os.path.join(PROJECT, "molecule", SCENARIO, "group_vars"))
    r = _converge(playbook=play)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout


def complete(host, model):
    out = host.check_output(
        "curl -fsS --max-time 60 %s http://127.0.0.1:%d/v1/completions -H 'Content-Type: application/json' -d '%s'"
        % (curl_auth(), model["port"], json.dumps({"model": model["name"], "prompt": "hello", "max_tokens": 4})))
    return json.loads(out)


def running(host, name):
    return host.run("docker inspect -f '{{.State.Running}}' %s" % name).stdout.strip() == "true"


@pytest.fixture(name="served", scope="module")
def fixture_served(host, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("models")
    out = run(tmp_path, MODELS)
    yield tmp_path, out
    for model in MODELS:
        host.run("systemctl stop %s.service; docker rm -f %s" % (unit(model), container(model)))


def test_two_models_serve_at_once_each_within_its_kv_plan(host, served):
    _tmp, out = served
    # the one server the Spark had is gone first: its unit, env file and container
    assert prop(host, "sparkops-serve.service", "LoadState") == "not-found"
    assert not host.file("/etc/sparkops/sparkops-serve.env").exists
    assert not running(host, CONTAINER)
    assert "no longer serves (the one model)" in " ".join(out.split()), out[-3000:]
    for model in MODELS:
        assert prop(host, unit(model) + ".service", "ActiveState") == "active"
        assert running(host, container(model))
        done = complete(host, model)
        assert done["model"] == model["name"] and done["usage"]["completion_tokens"] > 0, done
        report = json.loads(host.file("/var/lib/sparkops/serve/%s-plan-vs-actual.json" % unit(model)).content_string)
        planned = report["plan"]["kv_cache_memory_bytes"] / 2.0 ** 30
        assert report["plan"]["name"] == model["name"]
        assert abs(report["actual"]["kv_cache_gib"] - planned) <= 0.1 * planned, (model, report["actual"], planned)
        memory = host.check_output("docker inspect -f '{{.HostConfig.Memory}}' %s" % container(model))
        assert int(memory) == report["plan"]["docker_memory_bytes"]
        print("%s: port %d, KV plan %.4f GiB, vLLM %.4f GiB, container cap %d bytes"
              % (model["name"], model["port"], planned, report["actual"]["kv_cache_gib"], int(memory)))
    # each answers its own model only
    models = json.loads(host.check_output("curl -fsS --max-time 30 %s http://127.0.0.1:8001/v1/models" % curl_auth()))
    assert [m["id"] for m in models["data"]] == ["tiny-embed"]


def test_a_removed_model_leaves_nothing_behind_and_the_other_keeps_serving(host, served):
    tmp_path, _out = served
    chat, embed = MODELS
    before = host.check_output("docker inspect -f '{{.Id}}' %s" % container(chat))
    out = run(tmp_path, [chat])
    assert "no longer serves tiny-embed" in " ".join(out.split()), out[-3000:]
    assert prop(host, unit(embed) + ".service", "LoadState") == "not-found"
    assert not running(host, container(embed))
    assert host.run("docker inspect %s" % container(embed)).rc != 0
    left = host.run("ls -d /etc/systemd/system/%(u)s* /etc/sparkops/%(u)s* /usr/local/sbin/%(u)s* "
                    "/var/lib/sparkops/serve/%(u)s* /var/cache/sparkops/vllm/%(n)s 2>/dev/null"
                    % {"u": unit(embed), "n": embed["name"]}).stdout.split()
    assert left == [], left
    record = json.loads(host.file(RECORD).content_string)["paths"]
    assert not [p for p in record if unit(embed) in p], record
    # the model kept was not restarted, and still answers
    assert host.check_output("docker inspect -f '{{.Id}}' %s" % container(chat)) == before
    wait_for("tiny-chat to stay active", lambda: prop(host, unit(chat) + ".service", "ActiveState") == "active", 30)
    assert complete(host, chat)["usage"]["completion_tokens"] > 0
