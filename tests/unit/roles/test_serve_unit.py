"""The serve role's unit, env file and recycle units, rendered by Ansible from the role's own
defaults and vars, are accepted by systemd-analyze verify; a broken render is rejected; quoting
survives JSON; the recycle job does not depend on the server (a restart would propagate to it);
the unit's helper (roles/serve/files/serve-unit) spares held /dev/shm objects, bounds failed
starts and treats a vanished container as stopped; the recycle script restarts an idle server
once and never a busy or stopped one; a bad recycle calendar is refused naming the variable."""
import json
import os
import re
import stat
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import harness

ROOT = harness.ROOT
ROLE = os.path.join(ROOT, "roles", "serve")
HELPER = os.path.join(ROLE, "files", "serve-unit")

PLAN = {"gmu": 0.786, "kv_cache_memory_bytes": 18049635041, "docker_memory_gib": 100.65,
        "docker_memory_bytes": 108072616755, "budget_gib": 95.65, "budget_bytes": 102703468789, "kv_exp_gib": 16.81,
        "inputs": {"max_model_len": 262144, "max_num_seqs": 8, "max_num_batched_tokens": 8192,
                   "kv_cache_dtype": "fp8", "mtp_enabled": True, "mtp_num_speculative_tokens": 3}}


# Every variant the tests read, rendered by ONE ansible-playbook start (one host per variant, all
# on this machine). Each host's variables come in as the play's last vars_files entry, after the
# role's defaults and vars, so they win over both exactly as the -e of one run per variant did (the
# play sets no facts and includes no vars that -e would also have outranked).
VARIANTS = {
    "default": {},
    # the plan was made with MTP off
    "bytes": {"serve_kv_sizing": "bytes", "serve_api_key": "s3cr%t$x",
              "spark_memory_plan": dict(PLAN, inputs=dict(PLAN["inputs"], mtp_enabled=False))},
    "cache": {"serve_cache_dir": "/data/vllm-cache"},
}
HAS_SYSTEMD_ANALYZE = shutil.which("systemd-analyze") is not None

RENDER_PLAYBOOK = """\
- hosts: "sparks:!calendar"
  gather_facts: true
  gather_subset: [min]
  vars_files:
    - %(common)s/defaults/main.yml
    - %(role)s/defaults/main.yml
    - %(role)s/vars/main.yml
    - "{{ case_vars_file }}"
  tasks:
    - ansible.builtin.template:
        src: %(role)s/templates/serve.service.j2
        dest: "{{ out }}/sparkops-serve.service"
        mode: "0644"
    - ansible.builtin.template:
        src: %(role)s/templates/serve.env.j2
        dest: "{{ out }}/sparkops-serve.env"
        mode: "0600"
    - ansible.builtin.template:
        src: "%(role)s/templates/serve-recycle.{{ item }}.j2"
        dest: "{{ out }}/sparkops-serve-recycle.{{ item }}"
        mode: "0755"
      loop: [service, timer, sh]
"""
CALENDAR_PLAY = """\
- hosts: calendar
  gather_facts: false
  tasks:
    - name: a good value passes
      ansible.builtin.include_tasks: %(role)s/tasks/recycle_calendar.yml
      vars:
        serve_recycle_on_calendar: "*-*-* 04:00:00"
    - block:
        - ansible.builtin.include_tasks: %(role)s/tasks/recycle_calendar.yml
          vars:
            serve_recycle_on_calendar: "every day; rm -rf /"
        - ansible.builtin.fail:
            msg: NOT REFUSED
      rescue:
        - ansible.builtin.copy:
            content: "{{ ansible_failed_result.msg }}"
            dest: "{{ out }}/refusal.txt"
            mode: "0644"
"""


@pytest.fixture(name="renders", scope="module")
def fixture_renders(tmp_path_factory):
    """{variant: the directory its files were rendered to}; "calendar": where the calendar check wrote;
    "run": the ansible-playbook run (default stdout callback)."""
    base = tmp_path_factory.mktemp("render")
    hosts, outs = {}, {}
    for name, extra in VARIANTS.items():
        out = base / name
        out.mkdir()
        case_vars = {"spark_memory_plan": PLAN, "spark_model_dir": "/srv/sparkops/models",
                     "spark_model_name": "gemma-3n",
                     "serve_image": "sparkops/vllm-runtime:0123456789ab", "out": str(out),
                     "ansible_python_interpreter": sys.executable,
                     # where systemd-analyze verify finds the executables on this machine
                     "__serve_helper": HELPER,
                     "__serve_recycle_script": str(out / "sparkops-serve-recycle.sh")}
        case_vars.update(extra)
        (out / "vars.json").write_text(json.dumps(case_vars))
        hosts[name] = {"case_vars_file": str(out / "vars.json")}
        outs[name] = out
    text = RENDER_PLAYBOOK
    if HAS_SYSTEMD_ANALYZE:  # the calendar check needs the host's systemd-analyze
        outs["calendar"] = base / "calendar"
        outs["calendar"].mkdir()
        hosts["calendar"] = {"out": str(outs["calendar"])}
        text += CALENDAR_PLAY
    playbook = base / "render.yml"
    playbook.write_text(text % {"role": ROLE, "common": os.path.join(ROOT, "roles", "common")})
    r = harness.run_playbook(playbook, inventory=harness.batch_inventory(base, hosts), connection=None,
                             env=harness.ansible_env(stdout_callback=None))
    assert r.returncode == 0, r.stdout + r.stderr
    outs["run"] = r
    return outs


def render(renders, variant="default"):
    out = renders[variant]
    return (out / "sparkops-serve.service"), (out / "sparkops-serve.env")


needs_systemd = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or not os.path.exists("/usr/bin/docker"),
    reason="systemd-analyze and /usr/bin/docker are needed to verify the unit")


def verify(unit):
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False)


@needs_systemd
def test_rendered_unit_verifies_and_a_broken_one_does_not(renders, tmp_path):
    unit, _env = render(renders)
    r = verify(unit)
    assert r.returncode == 0, r.stderr
    broken = tmp_path / "broken" / "sparkops-serve.service"
    broken.parent.mkdir()
    broken.write_text(unit.read_text().replace("ExecStart=" + HELPER, "ExecStart=helper-nowhere"))
    assert verify(broken).returncode != 0


def test_command_line_carries_the_plan_and_the_mtp_json(renders):
    unit, env = render(renders)
    text = unit.read_text()
    assert "--gpu-memory-utilization 0.786" in text
    assert "--memory 108072616755 --memory-swap 108072616755" in text
    assert "--kv-cache-dtype fp8 --max-model-len 262144 --max-num-seqs 8" in text
    assert "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'" in text
    assert "--gpus all" in text and "--ipc host" in text
    # an init reaps what vLLM's forked workers leave; an open-files limit a long context does not hit
    assert "--ulimit nofile=65536:65536" in text and " --init " in text
    assert "docker stop -t 30 sparkops-vllm" in text and "TimeoutStopSec=60" in text
    assert "StartLimitBurst=3" in text and "Restart=on-failure" in text
    assert oct(env.stat().st_mode & 0o777) == "0o600"
    assert "LD_PRELOAD=/usr/lib/" in env.read_text()


def test_bytes_sizing_and_secrets_stay_off_the_command_line(renders):
    # VARIANTS["bytes"]: serve_kv_sizing=bytes, serve_api_key="s3cr%t$x", a plan made with MTP off
    unit, env = render(renders, "bytes")
    text = unit.read_text()
    assert "--kv-cache-memory-bytes 18049635041" in text
    assert "--gpu-memory-utilization" not in text and "--speculative-config" not in text
    assert "s3cr" not in text
    assert "VLLM_API_KEY=s3cr%t$x" in env.read_text()


def test_model_comes_from_the_shared_model_variables(renders):
    unit, _env = render(renders)
    text = unit.read_text()
    assert "/srv/sparkops/models/gemma-3n:/model:ro" in text
    assert "--served-model-name gemma-3n" in text


def test_vllm_cache_is_kept_on_the_host(renders):
    """VLLM_CACHE_ROOT is a host directory: a restart of the --rm container finds what the last start wrote."""
    unit, env = render(renders)
    assert " --volume=/var/cache/sparkops/vllm:/var/cache/vllm " in unit.read_text()
    assert "VLLM_CACHE_ROOT=/var/cache/vllm" in env.read_text().splitlines()
    unit, _env = render(renders, "cache")   # serve_cache_dir=/data/vllm-cache
    assert " --volume=/data/vllm-cache:/var/cache/vllm " in unit.read_text()


# --- the unit's semantics (SPEC §6) -----------------------------------------------------------

def test_unit_uses_the_helper_for_shm_start_bound_and_stop(renders):
    rendered = renders["default"]
    unit, _env = render(renders)
    text = unit.read_text()
    assert "find /dev/shm" not in text and "-delete" not in text
    assert "ExecStartPre=%s shm-clean --dir /dev/shm 'vllm*' 'psm_*'" % HELPER in text
    assert ("ExecStart=%s run --unit sparkops-serve.service --state-dir /run/sparkops/serve --max-failed-starts 3 "
            "--max-crashes 5 --crash-window-s 3600 --model gemma-3n --api-key-file /etc/sparkops/sparkops-serve.env --stop-grace-s 30 "
            "--liveness-interval-s 10 --liveness-stall-s 45 --probe-timeout-s 30 --liveness-max-restarts 3 "
            "--liveness-window-s 3600 --liveness-backoff-s 30 --liveness-dir /var/lib/sparkops/serve/sparkops-serve-liveness "
            "--liveness-keep 10 --metrics-file /var/lib/prometheus/node-exporter/sparkops-serve-liveness.prom "
            "--plan-kv-bytes 18049635041 --health-url http://127.0.0.1:8000/health --health-timeout-s 1200 --container sparkops-vllm -- \\\n"
            "    /usr/bin/docker run --rm --name sparkops-vllm" % HELPER) in text
    # Type=notify: the start lasts until READY=1 (ExecStartPre 120 s + backoff 30 x 2^2 + health 1200 + probe 30);
    # the watchdog outlasts one look (10 + 10 + 30) and a stall's stop (30 + 60), plus 30 s
    assert "\nType=notify\nNotifyAccess=main\nWatchdogSec=120\n" in text
    assert "\nTimeoutStartSec=1470\n" in text
    assert ("ExecStop=%s stop --unit sparkops-serve.service --state-dir /run/sparkops/serve --max-failed-starts 3 "
            "--max-crashes 5 --crash-window-s 3600 -- /usr/bin/docker stop -t 30 sparkops-vllm\n" % HELPER) in text
    assert "ExecStopPost=%s stop-post --unit sparkops-serve.service" % HELPER in text
    assert "RestartPreventExitStatus=78\n" in text
    recycle = (rendered / "sparkops-serve-recycle.service").read_text()
    unit_section = recycle.split("[Service]")[0]
    for line in unit_section.splitlines():
        if line.startswith(("Requires=", "Requisite=", "BindsTo=", "PartOf=", "After=", "Upholds=", "Wants=")):
            raise AssertionError("the recycle job depends on the server (a restart propagates to it): " + line)
    # the drain (900), its last reading's probe (30), the old server's stop (60) and the new start up to
    # /health (1200), and 60 s
    assert "\nTimeoutStartSec=2250\n" in recycle
    script = (rendered / "sparkops-serve-recycle.sh").read_text()
    assert "ready_s=${SPARKOPS_RECYCLE_READY_TIMEOUT_S:-1260}\n" in script
    assert "systemctl try-restart --no-block \"$unit\"" in script
    assert "systemctl restart" not in script


def test_the_recycle_waits_for_its_slot_in_the_fleet(renders, tmp_path):
    """The render's hosts are a fleet of "sparks" in this order: default, bytes, cache. The second
    waits one slot (1800 s) after the timer fires; its service's timeout counts the wait too."""
    first = (renders["default"] / "sparkops-serve-recycle.sh").read_text()
    second = (renders["bytes"] / "sparkops-serve-recycle.sh").read_text()
    assert "delay_s=${SPARKOPS_RECYCLE_DELAY_S:-0}\n" in first
    assert "delay_s=${SPARKOPS_RECYCLE_DELAY_S:-1800}\n" in second
    # the slot 1800, the drain 900, its last reading's probe 30, the stop 60 and the health timeout 1200,
    # a margin of 60
    assert "\nTimeoutStartSec=4050\n" in (renders["bytes"] / "sparkops-serve-recycle.service").read_text()
    d = tmp_path / "fake"
    d.mkdir()
    (d / "state").write_text("inactive\n")
    bindir = fake_bin(tmp_path, "systemctl", FAKE_SYSTEMCTL % {"d": d})
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), SPARKOPS_RECYCLE_DELAY_S="2")
    t0 = time.monotonic()
    r = subprocess.run(["/bin/sh", str(renders["bytes"] / "sparkops-serve-recycle.sh")], capture_output=True, text=True,
                       env=env, timeout=60, check=False)
    assert r.returncode == 0 and "waiting 2 s for this host's recycle slot" in r.stdout, r.stdout + r.stderr
    assert time.monotonic() - t0 >= 2


@needs_systemd
def test_recycle_units_verify(renders):
    rendered = renders["default"]
    script = rendered / "sparkops-serve-recycle.sh"
    script.chmod(0o755)
    r = verify(rendered / "sparkops-serve-recycle.service")
    assert r.returncode == 0, r.stderr
    r = verify(rendered / "sparkops-serve-recycle.timer")
    assert r.returncode == 0, r.stderr


def helper(*args, env=None, check=False):
    return subprocess.run([sys.executable, HELPER] + list(args), capture_output=True, text=True,
                          env=env, check=check, timeout=60)


HOLDER = """
import mmap, sys, time
held = open(sys.argv[1], 'w+b'); held.write(b'x' * 4096); held.flush()
m = open(sys.argv[2], 'w+b'); m.write(b'y' * 4096); m.flush()
mapped = mmap.mmap(m.fileno(), 4096); m.close()
print('ready', flush=True)
time.sleep(120)
"""


def test_shm_clean_spares_objects_a_live_process_holds(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    held, mapped = shm / "vllm-held", shm / "psm_mapped"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(held), str(mapped)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        for name in ("vllm-stale", "psm_stale", "unrelated"):
            (shm / name).write_bytes(b"z")
        (shm / "vllm-dir").mkdir()
        r = helper("shm-clean", "--dir", str(shm), "vllm*", "psm_*")
        assert r.returncode == 0, r.stderr
        assert sorted(p.name for p in shm.iterdir()) == ["psm_mapped", "unrelated", "vllm-dir", "vllm-held"]
        assert "kept %s" % held in r.stderr and "kept %s" % mapped in r.stderr
    finally:
        holder.kill()
        holder.wait()
    r = helper("shm-clean", "--dir", str(shm), "vllm*", "psm_*")
    assert sorted(p.name for p in shm.iterdir()) == ["unrelated", "vllm-dir"]


def fake_bin(tmp_path, name, body):
    d = tmp_path / "bin"
    d.mkdir(parents=True, exist_ok=True)
    f = d / name
    f.write_text("#!/bin/sh\n" + body)
    f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return d


def test_failed_starts_are_bounded_whatever_their_length(tmp_path):
    nrestarts = tmp_path / "nrestarts"
    bindir = fake_bin(tmp_path, "systemctl", 'cat "%s"\n' % nrestarts)
    state = tmp_path / "state"
    base = ["--unit", "x.service", "--state-dir", str(state), "--max-failed-starts", "3"]
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]))
    count = state / "x.service.failed-starts"

    def start(n, command, invocation, result="exit-code", code="exited"):
        nrestarts.write_text("%d\n" % n)
        e = dict(env, INVOCATION_ID=invocation)
        r = helper("run", *base, "--", "/bin/sh", "-c", command, env=e)
        status = r.returncode
        post_env = dict(e, SERVICE_RESULT=result if status else "success", EXIT_CODE=code, EXIT_STATUS=str(status))
        helper("stop-post", *base, env=post_env, check=True)
        return r

    # A start by hand and two restarts of systemd's own fail: three failed starts ...
    for n in range(3):
        assert start(n, "exit 1", "inv%d" % n).returncode == 1
        assert count.read_text() == "%d\n" % (n + 1)
    # ... and the third restart is refused, with a status that systemd does not restart.
    r = start(3, "exit 0", "inv3")
    assert r.returncode == 78
    assert "serve_max_failed_starts=3" in r.stderr and "systemctl reset-failed x.service" in r.stderr
    assert count.read_text() == "3\n"                 # the refusal itself is not counted
    # A start by hand (NRestarts=0: systemctl start, reset-failed, the role's handler) runs again.
    assert start(0, "exit 1", "inv4").returncode == 1
    assert count.read_text() == "1\n"
    # A clean stop (systemd ran ExecStop in this invocation) is not a failed start ...
    ok = fake_bin(tmp_path / "d", "docker", "exit 0\n")
    helper("stop", *base, "--", str(ok / "docker"), "stop", "c", env=dict(env, INVOCATION_ID="inv5"), check=True)
    assert start(1, "exit 0", "inv5").returncode == 0
    assert count.read_text() == "1\n"
    # ... but an exit 0 nobody asked for (vLLM's API server when its engine died) is one, restarted.
    r = start(1, "exit 0", "inv6")
    assert r.returncode == 1 and "nothing asked it to stop" in r.stderr
    assert count.read_text() == "2\n"


def test_a_start_that_reached_health_clears_the_count(tmp_path):
    nrestarts = tmp_path / "nrestarts"
    nrestarts.write_text("2\n")
    bindir = fake_bin(tmp_path, "systemctl", 'cat "%s"\n' % nrestarts)
    state = tmp_path / "state"
    state.mkdir()
    (state / "x.service.failed-starts").write_text("2\n")
    port_file = tmp_path / "port"
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""\
        import http.server, sys
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
            def log_message(self, *a):
                pass
        s = http.server.HTTPServer(('127.0.0.1', 0), H)
        open(sys.argv[1], 'w').write(str(s.server_port))
        s.serve_forever()
        """), str(port_file)])
    try:
        for _attempt in range(100):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.1)
        base = ["--unit", "x.service", "--state-dir", str(state), "--max-failed-starts", "3"]
        env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), INVOCATION_ID="inv9")
        r = helper("run", *base, "--health-url", "http://127.0.0.1:%s/health" % port_file.read_text(),
                   "--health-poll-s", "0.2", "--", "/bin/sh", "-c", "sleep 2; exit 1", env=env)
        assert r.returncode == 1 and "failed-start count cleared" in r.stderr
        helper("stop-post", *base, env=dict(env, SERVICE_RESULT="exit-code", EXIT_CODE="exited", EXIT_STATUS="1"),
               check=True)
        # the server crashed after it had answered: not a failed start, the count starts again
        assert (state / "x.service.failed-starts").read_text() == "0\n"
    finally:
        server.kill()
        server.wait()


def test_a_start_that_never_answers_health_fails_within_the_health_timeout(tmp_path):
    """--health-timeout-s (serve_health_timeout_s) from the server's start: no /health by then, and the
    helper stops the container (docker stop) and reports a failed start (1) that stop-post counts;
    TimeoutStartSec stays the outer bound of the whole start."""
    calls = tmp_path / "calls"
    pidfile = tmp_path / "pid"
    bindir = fake_bin(tmp_path, "docker", 'echo "$*" >> "%s"; kill "$(cat "%s")"\n' % (calls, pidfile))
    fake_bin(tmp_path, "systemctl", "echo 1\n")
    state = tmp_path / "s"
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), INVOCATION_ID="inv5")
    base = ["--unit", "x.service", "--state-dir", str(state)]
    t0 = time.monotonic()
    # nothing listens on the port: /health never answers; the server itself would run 60 s
    r = helper("run", *base, "--health-url", "http://127.0.0.1:9/health", "--health-poll-s", "0.2",
               "--health-timeout-s", "2", "--container", "c", "--docker", str(bindir / "docker"), "--",
               "/bin/sh", "-c", "echo $$ > %s; exec sleep 60" % pidfile, env=env)
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert 2 <= took < 30
    assert "did not answer within serve_health_timeout_s (2 s)" in r.stderr
    assert calls.read_text().startswith("stop -t 30 c")
    helper("stop-post", *base, env=dict(env, SERVICE_RESULT="exit-code", EXIT_CODE="exited", EXIT_STATUS="1"), check=True)
    assert (state / "x.service.failed-starts").read_text() == "1\n"


def test_run_exits_with_the_servers_status(tmp_path):
    bindir = fake_bin(tmp_path, "systemctl", "echo 1\n")
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]))
    base = ["run", "--unit", "x.service", "--state-dir", str(tmp_path / "s"), "--"]
    assert helper(*base, "/bin/sh", "-c", "exit 3", env=env).returncode == 3
    assert helper(*base, "/bin/sh", "-c", "kill -KILL $$", env=env).returncode == 137
    assert helper(*base, "/bin/sh", "-c", "exit 78", env=env).returncode == 1   # 78 is the guard's refusal only


def test_an_unasked_exit_0_is_a_crash_unless_docker_signalled_the_container(tmp_path):
    bindir = fake_bin(tmp_path, "systemctl", "echo 1\n")
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), INVOCATION_ID="inv1")
    signalled = fake_bin(tmp_path / "a", "docker", 'echo "$@" > "%s"; echo kill 15\n' % (tmp_path / "args"))
    quiet = fake_bin(tmp_path / "b", "docker", "exit 0\n")
    down = fake_bin(tmp_path / "c", "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1\n")
    base = ["run", "--unit", "x.service", "--state-dir", str(tmp_path / "s"), "--container", "c"]
    # memwatch's own `docker stop` (no systemctl stop): Docker sent SIGTERM, a deliberate stop
    r = helper(*base, "--docker", str(signalled / "docker"), "--", "/bin/true", env=env)
    assert r.returncode == 0 and "signalled outside systemd (kill 15)" in r.stderr
    args = (tmp_path / "args").read_text().split()
    assert args[:2] == ["events", "--since"] and "container=c" in args and "event=kill" in args
    # the engine died and the API server exited 0 by itself: a crash, restarted
    r = helper(*base, "--docker", str(quiet / "docker"), "--", "/bin/true", env=env)
    assert r.returncode == 1 and "nothing asked it to stop" in r.stderr
    r = helper(*base, "--docker", str(down / "docker"), "--", "/bin/true", env=env)
    assert r.returncode == 1 and "could not read Docker's events" in r.stderr
    # outside systemd (no invocation ID) nothing can tell: 0 stays 0
    r = helper(*base, "--docker", str(quiet / "docker"), "--", "/bin/true",
               env={k: v for k, v in env.items() if k != "INVOCATION_ID"})
    assert r.returncode == 0


def test_stop_treats_a_vanished_container_as_stopped(tmp_path):
    gone = fake_bin(tmp_path / "a", "docker", "echo 'Error response from daemon: No such container: c' >&2; exit 1\n")
    r = helper("stop", "--", str(gone / "docker"), "stop", "-t", "30", "c")
    assert r.returncode == 0 and "already gone" in r.stderr
    down = fake_bin(tmp_path / "b", "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1\n")
    r = helper("stop", "--", str(down / "docker"), "stop", "-t", "30", "c")
    assert r.returncode == 1 and "Cannot connect" in r.stderr
    ok = fake_bin(tmp_path / "c", "docker", 'echo "$@" > "%s"\n' % (tmp_path / "args"))
    assert helper("stop", "--", str(ok / "docker"), "stop", "-t", "30", "c").returncode == 0
    assert (tmp_path / "args").read_text() == "stop -t 30 c\n"


FAKE_SYSTEMCTL = """\
s="%(d)s"
case "$1" in
  is-active) cat "$s/state" ;;
  show) cat "$s/invocation" ;;
  try-restart|restart|start|stop) echo "$@" >> "$s/restarts"; echo new > "$s/invocation"; echo active > "$s/state" ;;
  list-jobs) : ;;
esac
"""
FAKE_CURL = """\
case "$*" in
  */health*) exit 0 ;;
esac
exit 7
"""
# serve-unit reading (unit-tested in test_serve_reading.py): one reading per call from "readings"
# (the last one stays): idle, busy or stalled, as its exit status 0, 3 or 4.
FAKE_HELPER = """\
s="%(d)s"
echo "$@" >> "$s/helper-args"
if [ "$(wc -l < "$s/readings")" -gt 1 ]; then
    head -n 1 "$s/readings" > "$s/now"; tail -n +2 "$s/readings" > "$s/rest"; mv "$s/rest" "$s/readings"
else cp "$s/readings" "$s/now"; fi
case "$(cat "$s/now")" in
  idle) echo '{"why": "a liveness check passed"}'; exit 0 ;;
  busy) echo '{"why": "1 request(s) running or waiting"}'; exit 3 ;;
  *) echo '{"why": "liveness says stalled"}'; exit 4 ;;
esac
"""


@pytest.fixture(name="rendered")
def fixture_rendered(renders):
    return renders["default"]


@pytest.mark.parametrize("state, readings, rc, restarts", [
    ("active", "idle", 0, "try-restart --no-block sparkops-serve.service\n"),   # idle: once
    ("active", "busy", 75, None),                                         # busy: gives up at the bound
    # the gauges of a stalled engine read 0/0: not idle by the liveness reading, never restarted here
    ("active", "stalled", 75, None),
    ("inactive", "idle", 0, None),                                        # stopped: left stopped
    # one idle reading between busy ones (a request inside vLLM's API server counts in neither
    # gauge): not idle until a second reading agrees
    ("active", "busy\nidle\nbusy", 75, None),
    ("active", "busy\nidle\nidle", 0, "try-restart --no-block sparkops-serve.service\n"),
])
def test_recycle_script(rendered, tmp_path, state, readings, rc, restarts):  # pylint: disable=too-many-arguments
    d = tmp_path / "fake"
    d.mkdir()
    (d / "state").write_text(state + "\n")
    (d / "invocation").write_text("old\n")
    (d / "readings").write_text(readings + "\n")
    fake_bin(tmp_path, "systemctl", FAKE_SYSTEMCTL % {"d": d})
    fake_bin(tmp_path, "serve-unit", FAKE_HELPER % {"d": d})
    bindir = fake_bin(tmp_path, "curl", FAKE_CURL)
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), SPARKOPS_SERVE_HELPER=str(bindir / "serve-unit"),
               SPARKOPS_RECYCLE_DRAIN_TIMEOUT_S="2", SPARKOPS_RECYCLE_POLL_S="1")
    t0 = time.monotonic()
    r = subprocess.run(["/bin/sh", str(rendered / "sparkops-serve-recycle.sh")], capture_output=True, text=True,
                       env=env, timeout=60, check=False)
    assert r.returncode == rc, r.stdout + r.stderr
    assert (d / "restarts").read_text() == restarts if restarts else not (d / "restarts").exists()
    if state == "active":
        # the same reading as the rollout's drain: the helper's, asked for an idle and live server
        args = (d / "helper-args").read_text().splitlines()[0].split()
        assert args[:3] == ["reading", "--unit", "sparkops-serve.service"] and args[-2:] == ["--want", "idle"]
        assert "--liveness-dir" in args and "--probe-timeout-s" in args
    if rc == 75:
        # it waited for the bound, not gave up at once: the script counts whole seconds (date +%s),
        # so a 2 s bound ends after more than 1 s of real time (1.95 s was seen on a busy machine)
        assert time.monotonic() - t0 > 1 and "untouched" in r.stderr
        assert "liveness says stalled" in r.stderr if readings == "stalled" else True


def test_a_bad_recycle_calendar_is_refused_naming_the_variable(renders):
    """The calendar play of the render run (host "calendar"): the good value passed (else that host
    failed and the run's return code, checked by the fixture, is not 0); the bad one was refused."""
    if not HAS_SYSTEMD_ANALYZE:
        pytest.skip("systemd-analyze is needed")
    run = renders["run"]
    assert re.search(r"^calendar +: .* failed=0 ", run.stdout, re.M), run.stdout + run.stderr
    refusal = (renders["calendar"] / "refusal.txt").read_text()
    assert 'serve_recycle_on_calendar "every day; rm -rf /" is not an OnCalendar= value' in refusal


def test_crashes_after_serving_are_bounded_in_a_window(tmp_path):
    """Each start that reached /health clears the failed-start count, so a server that serves and
    then crashes would loop forever: such crashes are counted in a window, and past the bound an
    automatic restart is refused (exit 78); a liveness stop (75) is not a crash; a start by hand
    begins again."""
    nrestarts = tmp_path / "nrestarts"
    nrestarts.write_text("1\n")
    bindir = fake_bin(tmp_path, "systemctl", 'cat "%s"\n' % nrestarts)
    state = tmp_path / "state"
    state.mkdir()
    base = ["--unit", "x.service", "--state-dir", str(state), "--max-failed-starts", "3",
            "--max-crashes", "2", "--crash-window-s", "600"]
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]))
    for n, (code, status) in enumerate([("exited", "1"), ("exited", "75"), ("killed", "9")]):
        invocation = "inv%d" % n
        (state / "x.service.healthy").write_text(invocation + "\n")
        result = "exit-code" if code == "exited" else "signal"
        r = helper("stop-post", *base, check=True,
                   env=dict(env, INVOCATION_ID=invocation, SERVICE_RESULT=result, EXIT_CODE=code, EXIT_STATUS=status))
        assert ("crash" in r.stderr) == (status != "75"), r.stderr
    assert len(json.loads((state / "x.service.crashes").read_text())) == 2
    assert (state / "x.service.failed-starts").read_text() == "0\n"
    r = helper("run", *base, "--", "/bin/true", env=dict(env, INVOCATION_ID="inv9"))
    assert r.returncode == 78 and "crashed 2 times within 600 s after it had served (serve_max_crashes=2)" in r.stderr
    # a start by hand (NRestarts=0) runs again and clears the record
    nrestarts.write_text("0\n")
    r = helper("run", *base, "--", "/bin/true", env=dict(env, INVOCATION_ID="inv10"))
    assert r.returncode != 78 and "the crashes (2) start afresh" in r.stderr   # it ran (its exit 0 unasked: 1)
    assert json.loads((state / "x.service.crashes").read_text()) == []
