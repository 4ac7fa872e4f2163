"""vllm_status: the parsers of /metrics, the container log and Docker times, and the table."""
import datetime

from ansible_collections.sparkops.appliance.plugins.modules import vllm_status as vs

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
