"""What a user sees on a lab Spark after site.yml: the host tuned, and bad input refused."""
import json
import os
import re
import subprocess
import time

import pytest
import testinfra.utils.ansible_runner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("all")


def test_sysctl_file_has_the_settings(host):
    conf = host.file("/etc/sysctl.d/90-sparkops.conf")
    assert conf.exists and conf.user == "root" and conf.mode == 0o644
    settings = dict(
        (key.strip(), value.strip())
        for key, _sep, value in (
            line.partition("=") for line in conf.content_string.splitlines()
            if line.strip() and not line.startswith("#")
        )
    )
    assert settings == {"vm.min_free_kbytes": "65536", "vm.vfs_cache_pressure": "200"}


def test_no_active_swap_line_in_fstab(host):
    fstab = host.file("/etc/fstab").content_string
    active = [line for line in fstab.splitlines()
              if line.strip() and not line.lstrip().startswith("#") and line.split()[2:3] == ["swap"]]
    assert active == []
    # The image ships a swap line: it is still there, commented out with the reason.
    assert re.search(r"^# disabled by sparkops\.appliance .*/swap\.img\s+none\s+swap", fstab, re.M)


def test_no_swap_in_use(host):
    swaps = host.file("/proc/swaps").content_string.splitlines()[1:]
    assert swaps == []


def test_jemalloc_present(host):
    assert host.package("libjemalloc2").is_installed
    libs = host.run("ldconfig -p").stdout
    assert re.search(r"libjemalloc\.so\.2 .*=> /", libs)


def _site(*extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    cmd = ["ansible-playbook", "-i", INVENTORY, os.path.join(PROJECT, "playbooks", "site.yml")] + list(extra)
    return subprocess.run(cmd, env=env, cwd=PROJECT, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize("extra, variable", [
    (["-e", "host_tuning_min_free_kbytes=1024"], "host_tuning_min_free_kbytes"),
    (["-e", json.dumps({"spark_expect_gpu": "false"})], "spark_expect_gpu"),
    (["-e", json.dumps({"host_tuning_swap_off": "yes"})], "host_tuning_swap_off"),
    (["-e", json.dumps({"preflight_min_free_disk_gib": 10 ** 9})], "preflight_min_free_disk_gib"),
])
def test_bad_input_fails_before_any_change(host, extra, variable):
    before = host.file("/etc/sysctl.d/90-sparkops.conf").content_string
    result = _site(*extra)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert variable in out
    # It stopped in the preflight play: no play that changes the host started.
    assert "PLAY [Host tuning" not in out, out
    assert re.search(r"^\S+: FAILED$", out, re.M), out
    assert "  changed: " not in out.split("WHAT WAS DONE, PER HOST")[-1]
    assert host.file("/etc/sysctl.d/90-sparkops.conf").content_string == before


def test_the_whole_flow_serves_the_model(host):
    # site.yml fetched the checkpoint, planned, built the runtime image and started the unit.
    assert host.service("sparkops-serve").is_running
    out = host.check_output(
        "curl -sf http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' "
        "-d '{\"model\": \"tiny-llama\", \"prompt\": \"hello\", \"max_tokens\": 4}'")
    body = json.loads(out)
    assert body["choices"][0]["finish_reason"] == "length"
    report = json.loads(host.file("/var/lib/sparkops/serve/plan-vs-actual.json").content_string)
    # vLLM sized its KV pool from the plan's --kv-cache-memory-bytes (block rounding aside).
    planned = report["plan"]["kv_cache_memory_bytes"] / 2 ** 30
    assert abs(report["actual"]["kv_cache_gib"] - planned) < 0.1 * planned
    assert host.service("memwatch").is_running


DRILL_DIR = "/var/lib/sparkops-drill"
KIB_PER_GIB = 1024 * 1024


def _drill_meminfo(host, avail_gib, free_gib):
    text = ("MemTotal:       24683000 kB\\nMemFree:        %d kB\\nMemAvailable:   %d kB\\n"
            "Cached:         3000000 kB\\nAnonPages:      3000000 kB\\nShmem:          20000 kB\\n"
            "Slab:           900000 kB\\nPageTables:     65000 kB\\n"
            % (free_gib * KIB_PER_GIB, avail_gib * KIB_PER_GIB))
    host.run_test("mkdir -p %s && printf '%s' > %s/meminfo.tmp && mv %s/meminfo.tmp %s/meminfo"
                  % (DRILL_DIR, text, DRILL_DIR, DRILL_DIR, DRILL_DIR))


def _wait(what, check, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError("timed out after %d s waiting for %s" % (timeout, what))


def test_zz_memwatch_stops_the_real_server_gracefully(host):
    # Runs last (zz): it stops the server that the other tests use.
    container = "sparkops-vllm-" + host.backend.get_hostname()  # spark_serve_container_name in the base config
    _drill_meminfo(host, 12, 8)  # healthy
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    book = os.path.join(os.path.dirname(__file__), "..", "memwatch-drill.yml")
    drill = subprocess.run(["ansible-playbook", "-i", INVENTORY, book],
                           env=env, cwd=PROJECT, capture_output=True, text=True, timeout=600, check=False)
    assert drill.returncode == 0, drill.stdout + drill.stderr
    assert host.service("sparkops-serve").is_running
    archives_before = host.run("ls /var/lib/memwatch/incidents").stdout.split()
    _drill_meminfo(host, 4, 1)  # rule A (and B): MemAvailable < 6 GiB
    _wait("memwatch to stop the serve unit", lambda: not host.service("sparkops-serve").is_running)
    state = host.check_output("docker inspect -f '{{.State.Running}} {{.State.ExitCode}}' %s || true" % container)
    # vLLM exits 0 on SIGTERM (graceful), or the unit's stop removed the container altogether.
    assert state in ("false 0", ""), state
    archives = host.run("ls /var/lib/memwatch/incidents").stdout.split()
    new = [a for a in archives if a not in archives_before]
    assert len(new) == 1, archives
    listing = host.check_output("tar -tzf /var/lib/memwatch/incidents/%s" % new[0])
    assert "container.log" in listing and "memwatch.log" in listing
    # systemd does not restart a unit stopped on request: no ping-pong with Restart=on-failure.
    time.sleep(5)
    assert not host.service("sparkops-serve").is_running
    metrics = host.file("/var/lib/prometheus/node-exporter/memwatch.prom").content_string
    assert 'memwatch_rule_fires_total{rule="available"} 1' in metrics
