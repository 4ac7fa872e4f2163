"""The runtime_image role records the NCCL and vLLM versions its image ships as labels, read from the
image (not declared), and matches them against preflight's known-bad list after the build: run for
real on this machine against a stand-in Docker engine (engine_standin: the Engine API the Docker
modules use, on a unix socket) and a stand-in docker CLI whose `docker run` answers as
files/probe_versions.py would in each case's image (test_runtime_image_probe.py runs the probe
itself). One ansible-playbook start runs every case (each host its own repository and build
folder, all on one engine, as the lab's Sparks); a second start is the re-converge, which must
build nothing. The real image's labels are checked by the Molecule scenarios (docker inspect)."""
import hashlib
import json
import os

import pytest
import yaml

from engine_standin import Engine, write_docker_cli
from harness import ROOT, ansible_env, batch_inventory, host_outcomes, play_json

PROBE = os.path.join(ROOT, "roles", "runtime_image", "files", "probe_versions.py")
with open(os.path.join(ROOT, "roles", "preflight", "files", "known_bad.yml")) as _handle:
    SHIPPED = yaml.safe_load(_handle)["known_bad"]
NCCL_ENTRY = [e for e in SHIPPED if e["component"] == "nccl"][0]
# a refusing vLLM entry (the shipped list only warns of vLLM 0.23)
REFUSE_VLLM = {"id": "test-vllm-0.23-refused", "component": "vllm", "versions": "0.23.*", "action": "refuse",
               "reason": "vLLM 0.23 does not start on unified memory (test entry).",
               "reported_at": "https://example.invalid/vllm-0.23", "fix": "build on vLLM 0.24.0 or later"}

# host: (what the probe prints in that image, extra variables)
CASES = {
    "fresh": ({"nccl": "2.30.4", "nccl_from": "torch.cuda.nccl.version()", "vllm": "0.24.1"},
              {"runtime_image_vllm_version": "0.24.1"}),                 # a declaration that holds
    "declared-wrong": ({"nccl": "2.30.4", "nccl_from": "torch.cuda.nccl.version()", "vllm": "0.24.1"},
                       {"runtime_image_nccl_version": "2.28.9"}),
    "warn": ({"nccl": "2.28.9", "nccl_from": "the nvidia-nccl wheel", "vllm": "0.24.1"}, {}),
    "refused": ({"nccl": "2.30.4", "nccl_from": "torch.cuda.nccl.version()", "vllm": "0.23.0"}, {}),
    "accepted": ({"nccl": "2.30.4", "nccl_from": "torch.cuda.nccl.version()", "vllm": "0.23.0"},
                 {"preflight_accept_known_bad": [REFUSE_VLLM["id"]]}),
    "cpu": ({"nccl": "none", "nccl_from": "none found", "vllm": "0.32.0"}, {}),
    "no-vllm": ({"nccl": "none", "nccl_from": "none found", "vllm": ""}, {}),
}
PASSING = ("fresh", "warn", "accepted", "cpu")
DECLARED = "Fail when a declared NCCL or vLLM version is not the one the image ships"
REFUSE = "Refuse a known-bad NCCL or vLLM version in the runtime image"
WARN = "Warn of a known-bad NCCL or vLLM version in the runtime image (accepted, or listed to warn)"
UNREAD = "Fail when the versions could not be read"
PUBLISH = "Publish the runtime image for the serve role"

PLAY = [{
    "hosts": "sparks",
    "gather_facts": False,          # the one fact the role reads (the jemalloc path's architecture) is given
    "roles": [{"role": "sparkops.appliance.runtime_image"}],
}]

debian_only = pytest.mark.skipif(not os.path.exists("/etc/debian_version"), reason="the role runs on a Debian-family host")


def _words(text):
    return " ".join(str(text).split())


def _docker_log(base):
    path = base / "docker.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _probed(base, hosts):
    """How many `docker run` calls the hosts' images had."""
    return len([c for c in _docker_log(base) if any(("sparkops/t-%s:" % h) in " ".join(c["args"]) for h in hosts)])


@pytest.fixture(name="run", scope="module")
def fixture_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("runtime-image")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    write_docker_cli(bin_dir)
    (base / "known_bad.yml").write_text(yaml.safe_dump({"known_bad": SHIPPED + [REFUSE_VLLM]}))
    hosts, probes = {}, {}
    for host, (answer, extra) in CASES.items():
        repo = "sparkops/t-" + host
        probes[repo] = answer
        hosts[host] = dict({"runtime_image_repo": repo, "runtime_image_build_dir": str(base / host),
                            "runtime_image_host_packages": [], "preflight_known_bad_file": str(base / "known_bad.yml"),
                            "runtime_image_jemalloc_lib": "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"},
                           **extra)
    (base / "probes.json").write_text(json.dumps(probes))
    (base / "play.yml").write_text(yaml.safe_dump(PLAY, sort_keys=False))
    inventory = batch_inventory(base, hosts)
    socket = base / "engine.sock"
    env = ansible_env(PATH=str(bin_dir) + os.pathsep + os.environ["PATH"], FAKE_LOG_DIR=str(base),
                      FAKE_PROBES=str(base / "probes.json"), DOCKER_HOST="unix://" + str(socket))
    with Engine(socket) as engine:
        first = play_json(base / "play.yml", inventory=inventory, connection=None, env=env)
        after_first = {"builds": len(engine.builds), "docker": _probed(base, PASSING)}
        second = play_json(base / "play.yml", inventory=inventory, connection=None, env=env)
        return {"base": base, "engine": engine, "first": host_outcomes(first, CASES), "second": host_outcomes(second, CASES),
                "after_first": after_first}


def _image(run, host):
    """(tag, inspect) of the tag the role published or recorded as current for host."""
    state = json.loads((run["base"] / host / "state.json").read_text())
    engine = run["engine"]
    return state["current"], engine.images[engine.tags[state["current"]]]


@debian_only
def test_the_image_carries_the_versions_it_ships_as_labels(run):
    failed, _tasks = run["first"]["fresh"]
    assert not failed, [(name, result.get("msg")) for name, result in _tasks.items() if result.get("failed")]
    tag, image = _image(run, "fresh")
    labels = image["Config"]["Labels"]
    assert labels["io.sparkops.nccl-version"] == "2.30.4" and labels["io.sparkops.vllm-version"] == "0.24.1", labels
    assert labels["io.sparkops.recipe"] == tag.rsplit(":", 1)[1] and labels["io.sparkops.base"] == "nvcr.io/nvidia/vllm:25.11-py3"
    with open(PROBE, "rb") as handle:
        probe_sha = hashlib.sha256(handle.read()).hexdigest()
    assert labels["io.sparkops.version-probe"] == probe_sha     # the probe is part of the recipe (the tag)
    # the labelled image is FROM the Dockerfile's image, whose stage tag is gone
    stage = tag + "-stage"
    assert stage not in run["engine"].tags
    assert image["Parent"] and run["engine"].images[image["Parent"]]["RepoTags"] == []
    # the probe ran in the Dockerfile's image, the script on stdin, no network
    [call] = [c for c in _docker_log(run["base"]) if stage in c["args"]]
    assert call["args"][:9] == ["run", "--rm", "-i", "--network", "none", "--entrypoint", "/bin/sh", stage, "-c"]
    assert call["stdin"] == probe_sha
    published = _tasks[PUBLISH]["ansible_facts"]
    assert published["spark_runtime_image"] == tag and published["spark_runtime_image_inspect"]["Config"]["Labels"] == labels
    assert not published["spark_runtime_image_pending"]


@debian_only
def test_an_image_without_nccl_records_none_and_nothing_is_matched(run):
    failed, tasks = run["first"]["cpu"]
    assert not failed
    _tag, image = _image(run, "cpu")
    assert image["Config"]["Labels"]["io.sparkops.nccl-version"] == "none"
    assert image["Config"]["Labels"]["io.sparkops.vllm-version"] == "0.32.0"
    assert tasks[WARN].get("skipped") is True and tasks[REFUSE].get("skipped") is True


@debian_only
def test_a_declared_version_the_image_does_not_ship_fails_naming_both(run):
    for outcome in (run["first"], run["second"]):     # built, then found on the re-converge: alike
        failed, tasks = outcome["declared-wrong"]
        assert failed and tasks[DECLARED].get("failed") is True
        assert "ships NCCL 2.30.4, not runtime_image_nccl_version 2.28.9" in _words(tasks[DECLARED]["msg"])
    # nothing recorded: the state file does not name an image whose declaration is wrong
    assert not (run["base"] / "declared-wrong" / "state.json").exists()
    # a declaration that holds passes (fresh declares its vLLM 0.24.1)
    assert run["first"]["fresh"][1][DECLARED].get("skipped") is True


@debian_only
def test_a_known_bad_nccl_warns(run):
    failed, tasks = run["first"]["warn"]
    assert not failed and tasks[REFUSE].get("skipped") is True
    [message] = [_words(m) for m in tasks[WARN]["msg"]]
    assert "(its label io.sparkops.nccl-version) = 2.28.9: known bad (%s," % NCCL_ENTRY["id"] in message
    assert _words(NCCL_ENTRY["reason"]) in message


@debian_only
def test_a_refused_version_stops_before_the_image_is_recorded_unless_accepted(run):
    failed, tasks = run["first"]["refused"]
    assert failed and tasks[REFUSE].get("failed") is True
    message = _words(tasks[REFUSE]["msg"])
    assert "(its label io.sparkops.vllm-version) = 0.23.0: known bad (%s," % REFUSE_VLLM["id"] in message
    assert "add %s to preflight_accept_known_bad" % REFUSE_VLLM["id"] in message
    assert not (run["base"] / "refused" / "state.json").exists()     # serve is never handed this tag
    assert run["second"]["refused"][0]        # found on the re-converge: refused again
    failed, tasks = run["first"]["accepted"]
    assert not failed and any("Accepted knowingly" in m for m in tasks[WARN]["msg"])


@debian_only
def test_an_image_whose_vllm_cannot_be_read_fails(run):
    failed, tasks = run["first"]["no-vllm"]
    assert failed and "could not be read" in _words(tasks[UNREAD]["msg"])


@debian_only
def test_a_reconverge_builds_nothing_and_probes_nothing(run):
    engine, first = run["engine"], run["after_first"]
    assert len(engine.builds) == first["builds"] and first["builds"] > 0
    assert _probed(run["base"], PASSING) == first["docker"] == len(PASSING)     # once each, in the first run
    for host in PASSING:
        failed, tasks = run["second"][host]
        assert not failed, host
        changed = [name for name, result in tasks.items() if result.get("changed")]
        assert changed == [], (host, changed)
        # the image found is published as the one built was (serve reads its inspect output)
        assert tasks[PUBLISH]["ansible_facts"] == run["first"][host][1][PUBLISH]["ansible_facts"], host
