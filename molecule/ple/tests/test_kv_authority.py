"""The runtime image's own vLLM is the authority on the KV figure (docs/memory-plan.md, "vLLM's own
figure at serve time"): where the plan counted the KV from config.json, the serve role asked the
image's vLLM for its KV cache spec before the unit changed, made the plan again with it, and served
that plan. Needs the plan made by the memory_plan role from the tiny Gemma 4's config.json (no
memory_plan_kv_bytes_per_token, no spark_memory_plan given in the scenario).

Read on the lab Spark: the report serve wrote (plan and actual side by side), the memo of vLLM's
figures, and the unit's own command line.
"""
import json
import subprocess

import pytest

SPARK = "sparkops-molecule-ple"
SVC = "sparkops-serve.service"
REPORT = "/var/lib/sparkops/serve/plan-vs-actual.json"
MEMO = "/run/sparkops/serve/sparkops-serve.service.kv-spec"
# vLLM's pool is what --kv-cache-memory-bytes asked for, less what it rounds to whole blocks
POOL_TOLERANCE = 0.05


def docker(*args, timeout=60):
    return subprocess.run(["docker"] + list(args), capture_output=True, text=True, timeout=timeout, check=False)


def read_json(path):
    out = docker("exec", SPARK, "cat", path)
    assert out.returncode == 0, "%s: %s" % (path, out.stderr)
    return json.loads(out.stdout)


@pytest.fixture(name="report", scope="module")
def fixture_report():
    return read_json(REPORT)


def test_the_plan_served_is_made_with_vllms_kv_figure(report):
    plan = report["plan"]
    assert plan["kv_source"] == "vllm", {k: plan.get(k) for k in ("kv_source", "kv_bytes_per_token_source")}
    vllm = plan["kv_vllm"]
    assert vllm["image"] == report["image"]
    assert plan["kv_full_bytes_per_token"] == vllm["full_bytes_per_token"]
    assert [(g["window"], g["layers"], g["bytes_per_token"]) for g in plan["kv_sliding"]] == [
        (g["window"], g["layers"], g["bytes_per_token"]) for g in vllm["sliding"]]
    # both readings are in the report, each with the request it gives
    assert plan["kv_config"] is not None or plan["kv_config_error"]
    assert plan["kv_need_gib"] == vllm["kv_need_gib"]
    print("KV per token: vLLM %s, config.json %s (differs: %s)" % (
        vllm["full_bytes_per_token"], (plan["kv_config"] or {}).get("full_bytes_per_token"), plan["kv_vllm_differs"]))


def test_the_memo_holds_the_same_figures_for_this_image(report):
    memo = read_json(MEMO)
    assert len(memo["key"]) == 64
    spec = memo["spec"]
    assert spec["image"] == report["image"] and spec["image_id"].startswith("sha256:")
    assert spec["full_bytes_per_token"] == report["plan"]["kv_vllm"]["full_bytes_per_token"]
    assert spec["tensor_parallel_size"] == report["plan"]["inputs"]["tensor_parallel_size"]


def test_the_unit_serves_that_plan_and_the_actual_pool_is_within_tolerance(report):
    plan, actual = report["plan"], report["actual"]
    unit = docker("exec", SPARK, "systemctl", "cat", SVC).stdout
    assert "--kv-cache-memory-bytes %d" % plan["kv_cache_memory_bytes"] in " ".join(unit.replace("\\\n", " ").split())
    pool = actual["kv_cache_gib"]
    assert pool == pytest.approx(plan["kv_exp_gib"], rel=POOL_TOLERANCE), (pool, plan["kv_exp_gib"])
    # one max-length request fits in what vLLM allocated, by vLLM's own count of tokens
    assert actual["kv_cache_tokens"] >= plan["inputs"]["max_model_len"], actual
