"""The serve role's entry point prepare (roles/serve/tasks/prepare.yml), run for real on this machine
with a fake docker and systemctl: where the unit and its environment would change on a server that
serves now, it parses the line with the image's vLLM (docker run of the checker), keeps the current
unit and env as *.previous and reports spark_serve.restart_pending, and changes nothing the running
server uses: the unit and env stay as they were, systemd is asked nothing but is-active and show.
A pair's head without the cluster role's fact spark_cluster_serve is refused before any file is
written. One ansible-playbook start; each host a case whose paths are under its own directory."""
import json
import os

import pytest
import yaml

from harness import ansible_env, batch_inventory, host_results, play_json

PLAN = {"gmu": 0.5, "kv_cache_memory_bytes": 1, "docker_memory_gib": 1, "budget_bytes": 1,
        "inputs": {"max_model_len": 1024, "max_num_seqs": 1, "max_num_batched_tokens": 1024, "kv_cache_dtype": "auto",
                   "mtp_enabled": False, "mtp_num_speculative_tokens": 0, "tensor_parallel_size": 1}}
IMAGE = "sparkops/vllm-runtime:0123456789ab"
OLD_UNIT = "[Service]\nExecStart=/bin/true old\n"
OLD_ENV = "OLD=1\n"
DRAINED = {"drained": True, "since": "2026-12-02T10:00:00+00:00", "image": "sparkops/vllm-runtime:new"}
GOOD = {"image": "sparkops/vllm-runtime:old", "checkpoint_dir": "/srv/sparkops/models/m", "checkpoint_revision": ""}

# Logs every call (one line of arguments); `docker run` answers as vllm_check_args.py does on an
# accepted line, `systemctl is-active` says the server serves.
FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "$FAKE_LOG_DIR/docker.log"
cat > /dev/null
echo '{"accepted": true}'
"""
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$FAKE_LOG_DIR/systemctl.log"
[ "$1" = is-active ] && echo active
exit 0
"""

PLAY = [{
    "name": "Prepare",
    "hosts": "sparks",
    "gather_facts": True,
    "gather_subset": ["min"],        # the jemalloc path's architecture, as site.yml
    "tasks": [{
        "name": "Serve prepare",
        "ansible.builtin.include_role": {"name": "sparkops.appliance.serve", "tasks_from": "prepare"},
        # role vars (the unit's path, the helper's) are outranked by an include's vars only
        "vars": {"__serve_unit_path": "{{ case_dir }}/systemd/sparkops-serve.service",
                 "__serve_helper": "{{ case_dir }}/libexec/serve-unit"},
    }, {
        "name": "Keep what prepare exported",
        "ansible.builtin.copy": {"content": "{{ spark_serve | to_json }}", "dest": "{{ case_dir }}/spark_serve.json",
                                 "mode": "0644"},
    }],
}]


def tree(path):
    """{relative path: (content, mtime)} of every file under path."""
    out = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as handle:
                out[os.path.relpath(full, path)] = (handle.read(), os.stat(full).st_mtime_ns)
    return out


@pytest.fixture(name="run", scope="module")
def fixture_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("prepare")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("systemctl", FAKE_SYSTEMCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    hosts, before = {}, {}
    # fleet-a and fleet-b: two serving hosts of the batch whose change restarts them, the refusal on
    # (the serve role's own, for a playbook other than site.yml, whose first play refuses earlier)
    for name, extra in (("single", {}), ("head-no-fact", {"cluster_role": "head", "cluster_name": "p"}), ("drained", {}),
                        ("fleet-a", {"serve_refuse_fleet_restart": True}), ("fleet-b", {"serve_refuse_fleet_restart": True})):
        case = base / name
        (case / "etc").mkdir(parents=True)
        (case / "systemd").mkdir()
        (case / "etc" / "sparkops-serve.env").write_text(OLD_ENV)
        (case / "systemd" / "sparkops-serve.service").write_text(OLD_UNIT)
        if name == "drained":   # what an interrupted rollout leaves, and the last gated configuration's record
            (case / "etc" / "sparkops-serve.rollout.json").write_text(json.dumps(DRAINED, indent=2) + "\n")
            (case / "etc" / "sparkops-serve.good.json").write_text(json.dumps(GOOD, indent=2) + "\n")
        before[name] = tree(case)
        hosts[name] = dict({
            "case_dir": str(case), "spark_memory_plan": PLAN, "serve_image": IMAGE,
            "spark_runtime_image_inspect": {"RepoTags": [IMAGE], "Id": "sha256:" + "1" * 64, "Config": {"Labels": {}}},
            "serve_model_path": "/srv/sparkops/models/m", "serve_config_dir": str(case / "etc"),
            "serve_state_dir": str(case / "state"), "serve_cache_dir": str(case / "cache"),
            "serve_report_path": str(case / "report" / "plan-vs-actual.json"),
            "serve_jemalloc": False, "serve_ple_file": "", "serve_bind_host": "127.0.0.1",
            # the cases restart a serving server: the fleet refusal is the subject of fleet-a and fleet-b only
            "serve_refuse_fleet_restart": False,
        }, **extra)
    (base / "play.yml").write_text(yaml.safe_dump(PLAY, sort_keys=False))
    env = ansible_env(PATH=str(bin_dir) + os.pathsep + os.environ["PATH"], FAKE_LOG_DIR=str(base))
    doc = play_json(base / "play.yml", inventory=batch_inventory(base, hosts), connection=None, env=env)
    logs = {}
    for name in ("docker", "systemctl"):
        path = base / (name + ".log")
        logs[name] = path.read_text().splitlines() if path.exists() else []
    return {"doc": doc, "base": base, "before": before, "logs": logs}


def test_prepare_parses_keeps_the_previous_files_and_restarts_nothing(run):
    doc, case = run["doc"], run["base"] / "single"
    failed = [(t, r.get("msg")) for _p, t, r in host_results(doc, "single") if r.get("failed")]
    assert not failed, failed
    exported = json.loads((case / "spark_serve.json").read_text())
    assert exported["change_pending"] is True and exported["restart_pending"] is True, exported
    assert exported["url"] == "http://127.0.0.1:8000" and exported["unit"] == "sparkops-serve.service"
    assert exported["container"] == "sparkops-vllm"
    assert exported["drained"] is False and exported["good"] == {}, exported
    # the running server's unit and env are as they were (content and mtime); the current ones are kept
    after = tree(case)
    for path in ("etc/sparkops-serve.env", "systemd/sparkops-serve.service"):
        assert after[path] == run["before"]["single"][path], path
    assert (case / "etc" / "sparkops-serve.env.previous").read_text() == OLD_ENV
    assert (case / "etc" / "sparkops-serve.service.previous").read_text() == OLD_UNIT
    # the image's vLLM parsed the line (once per host that got that far: single, drained, fleet-a, fleet-b), and
    # systemd was only asked
    assert len(run["logs"]["docker"]) == 4 and all(line.startswith(
        "run --rm -i --network none --entrypoint python3 %s - /model " % IMAGE) for line in run["logs"]["docker"]), run["logs"]["docker"]
    verbs = {line.split()[0] for line in run["logs"]["systemctl"]}
    assert verbs <= {"is-active", "show"} and "is-active" in verbs, run["logs"]["systemctl"]
    assert not any(r.get("changed") for _p, t, r in host_results(doc, "single")
                   if t in ("Render the container environment file and the serve unit", "Restart the serve unit"))


def test_a_head_without_the_cluster_fact_is_refused_before_any_write(run):
    doc, case = run["doc"], run["base"] / "head-no-fact"
    failed = [r.get("msg", "") for _p, _t, r in host_results(doc, "head-no-fact") if r.get("failed")]
    assert len(failed) == 1 and "spark_cluster_serve" in failed[0] and "Nothing was changed" in failed[0], failed
    assert tree(case) == run["before"]["head-no-fact"]


def test_a_host_an_interrupted_rollout_left_drained_is_found_with_its_last_good_record(run):
    """The drain mark (written before a rollout takes the host out of the balancer) and the last good
    configuration's record are read back by prepare's one check-mode files call."""
    doc, case = run["doc"], run["base"] / "drained"
    assert not [t for _p, t, r in host_results(doc, "drained") if r.get("failed")]
    exported = json.loads((case / "spark_serve.json").read_text())
    assert exported["drained"] is True and exported["good"] == GOOD, exported
    assert exported["rollout_state_file"] == str(case / "etc" / "sparkops-serve.rollout.json")


def test_several_serving_hosts_of_the_batch_that_would_restart_are_refused_before_any_write(run):
    """The serve role's own fleet refusal (serve_refuse_fleet_restart): every restarting server of the
    play's batch is counted, and the hosts that refuse keep their unit and env as they were."""
    doc = run["doc"]
    for name in ("fleet-a", "fleet-b"):
        failed = [r.get("msg", "") for _p, _t, r in host_results(doc, name) if r.get("failed")]
        assert len(failed) == 1 and "would restart the servers serving now on 4 hosts at once" in failed[0], failed
        assert "fleet-a" in failed[0] and "fleet-b" in failed[0] and "playbooks/rollout.yml" in failed[0], failed
        after = tree(run["base"] / name)
        for path in ("etc/sparkops-serve.env", "systemd/sparkops-serve.service"):
            assert after[path] == run["before"][name][path], (name, path)
