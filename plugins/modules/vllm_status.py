# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_status
short_description: Wait for a vLLM server's /health and read what it actually allocated
description:
  - Polls C(<url>/health) until it answers 200 or O(timeout_s) passes.
  - Reads the KV cache vLLM actually allocated from C(vllm:cache_config_info) in C(/metrics) and
    from the container's log (C(Available KV cache memory), C(KV cache size ... tokens)), the
    time from the container's start to the first healthy answer, and sets it beside the memory
    plan (SPEC section 9, step 2).
  - Changes nothing on the host.
version_added: 0.1.0
author:
  - sparkops contributors (@sparkops)
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: none
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
options:
  url:
    description: Base URL of the server as this host reaches it, for example C(http://127.0.0.1:8000).
    type: str
    required: true
  container:
    description: Name of the vLLM container (for its start time and log); empty to skip both.
    type: str
    default: ""
  timeout_s:
    description: Give up waiting for /health after this many seconds.
    type: int
    default: 1200
  delay_s:
    description: Seconds between two /health polls.
    type: int
    default: 5
  plan:
    description: The memory plan (output of the C(sparkops.appliance.memory_plan) filter) to compare with.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Wait for /health and compare plan and actual
  sparkops.appliance.vllm_status:
    url: http://127.0.0.1:8000
    container: sparkops-vllm
    timeout_s: 900
    plan: "{{ spark_memory_plan }}"
  register: status

- name: Show it
  ansible.builtin.debug:
    msg: "{{ status.table_lines }}"
"""

RETURN = r"""
healthy:
  description: Whether /health answered 200 before the timeout (the module fails otherwise).
  returned: always
  type: bool
waited_s:
  description: Seconds this module waited for /health.
  returned: always
  type: float
actual:
  description: What vLLM reports.
  returned: success
  type: dict
  contains:
    time_to_healthy_s:
      description: Seconds from the container's start to the first healthy answer seen (null when unknown).
      type: float
    kv_cache_gib:
      description: KV cache memory vLLM allocated, from its log (null when not logged).
      type: float
    kv_cache_tokens:
      description: KV cache size in tokens, from its log.
      type: int
    num_blocks:
      description: KV cache blocks (C(num_gpu_blocks) of vllm:cache_config_info).
      type: int
    block_size:
      description: Tokens per block.
      type: int
    cache_config:
      description: All labels of vllm:cache_config_info.
      type: dict
    metrics_present:
      description: Which of the SPEC section 6 metrics /metrics exposes.
      type: dict
  sample:
    time_to_healthy_s: 27.4
    kv_cache_gib: 0.06
    kv_cache_tokens: 2048
    num_blocks: 16
    block_size: 128
table_lines:
  description: Plan and actual side by side, one line each.
  returned: success
  type: list
  elements: str
"""

import datetime
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

METRICS = ("vllm:cache_config_info", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
           "vllm:num_requests_waiting")
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# GPU workers log "Available KV cache memory: X GiB"; CPU workers "Explicitly set (X/Y) GiB for KV cache".
_LOG_KV_GIB = re.compile(r"(?:Available KV cache memory:\s*|Explicitly set \()([0-9.]+)(?:\s*GiB|/)")
_LOG_KV_TOKENS = re.compile(r"KV cache size:\s*([0-9,]+)\s*tokens")


def parse_metrics(text):
    """Prometheus text -> {name: [(labels dict, float value), ...]} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        out.setdefault(m.group("name"), []).append((labels, value))
    return out


def _int(value):
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def parse_log(text):
    """The last KV figures vLLM logged (a restart in the same log wins)."""
    gib = _LOG_KV_GIB.findall(text)
    tokens = _LOG_KV_TOKENS.findall(text)
    return {
        "kv_cache_gib": float(gib[-1]) if gib else None,
        "kv_cache_tokens": int(tokens[-1].replace(",", "")) if tokens else None,
    }


def actual_from(metrics_text, log_text):
    metrics = parse_metrics(metrics_text)
    info = metrics.get("vllm:cache_config_info", [({}, 0.0)])[0][0]
    actual = parse_log(log_text)
    if actual["kv_cache_gib"] is None and _int(info.get("kv_cache_memory_bytes")):
        actual["kv_cache_gib"] = round(_int(info["kv_cache_memory_bytes"]) / 2.0 ** 30, 3)
    if actual["kv_cache_tokens"] is None:
        actual["kv_cache_tokens"] = _int(info.get("kv_cache_size_tokens"))
    actual.update({
        "num_blocks": _int(info.get("num_gpu_blocks")),
        "block_size": _int(info.get("block_size")),
        "cache_dtype": info.get("cache_dtype"),
        "cache_config": info,
        "metrics_present": dict((name, name in metrics) for name in METRICS),
    })
    return actual


def _fmt(value, unit=""):
    if value is None:
        return "-"
    if isinstance(value, float):
        return "%.3f%s" % (value, unit)
    return "%s%s" % (value, unit)


def table_lines(plan, actual):
    rows = [
        ("figure", "plan", "actual"),
        ("gpu-memory-utilization", _fmt(plan.get("gmu")), _fmt(_float(actual["cache_config"].get("gpu_memory_utilization")))),
        ("budget (GiB)", _fmt(plan.get("budget_gib")), "-"),
        ("KV cache (GiB)", _fmt(plan.get("kv_exp_gib")), _fmt(actual.get("kv_cache_gib"))),
        ("KV cache bytes", _fmt(plan.get("kv_cache_memory_bytes")), _fmt(_int(actual["cache_config"].get("kv_cache_memory_bytes")))),
        ("KV tokens / blocks", "-", "%s / %s" % (_fmt(actual.get("kv_cache_tokens")), _fmt(actual.get("num_blocks")))),
        ("full-length requests", _fmt(plan.get("full_length_fit")), "-"),
        ("docker --memory (GiB)", _fmt(plan.get("docker_memory_gib")), "-"),
        ("time to healthy (s)", "-", _fmt(actual.get("time_to_healthy_s"))),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return ["%-*s  %*s  %s" % (w0, r[0], w1, r[1], r[2]) for r in rows]


def _float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def parse_docker_time(text):
    """Docker's RFC 3339 time with nanoseconds -> aware datetime (None when unparsable)."""
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", text.strip())
    if not m:
        return None
    base = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")
    micro = int((m.group(2) or "0")[:6].ljust(6, "0"))
    tz = m.group(3)
    offset = datetime.timedelta(0) if tz == "Z" else datetime.timedelta(
        hours=int(tz[1:3]), minutes=int(tz[4:6])) * (1 if tz[0] == "+" else -1)
    return base.replace(microsecond=micro, tzinfo=datetime.timezone(offset))


def _get(url, timeout=10):
    resp = open_url(url, timeout=timeout, validate_certs=False)
    return resp.getcode(), resp.read().decode("utf-8", "replace")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            container=dict(type="str", default=""),
            timeout_s=dict(type="int", default=1200),
            delay_s=dict(type="int", default=5),
            plan=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    base = p["url"].rstrip("/")
    start = time.monotonic()
    healthy, last_error = False, ""
    while True:
        try:
            code, _body = _get(base + "/health")
            healthy = code == 200
            last_error = "HTTP %s" % code
        except Exception as exc:  # connection refused while vLLM loads
            last_error = str(exc)
        if healthy or time.monotonic() - start >= p["timeout_s"]:
            break
        time.sleep(max(1, p["delay_s"]))
    seen = datetime.datetime.now(datetime.timezone.utc)
    waited = round(time.monotonic() - start, 1)
    log_text = ""
    started = None
    if p["container"]:
        rc, out, err = module.run_command(
            ["docker", "inspect", "--format", "{{.State.StartedAt}}", p["container"]])
        if rc == 0:
            started = parse_docker_time(out)
        rc, out, err = module.run_command(["docker", "logs", p["container"]])
        log_text = out + err
    if not healthy:
        module.fail_json(msg="vLLM at %s was not healthy after %s s (%s). Last log lines:\n%s" % (
            base, p["timeout_s"], last_error, "\n".join(log_text.splitlines()[-30:])),
            healthy=False, waited_s=waited)
    try:
        _code, metrics_text = _get(base + "/metrics")
    except Exception as exc:
        module.fail_json(msg="vLLM at %s is healthy but /metrics failed: %s" % (base, exc),
                         healthy=True, waited_s=waited)
    actual = actual_from(metrics_text, log_text)
    actual["time_to_healthy_s"] = round((seen - started).total_seconds(), 1) if started else None
    module.exit_json(changed=False, healthy=True, waited_s=waited, actual=actual,
                     table_lines=table_lines(p["plan"], actual))


if __name__ == "__main__":
    main()
