"""vllm_status: the parsers of /metrics, the container log and Docker times, the table, and the
wait itself: the module's main() in this process (harness.run_module), once through Ansible itself
(ansible localhost -m ...) for the wiring, against a real local HTTP server, the unit and its
journal stood in (systemctl/journalctl on PATH, replaying the states systemd shows for a start
that fails)."""
import datetime
import http.server
import os
import stat
import threading
import time

import pytest

from ansible_collections.sparkops.appliance.plugins.modules import vllm_status as vs

from harness import run_module as run_in_process
from harness import run_adhoc as adhoc

METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
@CACHE_CONFIG_INFO@
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
""".replace("@CACHE_CONFIG_INFO@", (
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",gpu_memory_utilization="0.9",'
    'kv_cache_memory_bytes="67108864",num_gpu_blocks="256",prefix_caching_hash_algo="sha256"} 1.0'))

LOG = """\
INFO 11-29 08:50:01 [kv_cache_utils.py:1] Available KV cache memory: 0.5 GiB
INFO 11-29 08:50:01 [kv_cache_utils.py:2] GPU KV cache size: 1,024 tokens
INFO 11-29 09:10:01 [kv_cache_utils.py:1] Available KV cache memory: 0.06 GiB
INFO 11-29 09:10:01 [kv_cache_utils.py:2] GPU KV cache size: 32,768 tokens
"""


def test_parse_metrics_reads_labels_and_values():
    m = vs.parse_metrics(METRICS)
    labels, value = m["vllm:cache_config_info"][0]
    assert labels["num_gpu_blocks"] == "256" and value == 1.0
    assert sum(v for _labels, v in m["vllm:num_requests_running"]) == 3.0
    assert "# HELP" not in "".join(m)


def test_log_figures_take_the_last_start():
    assert vs.parse_log(LOG) == {"kv_cache_gib": 0.06, "kv_cache_tokens": 32768}
    assert vs.parse_log("nothing here") == {"kv_cache_gib": None, "kv_cache_tokens": None}


def test_actual_and_table_side_by_side():
    actual = vs.actual_from(METRICS, LOG)
    assert actual["num_blocks"] == 256 and actual["block_size"] == 128
    assert actual["metrics_present"] == {
        "vllm:cache_config_info": True, "vllm:kv_cache_usage_perc": True,
        "vllm:num_requests_running": True, "vllm:num_requests_waiting": False}
    actual["time_to_healthy_s"] = 27.4
    lines = vs.table_lines({"gmu": 0.786, "kv_exp_gib": 16.81, "kv_cache_memory_bytes": 18049635041}, actual)
    kv = [line for line in lines if line.startswith("KV cache (GiB)")][0]
    assert "16.810" in kv and kv.endswith("0.060")
    assert [line for line in lines if line.startswith("time to healthy")][0].endswith("27.400")


def test_cpu_worker_log_lines():
    log = ("INFO [cpu_worker.py:260] Explicitly set (0.06/6.5) GiB for KV cache on node 0.\n"
           "INFO [kv_cache_utils.py:2327] CPU KV cache size: 131,072 tokens, Maximum concurrency\n")
    assert vs.parse_log(log) == {"kv_cache_gib": 0.06, "kv_cache_tokens": 131072}


def test_kv_gib_from_the_metrics_bytes_when_the_log_is_silent():
    actual = vs.actual_from('vllm:cache_config_info{kv_cache_memory_bytes="67108864"} 1.0\n', "")
    assert actual["kv_cache_gib"] == 0.062


def test_tokens_from_metrics_when_the_log_is_silent():
    metrics = 'vllm:cache_config_info{kv_cache_size_tokens="131072",num_gpu_blocks="1024"} 1.0\n'
    actual = vs.actual_from(metrics, "")
    assert actual["kv_cache_tokens"] == 131072 and actual["num_blocks"] == 1024
    assert vs.actual_from(metrics, LOG)["kv_cache_tokens"] == 32768


def test_missing_metrics_give_none_not_errors():
    actual = vs.actual_from("", "")
    assert actual["num_blocks"] is None and actual["kv_cache_gib"] is None
    assert not any(actual["metrics_present"].values())
    assert all(isinstance(line, str) for line in vs.table_lines({}, actual))


def test_docker_time_with_nanoseconds_and_offsets():
    t = vs.parse_docker_time("2026-11-29T08:41:11.123456789Z")
    assert t == datetime.datetime(2026, 11, 29, 8, 41, 11, 123456, tzinfo=datetime.timezone.utc)
    t2 = vs.parse_docker_time("2026-11-29T09:41:11+01:00")
    assert (t2 - t).total_seconds() == -0.123456
    assert vs.parse_docker_time("0001-01-01T00:00:00Z").year == 1
    assert vs.parse_docker_time("not a time") is None


# --- the table names the figure that sized the KV pool -------------------------------------

# What vLLM 0.32 reports when --kv-cache-memory-bytes sized the pool: its unused default 0.92.
BYTES_INFO = ('vllm:cache_config_info{block_size="16",gpu_memory_utilization="0.92",'
              'kv_cache_memory_bytes="67108864",num_gpu_blocks="2048"} 1.0\n')
GMU_INFO = ('vllm:cache_config_info{block_size="16",gpu_memory_utilization="0.786",'
            'kv_cache_memory_bytes="None",num_gpu_blocks="2048"} 1.0\n')
LAB_PLAN = {"gmu": 0.047, "kv_cache_memory_bytes": 67108864, "kv_exp_gib": 0.0625}


def _row(lines, label):
    rows = [line for line in lines if line.startswith(label + " ")]
    assert len(rows) == 1, lines
    return rows[0].split()[len(label.split()):]


def test_table_in_bytes_mode_shows_the_bytes_and_marks_gmu_unused():
    lines = vs.table_lines(LAB_PLAN, vs.actual_from(BYTES_INFO, ""), "bytes")
    assert lines[0] == "KV pool sized by --kv-cache-memory-bytes (gpu-memory-utilization is not used)"
    assert _row(lines, "kv-cache-memory-bytes") == ["67108864", "67108864"]
    assert _row(lines, "gpu-memory-utilization") == ["not", "used", "not", "used"]
    assert not [line for line in lines if "0.920" in line or "0.047" in line]
    assert lines[1].split() == ["figure", "plan", "actual"]
    # the figure that sized the pool comes before the one that did not
    assert lines.index([x for x in lines if x.startswith("kv-cache-memory-bytes")][0]) < \
        lines.index([x for x in lines if x.startswith("gpu-memory-utilization")][0])


def test_table_in_gmu_mode_shows_the_utilization_and_marks_bytes_unused():
    lines = vs.table_lines(dict(LAB_PLAN, gmu=0.786), vs.actual_from(GMU_INFO, ""), "gmu")
    assert lines[0] == "KV pool sized by --gpu-memory-utilization (kv-cache-memory-bytes is not used)"
    assert _row(lines, "gpu-memory-utilization") == ["0.786", "0.786"]
    assert _row(lines, "kv-cache-memory-bytes") == ["not", "used", "not", "used"]
    assert not [line for line in lines if "67108864" in line]


# --- a failed start: the unit's state and journal ------------------------------------------

def test_start_failure_reads_systemds_states():
    running = {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "Result": "success"}
    assert vs.start_failure(running, 0) is None
    assert vs.start_failure({"ActiveState": "activating", "SubState": "start-pre", "NRestarts": "0"}, 0) is None
    assert vs.start_failure({"ActiveState": "deactivating", "SubState": "stop", "NRestarts": "0"}, 0) is None
    waiting = {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "0",
               "Result": "exit-code", "ExecMainStatus": "1"}
    assert "start failed (Result=exit-code, exit status 1)" in vs.start_failure(waiting, 0)
    assert "unit failed" in vs.start_failure(dict(waiting, ActiveState="failed", SubState="failed"), 0)
    assert "not running" in vs.start_failure({"ActiveState": "inactive", "SubState": "dead"}, 0)
    # a restart slipped between two polls: the counter tells
    assert "restarted 1 time" in vs.start_failure(dict(running, NRestarts="3"), 2)
    # restarts before the wait began are not this start's
    assert vs.start_failure(dict(running, NRestarts="3"), 3) is None


def test_telling_line_is_the_root_cause_not_the_wrapper():
    lines = ["INFO loading", "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
             "ValueError: Available memory on node 0 (5.1/6.5 GiB) on kv cache allocation is less than "
             "requested memory for kv (8.0 GiB).",
             "", "The above exception was the direct cause of the following exception:", "",
             "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    assert vs.telling_line(lines).startswith("ValueError: Available memory on node 0")
    assert vs.telling_line(lines[-1:]).startswith("RuntimeError: Engine core")
    assert vs.telling_line(["torch.OutOfMemoryError: CUDA out of memory."]) == "torch.OutOfMemoryError: CUDA out of memory."
    assert vs.telling_line(["INFO all good", "WARNING ValueError-ish text"]) is None
    # the engine process logs the cause through vLLM's logger, with its prefix
    logged = ["(EngineCore pid=23) ERROR 11-29 15:22:17 [core.py:1510] ValueError: Available memory on node 0",
              "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above."]
    assert vs.telling_line(logged) == "ValueError: Available memory on node 0"


# --- the module's wait --------------------------------------------------------

class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    healthy_after = None          # /health answers 200 from this many polls on; None: never
    polls = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/health":
            self.server.polls += 1
        ok = self.server.healthy_after is not None and self.server.polls >= self.server.healthy_after
        if self.path == "/health":
            code, body = (200, b"") if ok else (503, b"loading")
        elif self.path == "/metrics" and ok:
            code, body = 200, BYTES_INFO.encode()
        else:
            code, body = 404, b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(name="server")
def _server():
    srv = _Server(("127.0.0.1", 0), _Handler)
    # a short poll interval: shutdown() at teardown waits for the serving loop to notice
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


# systemctl: each `show` prints the next state file (the last one again when they run out).
SYSTEMCTL = """\
d=@DIR@
echo "$*" >> $d/systemctl.calls
[ "$1" = show ] || exit 0
n=$(( $(cat $d/count 2>/dev/null || echo 0) + 1 )); echo $n > $d/count
f=$d/show.$n; [ -e "$f" ] || f=$(ls $d/show.* | sort -t. -k2 -n | tail -n 1)
cat "$f"
"""
# journalctl: the output of one invocation, found by its _SYSTEMD_INVOCATION_ID= match
# (journal.all without that match).
JOURNALCTL = """\
d=@DIR@
echo "$*" >> $d/journalctl.calls
for a in "$@"; do case $a in _SYSTEMD_INVOCATION_ID=*) f=$d/journal.${a#_SYSTEMD_INVOCATION_ID=};; esac; done
[ -z "$f" ] && f=$d/journal.all
[ -e "$f" ] && cat "$f"
exit 0
"""
VLLM_REFUSAL = """\
INFO 11-29 15:01:02 [cpu_worker.py:1] Loading weights took 0.05 seconds
ERROR 11-29 15:01:09 [core.py:1] EngineCore failed to start.
Traceback (most recent call last):
  File "/opt/vllm/lib/python3.11/site-packages/vllm/v1/worker/cpu_worker.py", line 219, in determine_available_memory
    raise ValueError(
ValueError: Available memory on node 0 (5.71/6.5 GiB) on kv cache allocation is less than requested memory for kv (8.0 GiB). \
Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.

The above exception was the direct cause of the following exception:

RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def _show(active, sub, restarts, invocation, result="success", status="0"):
    return ("ActiveState=%s\nSubState=%s\nNRestarts=%s\nResult=%s\nExecMainStatus=%s\nInvocationID=%s\n"
            % (active, sub, restarts, result, status, invocation))


def stand_in_unit(tmp_path, states, journals):
    """A directory for PATH with systemctl and journalctl that replay ``states`` (one `show`
    output per call) and print ``journals[invocation]``."""
    d = tmp_path / "unit"
    d.mkdir()
    for i, text in enumerate(states, 1):
        (d / ("show.%d" % i)).write_text(text)
    for invocation, text in journals.items():
        (d / ("journal." + invocation)).write_text(text)
    for name, script in (("systemctl", SYSTEMCTL), ("journalctl", JOURNALCTL)):
        path = d / name
        path.write_text("#!/bin/sh\n" + script.replace("@DIR@", str(d)))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return d


def run_module(args, path_prefix, monkeypatch):
    """main() in this process with path_prefix first on PATH; (result, seconds taken)."""
    monkeypatch.setenv("PATH", str(path_prefix) + os.pathsep + os.environ["PATH"])
    t0 = time.monotonic()
    res = run_in_process(vs, args)
    return res, time.monotonic() - t0


def through_ansible(args, path_prefix):
    """ansible localhost -m sparkops.appliance.vllm_status; (result, seconds taken)."""
    t0 = time.monotonic()
    res = adhoc("vllm_status", args, path_prefix=path_prefix, timeout=300)
    return res, time.monotonic() - t0


def _args(server, **extra):
    args = {"url": "http://127.0.0.1:%d" % server.server_address[1], "unit": "sparkops-serve.service",
            "timeout_s": 60, "delay_s": 1, "kv_sizing": "bytes", "plan": LAB_PLAN}
    args.update(extra)
    return args


def test_a_refused_start_fails_at_once_with_vllms_message(tmp_path, server):
    """Through Ansible itself: the module found by its name, its failure as a task returns it."""
    loading = _show("active", "running", 0, "aaa")
    refused = _show("activating", "auto-restart", 0, "aaa", "exit-code", "1")
    unit = stand_in_unit(tmp_path, [loading, loading, loading, refused], {"aaa": VLLM_REFUSAL})
    res, took = through_ansible(_args(server), unit)
    assert res.get("failed"), res
    # the 4th look at the unit (the 3rd poll, about 2 s in) saw the failed start: not the 60 s timeout
    assert res["waited_s"] < 10 and took < 40, (res["waited_s"], took)
    msg = res["msg"]
    assert "sparkops-serve.service the start failed (Result=exit-code, exit status 1)" in msg
    # the root cause first, then the journal of that start
    said = msg.index("vLLM says: ValueError: Available memory on node 0 (5.71/6.5 GiB)")
    assert said < msg.index("Traceback (most recent call last)")
    assert res["cause"].startswith("ValueError: Available memory")
    assert res["journal"][-1].startswith("RuntimeError: Engine core initialization failed")
    calls = (unit / "journalctl.calls").read_text()
    assert "-u sparkops-serve.service _SYSTEMD_INVOCATION_ID=aaa" in calls and "-o cat --no-pager" in calls
    assert res["unit_state"]["SubState"] == "auto-restart"


def test_a_restart_between_two_polls_reports_the_start_that_failed(tmp_path, server, monkeypatch):
    unit = stand_in_unit(tmp_path, [_show("active", "running", 2, "aaa"), _show("active", "running", 3, "bbb")],
                         {"aaa": VLLM_REFUSAL, "bbb": "INFO loading again\n"})
    res, _took = run_module(_args(server), unit, monkeypatch)
    assert res.get("failed") and "restarted 1 time(s)" in res["msg"]
    assert res["unit_state"]["InvocationID"] == "aaa"
    assert res["cause"].startswith("ValueError: Available memory")


def test_a_start_limit_hit_fails_and_an_empty_journal_says_so(tmp_path, server, monkeypatch):
    unit = stand_in_unit(tmp_path, [_show("failed", "failed", 2, "ccc", "start-limit-hit", "137")], {})
    res, _took = run_module(_args(server), unit, monkeypatch)
    assert res.get("failed") and "the unit failed (Result=start-limit-hit, exit status 137)" in res["msg"]
    assert "status 137: SIGKILL" in res["msg"]
    assert "holds no output for that start" in res["msg"] and res["cause"] == ""


def test_a_journal_without_invocation_ids_still_shows_the_cause(tmp_path, server, monkeypatch):
    unit = stand_in_unit(tmp_path, [_show("activating", "auto-restart", 0, "eee", "exit-code", "1")],
                         {"all": "Started sparkops-serve.service.\n" + VLLM_REFUSAL})
    res, _took = run_module(_args(server), unit, monkeypatch)
    assert res["cause"].startswith("ValueError: Available memory")
    assert "lines of `journalctl -u sparkops-serve.service` (the docker run output)" in res["msg"]
    assert "_SYSTEMD_INVOCATION_ID=eee" in (unit / "journalctl.calls").read_text()


def test_a_healthy_server_passes_while_the_unit_runs(tmp_path, server, monkeypatch):
    server.healthy_after = 3
    unit = stand_in_unit(tmp_path, [_show("active", "running", 0, "ddd")], {})
    res, _took = run_module(_args(server), unit, monkeypatch)
    assert not res.get("failed"), res
    assert res["healthy"] and res["waited_s"] >= 2 and server.polls == 3
    assert len((unit / "systemctl.calls").read_text().splitlines()) == 3   # before the wait, after polls 1 and 2
    assert res["actual"]["num_blocks"] == 2048
    assert "not used" in [line for line in res["table_lines"] if line.startswith("gpu-memory-utilization")][0]
    assert res["unit_state"]["ActiveState"] == "active"
    assert not (unit / "journalctl.calls").exists()


def test_tells_whether_the_report_file_exists(tmp_path, server, monkeypatch):
    # the serve role writes plan-vs-actual only when it is missing (or the server restarted)
    server.healthy_after = 1
    unit = stand_in_unit(tmp_path, [_show("active", "running", 0, "eee")], {})
    report = tmp_path / "plan-vs-actual.json"
    res, _took = run_module(_args(server, report_path=str(report)), unit, monkeypatch)
    assert res["healthy"] and res["report_exists"] is False, res
    report.write_text("{}\n")
    res, _took = run_module(_args(server, report_path=str(report)), unit, monkeypatch)
    assert res["report_exists"] is True, res
    res, _took = run_module(_args(server), unit, monkeypatch)
    assert "report_exists" not in res
