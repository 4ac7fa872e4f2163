"""The lab Spark serves for real: a real vLLM answers, the unit is what the role promises, a
re-converge is quiet, a changed setting restarts once, and a bad flag changes nothing."""
import json
import os
import subprocess
import time

UNIT = "sparkops-serve"
CONTAINER = "sparkops-molecule-serve-vllm"
BASE = "http://127.0.0.1:8000"
HERE = os.path.dirname(os.path.abspath(__file__))
CONVERGE = os.path.join(os.path.dirname(HERE), "converge.yml")
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def _curl(host, path, data=None):
    cmd = "curl -fsS --max-time 60 %s%s" % (BASE, path)
    if data is not None:
        cmd += " -H 'Content-Type: application/json' -d '%s'" % json.dumps(data)
    out = host.check_output(cmd)
    return out


def _container_id(host):
    return host.check_output("docker inspect -f '{{.Id}}' %s" % CONTAINER)


def _converge(*extra):
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
    return subprocess.run(
        ["ansible-playbook", "-i", inventory, CONVERGE] + list(extra),
        capture_output=True, text=True, env=env, cwd=PROJECT, timeout=1200, check=False)


def test_completions_return_tokens(host):
    out = json.loads(_curl(host, "/v1/completions", {
        "model": "tiny-llama", "prompt": "The spark", "max_tokens": 8, "temperature": 0}))
    assert out["usage"]["completion_tokens"] > 0
    assert isinstance(out["choices"][0]["text"], str)
    models = json.loads(_curl(host, "/v1/models"))
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]


def test_metrics_have_the_kv_cache_figures(host):
    metrics = _curl(host, "/metrics")
    for name in ("vllm:cache_config_info", "vllm:kv_cache_usage_perc",
                 "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert name in metrics


def test_unit_properties(host):
    svc = host.service(UNIT)
    assert svc.is_running and svc.is_enabled
    props = svc.systemd_properties
    assert props["Restart"] == "on-failure"
    assert props["StartLimitBurst"] == "3"
    assert props["TimeoutStopUSec"] == "30s"   # serve_stop_timeout_s, longer than the 10 s grace
    unit = host.file("/etc/systemd/system/%s.service" % UNIT).content_string
    assert "docker stop -t 10 %s" % CONTAINER in unit
    assert "--memory 6979321856 --memory-swap 6979321856" in unit
    assert "--ipc host" in unit and "--gpus" not in unit
    assert "/srv/sparkops/models/tiny-llama:/model:ro" in unit
    assert "--kv-cache-memory-bytes 67108864" in unit
    assert "docker rm -f %s" % CONTAINER in unit
    assert "-name 'vllm*'" in unit


def test_env_file_is_private(host):
    f = host.file("/etc/sparkops/%s.env" % UNIT)
    assert f.mode == 0o600 and f.user == "root"
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in f.content_string
    assert "LD_PRELOAD=/usr/lib/" in f.content_string


def test_container_limits_follow_the_plan(host):
    mem = host.check_output("docker inspect -f '{{.HostConfig.Memory}} {{.HostConfig.MemorySwap}}' %s" % CONTAINER)
    assert mem == "6979321856 6979321856"


def test_plan_vs_actual_report(host):
    report = json.loads(host.file("/var/lib/sparkops/serve/plan-vs-actual.json").content_string)
    assert report["plan"]["kv_cache_memory_bytes"] == 67108864
    assert report["actual"]["time_to_healthy_s"] > 0
    assert report["actual"]["num_blocks"] > 0
    assert report["actual"]["metrics_present"]["vllm:cache_config_info"]


def test_recycle_timer_is_scheduled(host):
    assert host.service("%s-recycle.timer" % UNIT).is_enabled
    script = host.file("/usr/local/sbin/%s-recycle" % UNIT)
    assert script.mode == 0o755


def test_bad_flag_is_rejected_and_the_server_keeps_answering(host):
    before = _container_id(host)
    r = _converge("-e", json.dumps({"serve_extra_args": [
        "--enforce-eager", "--distributed-executor-backend", "uni", "--cudagraph_mode", "FULL"]}))
    assert r.returncode != 0
    out = " ".join((r.stdout + r.stderr).split())   # wrapped by the YAML callback; failures may go to stderr
    assert "rejects the command line" in out
    assert "unrecognized arguments: --cudagraph-mode" in out
    assert _container_id(host) == before
    unit = host.file("/etc/systemd/system/%s.service" % UNIT).content_string
    assert "cudagraph" not in unit
    assert json.loads(_curl(host, "/v1/models"))["data"]


def test_changed_setting_restarts_exactly_once(host):
    before = _container_id(host)
    since = host.check_output("date '+%Y-%m-%d %H:%M:%S'")
    time.sleep(1)
    r = _converge("-e", "serve_max_num_seqs=3")
    assert r.returncode == 0, r.stdout[-3000:]
    assert _container_id(host) != before
    starts = host.check_output(
        "journalctl -u %s --since '%s' -o cat | grep -c '^Started ' || true" % (UNIT, since))
    assert starts == "1"
    assert "--max-num-seqs 3" in host.file("/etc/systemd/system/%s.service" % UNIT).content_string
    # Back to the scenario's values (restarts once more), so a later verify starts clean.
    r = _converge()
    assert r.returncode == 0, r.stdout[-3000:]
    assert json.loads(_curl(host, "/v1/models"))["data"]


def test_zz_stop_is_graceful_and_leaves_no_container(host):
    """Last: a stop ends vLLM within the grace (SIGTERM) and removes the container, so the
    scenario's destroy leaves no vLLM behind on the lab's Docker engine."""
    t0 = time.monotonic()
    host.run_expect([0], "systemctl stop %s" % UNIT)
    assert time.monotonic() - t0 < 10 + 5                 # serve_stop_grace_s + margin
    assert host.run("docker inspect %s" % CONTAINER).rc != 0
    assert host.service(UNIT).systemd_properties["Result"] == "success"
