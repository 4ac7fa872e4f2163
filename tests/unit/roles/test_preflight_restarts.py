"""site.yml's fleet-restart refusal, in its first play (roles/preflight/tasks/restarts.yml), run for real
on this machine with a fake docker and systemctl: every host is a case under its own directory, and
each phase's forecast makes the calls that phase would make (in check mode): the drivers role asks
its daemon.json module, the serve role its one files call over the unit and env (rendered with the
image tag this run serves), and systemd says which servers serve now. More than one serving server
that this run would restart is refused before any phase runs, naming each with its reasons; a
server whose files would not change, a server that does not serve, and a phase left out by
--skip-tags are not counted. Before this entry point, the refusal came in the serve play, after
Docker and Ray had restarted. One ansible-playbook start for the refusal, one for the --skip-tags
run; the filter's own cases (a pair's worker) are in tests/unit/plugins/filter/test_fleet_restarts.py."""
import os

import pytest
import yaml

from harness import ROOT, ansible_env, batch_inventory, host_results, play_json

PLAN = {"gmu": 0.5, "kv_cache_memory_bytes": 1, "docker_memory_gib": 1, "budget_bytes": 1,
        "inputs": {"max_model_len": 1024, "max_num_seqs": 1, "max_num_batched_tokens": 1024, "kv_cache_dtype": "auto",
                   "mtp_enabled": False, "mtp_num_speculative_tokens": 0, "tensor_parallel_size": 1}}
IMAGE = "sparkops/vllm-runtime:0123456789ab"
INSPECT = {"RepoTags": [IMAGE], "Id": "sha256:" + "1" * 64, "Config": {"Labels": {}}}
OLD_UNIT = "[Service]\nExecStart=/bin/true old\n"

# `systemctl show` answers for each unit asked: active, but a unit whose name says idle is inactive.
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$FAKE_LOG_DIR/systemctl.log"
if [ "$1" = show ]; then
  first=1
  for unit in "$@"; do
    case "$unit" in show|--property=*|--) continue ;; esac
    [ $first = 1 ] || echo
    first=0
    state=active
    case "$unit" in *idle*) state=inactive ;; esac
    printf 'Id=%s\\nLoadState=loaded\\nActiveState=%s\\nUnitFileState=enabled\\nNeedDaemonReload=no\\n' "$unit" "$state"
  done
fi
exit 0
"""
FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "$FAKE_LOG_DIR/docker.log"
exit 1
"""

# The unit and env where they are the serve role's own rendering (what a converged host has).
PATHS = {"__serve_unit_path": "{{ case_dir }}/systemd/{{ spark_serve_unit_name }}.service",
         "__serve_helper": "{{ case_dir }}/libexec/serve-unit"}
PLAY = [{
    "name": "Put the unit and env the serve role renders on the hosts that serve them already",
    "hosts": "sparks",
    "gather_facts": True,
    "gather_subset": ["min"],
    "tasks": [{
        "name": "The serve role's variables",
        "ansible.builtin.include_role": {"name": "sparkops.appliance.serve", "tasks_from": "facts", "public": True},
        # what the later plays give serve (the forecast is passed the same by roles/preflight)
        "vars": dict(PATHS, spark_runtime_image=IMAGE, spark_checkpoint_dir="/srv/sparkops/models/model",
                     spark_ple_pack_file="/srv/sparkops/models/model.ple"),
    }, {
        # the role's __serve_unit_files, with the templates' paths from here (a lookup outside the
        # role does not search its templates folder)
        "name": "Write them",
        "sparkops.appliance.files": {"files": [
            {"path": "{{ __serve_env_file }}", "mode": "0600",
             "content": "{{ lookup('ansible.builtin.template', '%s/roles/serve/templates/serve.env.j2') }}" % ROOT},
            {"path": "{{ __serve_unit_path }}", "mode": "0644",
             "content": "{{ lookup('ansible.builtin.template', '%s/roles/serve/templates/serve.service.j2') }}" % ROOT}]},
        "vars": dict(PATHS, spark_runtime_image=IMAGE, spark_checkpoint_dir="/srv/sparkops/models/model",
                     spark_ple_pack_file="/srv/sparkops/models/model.ple"),
        "when": "converged",
    }],
}, {
    "name": "Preflight",
    "hosts": "sparks",
    "gather_facts": False,
    "tasks": [{
        "name": "Forecast the restarts",
        "ansible.builtin.include_role": {"name": "sparkops.appliance.preflight", "tasks_from": "restarts"},
        # role vars (the unit's path, the helper's) are outranked by an include's vars only
        "vars": PATHS,
    }],
}]

# case: (serves now, its unit and env are the role's rendering, the image is built, its drivers phase)
CASES = {
    "same": ("sparkops-serve-same", True, True, {}),
    "image": ("sparkops-serve-image", False, False, {}),
    "docker": ("sparkops-serve-docker", True, True, {"drivers_manage": True}),
    "idle": ("sparkops-serve-idle", False, True, {}),
}


def run_cases(base, args=()):
    bin_dir = base / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("docker", FAKE_DOCKER), ("systemctl", FAKE_SYSTEMCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    hosts = {}
    for name, (unit, converged, built, extra) in CASES.items():
        case = base / name
        (case / "systemd").mkdir(parents=True)
        (case / "etc").mkdir()
        if not converged:
            (case / "systemd" / (unit + ".service")).write_text(OLD_UNIT)
        hosts[name] = dict({
            "case_dir": str(case), "converged": converged, "spark_memory_plan": PLAN,
            "spark_serve_unit_name": unit, "spark_serve_container_name": unit + "-vllm",
            "__runtime_image_probed": {"tag": IMAGE, "images": [INSPECT] if built else [], "error": "", "checked": True},
            "serve_config_dir": str(case / "etc"), "serve_state_dir": str(case / "state"),
            "serve_cache_dir": str(case / "cache"), "serve_report_path": str(case / "report" / "plan-vs-actual.json"),
            "serve_jemalloc": False, "serve_bind_host": "127.0.0.1", "serve_recycle_enabled": False,
            "spark_expect_gpu": False, "drivers_docker_daemon_json": str(case / "docker" / "daemon.json"),
        }, **extra)
    (base / "play.yml").write_text(yaml.safe_dump(PLAY, sort_keys=False))
    env = ansible_env(PATH=str(bin_dir) + os.pathsep + os.environ["PATH"], FAKE_LOG_DIR=str(base))
    return play_json(base / "play.yml", inventory=batch_inventory(base, hosts), connection=None, env=env, args=args,
                     timeout=600)


@pytest.fixture(name="refused", scope="module")
def fixture_refused(tmp_path_factory):
    base = tmp_path_factory.mktemp("restarts")
    return run_cases(base), base


def forecast(doc, name):
    """The host's __preflight_forecast, as its set_fact reported it."""
    facts = [result["ansible_facts"]["__preflight_forecast"] for _play, task, result in host_results(doc, name)
             if task.endswith("Note what this run would restart on this host")]
    assert len(facts) == 1, name
    return facts[0]


def failures(doc, host):
    return [(task, result.get("msg", "")) for _play, task, result in host_results(doc, host) if result.get("failed")]


def test_two_serving_hosts_that_would_restart_are_refused_before_any_phase_each_named_with_why(refused):
    doc, base = refused
    for name in CASES:
        failed = failures(doc, name)
        assert [task for task, _msg in failed] == ["sparkops.appliance.preflight : Refuse to restart the servers of several Sparks at once"], (name, failed)
    msg = failures(doc, "same")[0][1]
    assert "site.yml would restart the servers serving now on 2 hosts at once" in msg, msg
    assert ("image (its unit or environment changes (the runtime image %s is built by this run))" % IMAGE) in msg, msg
    assert ("docker (Docker restarts (%s changes))" % (base / "docker" / "docker" / "daemon.json")) in msg, msg
    assert "same (" not in msg and "idle (" not in msg, msg
    assert "Nothing was changed" in msg and "playbooks/rollout.yml" in msg and "--limit" in msg, msg


def test_each_host_forecast_says_whether_it_serves_and_what_restarts_it(refused):
    doc, base = refused
    assert forecast(doc, "same") == {"host": "same", "cluster_name": "", "cluster_role": "", "serving": True, "reasons": []}
    assert forecast(doc, "image")["serving"] is True and len(forecast(doc, "image")["reasons"]) == 1
    assert forecast(doc, "docker")["reasons"] == ["Docker restarts (%s changes)" % (base / "docker" / "docker" / "daemon.json")]
    # not serving: its unit would change, but no server stops
    assert forecast(doc, "idle")["serving"] is False and forecast(doc, "idle")["reasons"], forecast(doc, "idle")


def test_the_forecast_writes_nothing_and_asks_systemd_only(refused):
    _doc, base = refused
    assert not (base / "docker" / "docker").exists()
    assert (base / "image" / "systemd" / "sparkops-serve-image.service").read_text() == OLD_UNIT
    assert not os.listdir(base / "image" / "etc")
    verbs = {line.split()[0] for line in (base / "systemctl.log").read_text().splitlines()}
    assert verbs == {"show"}, verbs
    assert not (base / "docker.log").exists()


def test_a_phase_left_out_by_skip_tags_restarts_nothing(tmp_path):
    """--skip-tags host: the drivers phase does not run, so Docker does not restart: one server is left."""
    base = tmp_path
    doc = run_cases(base, args=["--skip-tags", "host"])
    for name in CASES:
        assert not failures(doc, name), (name, failures(doc, name))
    assert forecast(doc, "docker")["reasons"] == []
    assert len(forecast(doc, "image")["reasons"]) == 1
    # the one server this run restarts is named, with why (a run of one host is not refused)
    said = [result.get("msg") for _play, task, result in host_results(doc, "same")
            if task.endswith("Say which server serving now this run restarts, and why")]
    assert said == ["site.yml restarts the server serving now on image (its unit or environment changes "
                    "(the runtime image %s is built by this run))." % IMAGE], said


def test_the_values_passed_for_later_plays_are_those_roles_defaults():
    """The first play does not load the checkpoint and ple roles: preflight's vars/main.yml reads their
    options with their defaults (what they export to serve: spark_checkpoint_dir, spark_ple_pack_file)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    def load(*parts):
        with open(os.path.join(ROOT, "roles", *parts)) as handle:
            return {k: trust_as_template(v) if isinstance(v, str) else v for k, v in yaml.safe_load(handle).items()}

    preflight = load("preflight", "vars", "main.yml")
    common = load("common", "defaults", "main.yml")
    for extra in ({}, {"ple_enabled": False}, {"spark_model_name": "other"}):
        roles = dict(common, **load("checkpoint", "defaults", "main.yml"))
        roles.update(load("ple", "defaults", "main.yml"))
        roles.update(extra)
        templar = Templar(loader=DataLoader(), variables=dict(roles, **preflight))
        assert templar.template(trust_as_template("{{ __preflight_checkpoint_dir }}")) == \
            templar.template(trust_as_template("{{ checkpoint_dir }}"))
        bare = Templar(loader=DataLoader(), variables=dict(common, **dict(preflight, **extra)))
        assert bare.template(trust_as_template("{{ __preflight_checkpoint_dir }}")) == \
            templar.template(trust_as_template("{{ checkpoint_dir }}"))
        wanted = templar.template(trust_as_template("{{ ple_pack_file if ple_enabled else '' }}")).strip()
        assert bare.template(trust_as_template("{{ __preflight_ple_pack_file }}")).strip() == wanted, extra
