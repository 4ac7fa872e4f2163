"""Several models on one lab Spark under one host plan (SPEC §13, docs/runtime.md "Several models on
one Spark"): two tiny models, each fetched into its own folder by the checkpoint role (as site.yml's
model play does, from the lab's share), served at once, each by its own unit, container and port with its share
of the plan, each answering and each KV pool within 10 % of its plan; the one server the Spark had
before is removed first; verify.yml reports on each model's server; rollout.yml rolls the models'
servers one after the other, each with a new checkpoint revision, and a model whose new start fails
is put back (its checkpoint switched back) while the one rolled before it keeps its new configuration
and revision and no later model is touched; the next rollout switches the failed model's staged revision in
and leaves the other alone; a model's rollout killed after its switch leaves its server
answering, drained, and the run after it restarts, gates and releases; a memwatch drill stops only
the lower-priority model while the other answers throughout; then a model taken out of spark_models leaves no unit, container, env or file of
its own behind, and the other keeps serving, not restarted.

Runs last in the scenario (its server is the scenario's last state; the scenario's destroy removes
the lab Spark only, so the module's last step stops both models' containers on the shared engine)."""
import json
import os
import shlex
import time

import pytest

from test_unit_semantics import PROJECT, _converge, _playbook_command, prop, wait_for
from interrupt import run_and_kill_when   # noqa: E402 tests/support, put on the path by test_unit_semantics
from lab_key import curl_auth   # noqa: E402 tests/support, put on the path by test_unit_semantics

SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "serve")
CONTAINER = "sparkops-molecule-%s-vllm" % SCENARIO      # spark_serve_container_name of the scenario
MODELS = [{"name": "tiny-chat", "priority": 10, "port": 8000},
          {"name": "tiny-embed", "priority": 5, "port": 8001}]
# the tiny model's plan inputs, as the lab gives the one model (inventories/lab lab_overrides.yml)
TINY = {"weight_bytes": 16777216, "overhead_gib": 1.0, "mtp_gib": 0, "max_model_len": 1024,
        "kv_bytes_per_token": 512, "kv_cache_dtype": "auto", "kv_target_gib": 0.0625,
        "max_num_seqs": 4, "max_num_batched_tokens": 1024,
        # each model's own checkpoint, fetched by the collection into spark_model_dir/<name> (the lab's
        # read-only share of the tiny model, as the lab gives the one model: lab_overrides.yml)
        "checkpoint_source": "path", "checkpoint_src_path": "/srv/lab-source/tiny-llama"}
PLAY = """\
- name: Several models on the lab Spark, under one host plan
  hosts: sparks
  gather_facts: true           # the runtime image and serve read the architecture, as the converge
  vars:
    spark_models: %s
  roles:
    - role: sparkops.appliance.common   # spark_models and spark_model_dir, as site.yml's plays have them
  tasks:
    # as site.yml's model play: each model's checkpoint into spark_model_dir/<name>, checked and verified
    - name: Fetch and verify each model's checkpoint (spark_models)
      ansible.builtin.include_role:
        name: sparkops.appliance.checkpoint
        tasks_from: models
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
DRILL = "/var/lib/sparkops-drill"
# memwatch as site.yml installs it for these models, reading memory from a file the test writes
MEMWATCH_PLAY = """\
- name: memwatch for the Spark's models, reading meminfo from the drill's file
  hosts: sparks
  gather_facts: true
  vars:
    spark_models: %s
  roles:
    - role: sparkops.appliance.memwatch
      vars:
        memwatch_meminfo_path: %s/meminfo
"""
KIB_PER_GIB = 1024 * 1024
# verify.yml at the tiny models' shape, one short round (as the production scenario runs it)
VERIFY_SMALL = {"verify_prompt_tokens": 32, "verify_max_tokens": 8, "verify_requests": 2, "verify_concurrency": 1,
                "verify_rounds": 1, "verify_round_requests": 2, "verify_settle_s": 1, "verify_band_gib": 4}
# The rollout's change: tiny-chat a new seed (it starts and passes its gate), tiny-embed a tokenizer its
# parser accepts but vLLM cannot load (as the rollout scenario's bad rollout). tiny-chat keeps its seed
# from then on (the removal test serves it so, not restarting it).
ROLLED_CHAT = ["--seed", "7"]
BAD_EMBED = ["--tokenizer", "/nonexistent/tokenizer"]
# ... and each model a new checkpoint revision (the copies the fixture fetched record none): the rollout
# stages each beside its folder, switches tiny-chat's in and releases the old copy after its gate, and
# switches tiny-embed's back when its start fails (the new copy kept staged).
ROLLED_REVISION = "lab-r2"
NEXT_REVISION = "lab-r3"      # tiny-embed's next, in the interrupted rollout
MODEL_DIR = "/srv/sparkops/models"      # spark_model_dir (roles/common)
# The poller: one completion of the higher-priority model every 0.5 s, each answer's HTTP code on a line.
POLLER = ("while :; do curl -s -o /dev/null -w '%%{http_code}\\n' --max-time 20 %s http://127.0.0.1:8000/v1/completions "
          "-H 'Content-Type: application/json' -d '{\"model\": \"tiny-chat\", \"prompt\": \"hello\", \"max_tokens\": 4}' "
          ">> %s/poll.log; sleep 0.5; done")


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


def playbook(tmp_path, name, models, extra=None):
    """playbooks/<name> as a user runs it, with spark_models for the lab Spark (an extra var) and the
    scenario's group_vars beside it (as "playbook group_vars", the way the scenario's converge gets them)."""
    r = _converge(*playbook_args(models, extra), playbook=playbooks(tmp_path) / name)
    return r.returncode, r.stdout + r.stderr


def playbooks(tmp_path):
    """playbooks/ for the tests: the project's playbooks with the scenario's group_vars beside them."""
    here = tmp_path / "playbooks"
    if not here.exists():
        here.mkdir()
        for entry in ("rollout.yml", "verify.yml", "tasks", "files"):
            (here / entry).symlink_to(os.path.join(PROJECT, "playbooks", entry))
        (here / "group_vars").symlink_to(os.path.join(PROJECT, "molecule", SCENARIO, "group_vars"))
    return here


def playbook_args(models, extra=None):
    """spark_models (and any other extra vars) for the lab Spark, as one -e."""
    return ["-e", json.dumps(dict(extra or {}, spark_models=[dict(TINY, **m) for m in models]))]


def container_id(host, model):
    return host.check_output("docker inspect -f '{{.Id}}' %s" % container(model))


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
    host.run("systemctl stop memwatch.service")
    for model in MODELS:
        host.run("systemctl stop %s.service; docker rm -f %s" % (unit(model), container(model)))


def test_two_models_serve_at_once_each_within_its_kv_plan(host, served):
    _tmp, out = served
    # the one server the Spark had is gone first: its unit, env file and container
    assert prop(host, "sparkops-serve.service", "LoadState") == "not-found"
    assert not host.file("/etc/sparkops/sparkops-serve.env").exists
    assert not running(host, CONTAINER)
    assert "no longer serves (the one model)" in " ".join(out.split()), out[-3000:]
    # each model's checkpoint fetched and verified by the checkpoint role into its own folder, in order
    said = " ".join(out.split())
    reports = [said.find("spark_models[%d] (%s) /srv/sparkops/models/%s:" % (i, m["name"], m["name"]))
               for i, m in enumerate(MODELS)]
    assert -1 not in reports and reports == sorted(reports), said[-3000:]
    for model in MODELS:
        assert host.file("/srv/sparkops/models/%s/.sparkops-manifest.json" % model["name"]).is_file
        assert not host.file("/srv/sparkops/models/%s.staged" % model["name"]).exists
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


def test_verify_reports_each_models_server(host, served):
    tmp_path, _out = served
    ids = [container_id(host, model) for model in MODELS]
    reports = tmp_path / "verify"
    rc, out = playbook(tmp_path, "verify.yml", MODELS, dict(VERIFY_SMALL, verify_report_dir=str(reports)))
    assert rc == 0, out[-6000:]
    names = [p.name for p in reports.iterdir()]
    (chat_report,) = [name for name in names if name.endswith("-tiny-chat.json")]
    hostname = chat_report[:-len("-tiny-chat.json")]
    for model in MODELS:
        report = json.loads((reports / ("%s-%s.json" % (hostname, model["name"]))).read_text())
        assert report["model"] == model["name"], report["model"]
        assert report["load"]["failed_requests"] == 0 and report["load"]["concurrency"]["requests"] > 0, report["load"]
        planned = report["plan"]["kv_cache_memory_bytes"] / 2.0 ** 30
        assert report["startup"]["kv_plan_gib"] == round(planned, 4), report["startup"]
        assert abs(report["startup"]["now"]["kv_cache_gib"] - planned) <= 0.1 * planned, report["startup"]
        assert (reports / ("%s-%s-memory.png" % (hostname, model["name"]))).exists()
        print("verify %s: KV plan %.4f GiB, vLLM %.4f GiB, %d requests, 0 failed" % (
            model["name"], planned, report["startup"]["now"]["kv_cache_gib"], report["load"]["concurrency"]["requests"]))
    assert sorted(names) == sorted("%s-%s%s" % (hostname, m["name"], end) for m in MODELS for end in (".json", "-memory.png"))
    # verify changes nothing: neither server restarted
    assert [container_id(host, model) for model in MODELS] == ids


def test_rollout_rolls_one_models_server_at_a_time_and_puts_a_failed_one_back(host, served):
    tmp_path, _out = served
    chat, embed = MODELS
    before = {m["name"]: container_id(host, m) for m in MODELS}
    embed_unit = host.file("/etc/systemd/system/%s.service" % unit(embed)).content_string
    rolled = [dict(chat, extra_args=ROLLED_CHAT, checkpoint_revision=ROLLED_REVISION),
              dict(embed, extra_args=BAD_EMBED, checkpoint_revision=ROLLED_REVISION)]
    rc, out = playbook(tmp_path, "rollout.yml", rolled)
    flat = " ".join(out.split())
    assert rc != 0, out[-6000:]
    # the failure names the model, and its server runs its previous configuration again, healthy
    assert "rollout stopped at" in flat and "model tiny-embed (%s)" % unit(embed) in flat, out[-6000:]
    assert "runs its previous image, unit and env again and is healthy" in flat, out[-6000:]
    # one model's server at a time: tiny-chat drained, restarted and gated before tiny-embed was drained
    order = [line for line in out.splitlines() if line.startswith("TASK [")
             and ("Drain this model's server" in line or "Note that this model's server passed its gate" in line
                  or "Put this model's last good unit" in line)]
    assert [line[len("TASK ["):].split("]")[0].split(" : ")[-1] for line in order] == [
        "Drain this model's server - out of its backend, no request running or waiting",
        "Note that this model's server passed its gate",
        "Drain this model's server - out of its backend, no request running or waiting",
        "Put this model's last good unit and env back (the play's last task stops the rollout)"], order
    # tiny-chat: restarted once, onto its new seed, and serving
    assert container_id(host, chat) != before[chat["name"]]
    args = json.loads(host.check_output("docker inspect -f '{{json .Args}}' %s" % container(chat)))
    assert args[args.index("--seed") + 1] == "7", args
    assert complete(host, chat)["usage"]["completion_tokens"] > 0
    # tiny-embed: its unit as before the rollout (no bad tokenizer), active, answering
    assert host.file("/etc/systemd/system/%s.service" % unit(embed)).content_string == embed_unit
    assert "/nonexistent/tokenizer" not in host.check_output("docker inspect -f '{{json .Args}}' %s" % container(embed))
    wait_for("tiny-embed active", lambda: prop(host, unit(embed) + ".service", "ActiveState") == "active", 60)
    assert complete(host, embed)["usage"]["completion_tokens"] > 0
    # neither is left marked drained
    for model in MODELS:
        state = rollout_state(host, model)
        assert state["drained"] is False, (model, state)
    # each model's own checkpoint: tiny-chat's new revision switched in and the old copy released after
    # its gate; tiny-embed's switched back (its folder as served before, the new copy staged beside it)
    # (the checkpoint role's reports: tiny-chat's switch; tiny-embed's switch, then its switch back)
    switch = ("(%(m)s) %(d)s/%(m)s: rename %(d)s/%(m)s -> %(d)s/%(m)s.previous; rename %(d)s/%(m)s.staged -> %(d)s/%(m)s. "
              "The server must restart to load it")
    back = "(%(m)s) %(d)s/%(m)s: rename %(d)s/%(m)s -> %(d)s/%(m)s.staged; rename %(d)s/%(m)s.previous -> %(d)s/%(m)s"
    for model in MODELS:
        assert switch % {"m": model["name"], "d": MODEL_DIR} in flat, (model, out[-6000:])
    assert back % {"m": embed["name"], "d": MODEL_DIR} in flat, out[-6000:]
    assert back % {"m": chat["name"], "d": MODEL_DIR} not in flat
    assert revision_of(host, chat["name"]) == ROLLED_REVISION
    assert revision_of(host, embed["name"]) == ""
    assert revision_of(host, embed["name"] + ".staged") == ROLLED_REVISION
    for left in (chat["name"] + ".staged", chat["name"] + ".previous", embed["name"] + ".previous"):
        assert not host.file("%s/%s" % (MODEL_DIR, left)).exists, left


def test_a_second_rollout_after_the_failed_one_switches_the_staged_revision_in(host, served):
    """The run after the failed rollout above, tiny-embed's bad tokenizer taken out: tiny-embed's new
    revision, left staged by that run's switch back, is switched in, its server
    restarts onto it, passes its gate, and the copy served before is released; tiny-chat, rolled
    already, is not restarted."""
    tmp_path, _out = served
    chat, embed = MODELS
    before = {m["name"]: container_id(host, m) for m in MODELS}
    assert revision_of(host, embed["name"] + ".staged") == ROLLED_REVISION     # as the failed run left it
    rolled = [dict(chat, extra_args=ROLLED_CHAT, checkpoint_revision=ROLLED_REVISION),
              dict(embed, checkpoint_revision=ROLLED_REVISION)]
    rc, out = playbook(tmp_path, "rollout.yml", rolled)
    flat = " ".join(out.split())
    assert rc == 0, out[-6000:]
    switch = ("(%(m)s) %(d)s/%(m)s: rename %(d)s/%(m)s -> %(d)s/%(m)s.previous; rename %(d)s/%(m)s.staged -> %(d)s/%(m)s. "
              "The server must restart to load it" % {"m": embed["name"], "d": MODEL_DIR})
    assert switch in flat, out[-6000:]
    assert "serve: %s.service restarts: its checkpoint was switched." % unit(embed) in flat, out[-6000:]
    assert_rolled_in_and_released(host, embed, ROLLED_REVISION, before)
    assert rollout_state(host, chat)["drained"] is False, rollout_state(host, chat)


def test_a_model_rollout_killed_after_its_switch_ends_served_and_the_next_run_finishes_it(host, served):
    """A rollout of tiny-embed's next revision killed (its whole process group, as a lost controller
    or a Ctrl-C would leave it) the moment the new copy is switched in, before its server restarts:
    the server still answers from the copy it bound at its start, marked drained, the new copy in the
    model's folder and the old one kept as <folder>.previous. The next run, with the same change
    (nothing left to stage), finds the drain, restarts the server onto the new copy, gates it and
    releases the old one; tiny-chat is restarted by neither run."""
    tmp_path, _out = served
    chat, embed = MODELS
    before = {m["name"]: container_id(host, m) for m in MODELS}
    folder = "%s/%s" % (MODEL_DIR, embed["name"])
    switched = "test -d %s.previous && test ! -e %s.staged" % (folder, folder)
    assert host.run(switched).rc != 0
    rolled = [dict(chat, extra_args=ROLLED_CHAT, checkpoint_revision=ROLLED_REVISION),
              dict(embed, checkpoint_revision=NEXT_REVISION)]
    argv, env = _playbook_command(*playbook_args(rolled), playbook=playbooks(tmp_path) / "rollout.yml")
    killed, returncode, first = run_and_kill_when(argv, tmp_path / "killed-rollout.log",
                                                  lambda: host.run(switched).rc == 0, env=env, cwd=PROJECT)
    assert killed, "the run ended (rc %s) before its switch: %s" % (returncode, first[-4000:])
    # switched, not restarted: the server still answers, from the copy it bound at its start
    assert revision_of(host, embed["name"]) == NEXT_REVISION
    assert revision_of(host, embed["name"] + ".previous") == ROLLED_REVISION
    assert container_id(host, embed) == before[embed["name"]], "the server restarted before the kill"
    assert complete(host, embed)["usage"]["completion_tokens"] > 0
    assert rollout_state(host, embed)["drained"] is True, rollout_state(host, embed)

    rc, out = playbook(tmp_path, "rollout.yml", rolled)
    flat = " ".join(out.split())
    assert rc == 0, out[-6000:]
    assert "serve: %s.service restarts: an earlier rollout left this server drained." % unit(embed) in flat, out[-6000:]
    assert_rolled_in_and_released(host, embed, NEXT_REVISION, before)


def revision_of(host, folder):
    """The revision the checkpoint role's manifest records for spark_model_dir/<folder> ('' for none)."""
    manifest = json.loads(host.file("%s/%s/.sparkops-manifest.json" % (MODEL_DIR, folder)).content_string)
    return manifest.get("revision") or ""


def rollout_state(host, model):
    """What the rollout notes of this model's server (/etc/sparkops/<unit>.rollout.json)."""
    return json.loads(host.file("/etc/sparkops/%s.rollout.json" % unit(model)).content_string)


def assert_rolled_in_and_released(host, model, revision, before):
    """`model`'s server restarted onto `revision`, answering and not drained, nothing left beside its
    folder; every other model's server not restarted (the same container as in `before`) and answering."""
    assert revision_of(host, model["name"]) == revision
    for left in (model["name"] + ".staged", model["name"] + ".previous"):
        assert not host.file("%s/%s" % (MODEL_DIR, left)).exists, left
    assert container_id(host, model) != before[model["name"]]
    assert complete(host, model)["usage"]["completion_tokens"] > 0
    state = rollout_state(host, model)
    assert state["drained"] is False, state
    for other in MODELS:
        if other["name"] != model["name"]:
            assert container_id(host, other) == before[other["name"]], other["name"]
            assert complete(host, other)["usage"]["completion_tokens"] > 0


def drill_meminfo(host, avail_gib, free_gib, name="meminfo"):
    """The drill's meminfo (as the production scenario's drill writes it), replaced whole."""
    text = ("MemTotal:       24683000 kB\\nMemFree:        %d kB\\nMemAvailable:   %d kB\\n"
            "Cached:         3000000 kB\\nAnonPages:      3000000 kB\\nShmem:          20000 kB\\n"
            "Slab:           900000 kB\\nPageTables:     65000 kB\\n"
            % (free_gib * KIB_PER_GIB, avail_gib * KIB_PER_GIB))
    host.run_test("mkdir -p %s && printf '%s' > %s/%s.tmp && mv %s/%s.tmp %s/%s"
                  % (DRILL, text, DRILL, name, DRILL, name, DRILL, name))


def test_a_memwatch_drill_stops_only_the_lower_priority_model_and_the_other_answers_throughout(host, served):
    tmp_path, _out = served
    chat, embed = MODELS
    drill_meminfo(host, 12, 8)                                  # healthy
    play = tmp_path / "memwatch.yml"
    play.write_text(MEMWATCH_PLAY % (json.dumps(MODELS), DRILL))
    r = _converge(playbook=play)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    config = json.loads(host.file("/etc/sparkops/memwatch.json").content_string)
    assert [t["unit"] for t in config["targets"]] == [unit(embed) + ".service", unit(chat) + ".service"]
    before = host.check_output("docker inspect -f '{{.Id}}' %s" % container(chat))
    host.run("systemctl stop drill-poller drill-restore; systemctl reset-failed drill-poller drill-restore; rm -f %s/poll.log" % DRILL)
    host.run_expect([0], "systemd-run --unit drill-poller --collect /bin/sh -c %s"
                    % shlex.quote(POLLER % (curl_auth(), DRILL)))
    # memory back as soon as the lower-priority server is down (else memwatch, re-armed, would stop the
    # next one after its consecutive samples: that is its rule, not what this drill shows)
    drill_meminfo(host, 12, 8, name="healthy")
    restore = ("while :; do s=$(systemctl is-active %s.service); [ \"$s\" = inactive ] || [ \"$s\" = failed ] && break; "
               "sleep 0.2; done; cp %s/healthy %s/m.tmp && mv %s/m.tmp %s/meminfo" % (unit(embed), DRILL, DRILL, DRILL, DRILL))
    host.run_expect([0], "systemd-run --unit drill-restore --collect /bin/sh -c %s" % shlex.quote(restore))
    try:
        wait_for("the poller's first answers", lambda: host.run("grep -c 200 %s/poll.log" % DRILL).stdout.strip() not in ("", "0"), 60)
        drill_meminfo(host, 4, 1)                               # rule A: MemAvailable < 6 GiB
        wait_for("memwatch to stop %s" % unit(embed),
                 lambda: prop(host, unit(embed) + ".service", "ActiveState") in ("inactive", "failed"), 120)
        assert prop(host, unit(embed) + ".service", "ActiveState") == "inactive"       # a clean stop
        time.sleep(10)                        # past memwatch's consecutive samples once more: nothing else stops
    finally:
        host.run("systemctl stop drill-poller drill-restore")
    assert prop(host, unit(chat) + ".service", "ActiveState") == "active"
    assert host.check_output("docker inspect -f '{{.Id}}' %s" % container(chat)) == before
    codes = host.check_output("cat %s/poll.log" % DRILL).split()
    print("drill: tiny-chat answered %d of %d requests while memwatch stopped tiny-embed" % (codes.count("200"), len(codes)))
    assert len(codes) >= 10 and set(codes) == {"200"}, codes
    metrics = host.file("/var/lib/prometheus/node-exporter/memwatch.prom").content_string
    acted = [line for line in metrics.splitlines() if line.startswith("memwatch_target_actions_total{")
             and not line.endswith(" 0")]
    assert acted and all('model="tiny-embed"' in line for line in acted), acted


def test_a_removed_model_leaves_nothing_behind_and_the_other_keeps_serving(host, served):
    tmp_path, _out = served
    chat, embed = MODELS
    before = host.check_output("docker inspect -f '{{.Id}}' %s" % container(chat))
    out = run(tmp_path, [dict(chat, extra_args=ROLLED_CHAT)])   # as the rollout test left it
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
