"""preflight matches the NCCL and vLLM labels of the runtime image this run would serve (the
runtime_image role's tag for the recipe, where it is built already) against the known-bad list:
no declaration needed, no GPU. A first ansible-playbook start builds the images with the
runtime_image role on a stand-in Docker engine (engine_standin; test_runtime_image_labels.py
tests that build), a second runs preflight on them, as a re-converge does. A host whose image is
not built yet is said to be matched by the runtime_image role after its build."""
import json
import os

import pytest
import yaml

from engine_standin import Engine, write_docker_cli
from harness import ansible_env, batch_inventory, host_outcomes, play_json

BUILD = [{"hosts": "sparks", "gather_facts": False, "roles": [{"role": "sparkops.appliance.runtime_image"}]}]
PREFLIGHT = [{"hosts": "sparks", "gather_facts": True, "environment": {"DOCKER_HOST": "{{ case_docker_host }}"},
              "roles": [{"role": "sparkops.appliance.preflight"}]}]

REFUSE_VLLM = {"id": "test-vllm-0.23-refused", "component": "vllm", "versions": "0.23.*", "action": "refuse",
               "reason": "vLLM 0.23 does not start on unified memory (test entry).",
               "reported_at": "https://example.invalid/vllm-0.23", "fix": "build on vLLM 0.24.0 or later"}
NCCL_WARN = {"id": "test-nccl-old", "component": "nccl", "versions": "< 2.30.4", "action": "warn",
             "reason": "old NCCL deadlocks a pair's CUDA graphs (test entry).",
             "reported_at": "https://example.invalid/nccl", "fix": "build on NCCL 2.30.4 or later"}

# host: the probe's answer in its image (None: the image is not built before preflight runs)
CASES = {
    "old-nccl": {"nccl": "2.28.9", "nccl_from": "the nvidia-nccl wheel", "vllm": "0.24.1"},
    "refused": {"nccl": "2.30.4", "nccl_from": "torch.cuda.nccl.version()", "vllm": "0.23.0"},
    "cpu": {"nccl": "none", "nccl_from": "none found", "vllm": "0.32.0"},
    "not-built": None,
    "no-api": None,      # the docker CLI answers, the engine's API socket does not
}
REFUSE = "Refuse a known-bad driver, kernel, NCCL or vLLM version"
WARN = "Warn of known-bad versions (accepted, or listed to warn), and say what was not checked"
debian_only = pytest.mark.skipif(not os.path.exists("/etc/debian_version"), reason="preflight expects a Debian-family host")


def _words(text):
    return " ".join(str(text).split())


@pytest.fixture(name="run", scope="module")
def fixture_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("preflight-image")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    write_docker_cli(bin_dir)
    (base / "known_bad.yml").write_text(yaml.safe_dump({"known_bad": [NCCL_WARN, REFUSE_VLLM]}))
    (base / "release").write_text("6.17.0-1032-nvidia\n")
    (base / "driver").write_text("580.95.05\n")
    socket = base / "engine.sock"
    hosts = {}
    for host in CASES:
        (base / host).mkdir()
        hosts[host] = {
            "runtime_image_repo": "sparkops/p-" + host, "runtime_image_build_dir": str(base / host / "image"),
            "runtime_image_host_packages": [], "runtime_image_jemalloc_lib": "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
            "preflight_known_bad_file": str(base / "known_bad.yml"), "spark_expect_gpu": False,
            "preflight_expected_arch": [os.uname().machine], "preflight_min_mem_total_gib": 0,
            "preflight_min_free_disk_gib": 0, "spark_model_dir": str(base / host),
            # a clean driver (loaded, and the drivers role's pin) and kernel: only the image is in question
            "preflight_driver_version_path": str(base / "driver"), "preflight_kernel_release_path": str(base / "release"),
            "drivers_manage": True, "case_docker_host": "unix://" + str(socket),
        }
    (base / "probes.json").write_text(json.dumps({"sparkops/p-" + h: a for h, a in CASES.items() if a}))
    (base / "build.yml").write_text(yaml.safe_dump(BUILD, sort_keys=False))
    (base / "preflight.yml").write_text(yaml.safe_dump(PREFLIGHT, sort_keys=False))
    hosts["no-api"]["case_docker_host"] = "unix://" + str(base / "no-engine.sock")
    inventory = batch_inventory(base, hosts)
    env = ansible_env(PATH=str(bin_dir) + os.pathsep + os.environ["PATH"], FAKE_LOG_DIR=str(base),
                      FAKE_PROBES=str(base / "probes.json"), DOCKER_HOST="unix://" + str(socket))
    built = [h for h, answer in CASES.items() if answer]
    # the build's own match (test_runtime_image_labels.py) accepts the refused entry: the image is built
    with Engine(socket) as engine:
        build = play_json(base / "build.yml", inventory=inventory, connection=None, env=env,
                          # one host at a time: the hosts share this machine's ownership record (files module),
                          # which preflight then reads for each build folder
                          args=["--forks", "1", "--limit", ",".join(built),
                                "-e", json.dumps({"preflight_accept_known_bad": [REFUSE_VLLM["id"]]})])
        assert not any(build["stats"][h]["failures"] for h in built), build["stats"]
        tags = {h: json.loads((base / h / "image" / "state.json").read_text())["current"] for h in built}
        doc = play_json(base / "preflight.yml", inventory=inventory, connection=None, env=env)
        return {"outcomes": host_outcomes(doc, CASES), "tags": tags, "engine": engine}


@debian_only
def test_a_known_bad_nccl_label_warns_naming_the_image(run):
    failed, tasks = run["outcomes"]["old-nccl"]
    assert not failed, [(name, result.get("msg")) for name, result in tasks.items() if result.get("failed")]
    assert tasks[REFUSE].get("skipped") is True
    warnings = [_words(m) for m in tasks[WARN]["msg"]]
    source = "%s (its label io.sparkops.nccl-version) = 2.28.9: known bad (%s," % (run["tags"]["old-nccl"], NCCL_WARN["id"])
    assert any(m.startswith(source) and _words(NCCL_WARN["reason"]) in m for m in warnings), warnings
    assert not any(m.startswith("known-bad versions not checked") for m in warnings), warnings


@debian_only
def test_a_refused_vllm_label_stops_preflight(run):
    failed, tasks = run["outcomes"]["refused"]
    assert failed and tasks[REFUSE].get("failed") is True
    message = _words(tasks[REFUSE]["msg"])
    assert "%s (its label io.sparkops.vllm-version) = 0.23.0: known bad (%s," % (run["tags"]["refused"], REFUSE_VLLM["id"]) in message
    assert "add %s to preflight_accept_known_bad" % REFUSE_VLLM["id"] in message


@debian_only
def test_an_image_without_nccl_is_neither_matched_nor_unchecked(run):
    failed, tasks = run["outcomes"]["cpu"]
    assert not failed
    assert tasks[REFUSE].get("skipped") is True and tasks[WARN].get("skipped") is True, tasks[WARN]


@debian_only
def test_an_image_not_built_yet_is_left_to_the_runtime_image_role(run):
    failed, tasks = run["outcomes"]["not-built"]
    assert not failed
    [message] = [_words(m) for m in tasks[WARN]["msg"]]
    assert message.startswith("known-bad versions not checked on not-built (none seen): nccl, vllm; the runtime image sparkops/p-not-built:")
    assert "is not built yet: the runtime_image role matches the NCCL and vLLM it ships after its build" in message


@debian_only
def test_an_engine_api_that_does_not_answer_is_said_not_a_failure(run):
    failed, tasks = run["outcomes"]["no-api"]
    assert not failed, [(name, result.get("msg")) for name, result in tasks.items() if result.get("failed")]
    [message] = [_words(m) for m in tasks[WARN]["msg"]]
    assert message.startswith("known-bad versions not checked on no-api (none seen): nccl, vllm; the runtime image sparkops/p-no-api:")
    assert "could not be looked for (" in message and "the runtime_image role matches the NCCL and vLLM" in message
