# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_status
short_description: Wait for a vLLM server's /health and read what it actually allocated
description:
  - Polls C(<url>/health) until it answers 200 or O(timeout_s) passes.
  - With O(unit), watches the systemd unit while it waits (C(systemctl show) of its state, result,
    exit status, restart count and invocation) and fails within one poll of the first failed start,
    quoting vLLM's own error from the unit's journal for that start (the attached C(docker run)
    output), instead of waiting out O(timeout_s). The container's log is not read then, as C(--rm)
    removes the container of a failed start.
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
    description: Name of the vLLM container (for its start time and, once healthy, its log); empty to skip both.
    type: str
    default: ""
  unit:
    description:
      - The systemd unit that runs the container (for example C(sparkops-serve.service)); empty to not watch it.
      - A failed start (the unit waiting to restart, failed, stopped, or restarted since the module began)
        ends the wait at once with the last O(journal_lines) lines of the unit's journal for that start.
    type: str
    default: ""
  journal_lines:
    description: How many of the failed start's last journal lines to show.
    type: int
    default: 40
  kv_sizing:
    description:
      - Which figure sized the KV pool (the serve role's C(serve_kv_sizing)) C(gmu) (C(--gpu-memory-utilization))
        or C(bytes) (C(--kv-cache-memory-bytes)). The table shows that figure and marks the other as not used.
    type: str
    choices: [gmu, bytes]
    default: gmu
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
  report_path:
    description:
      - A file the caller keeps the plan-vs-actual report in. The module only tells whether it exists
        (RV(report_exists)), so that the caller needs no round trip of its own to decide whether to write it.
    type: path
"""

EXAMPLES = r"""
- name: Wait for /health and compare plan and actual
  sparkops.appliance.vllm_status:
    url: http://127.0.0.1:8000
    container: sparkops-vllm
    unit: sparkops-serve.service
    timeout_s: 900
    kv_sizing: bytes
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
unit_state:
  description: The unit's last C(systemctl show) properties seen (with O(unit)).
  returned: when O(unit) is set
  type: dict
  sample: {ActiveState: activating, SubState: auto-restart, NRestarts: "0", Result: exit-code, ExecMainStatus: "1"}
journal:
  description: The failed start's last journal lines (the C(docker run) output).
  returned: on a failed start
  type: list
  elements: str
cause:
  description: The most telling line of the failed start's journal (vLLM's exception line), when one was found.
  returned: on a failed start
  type: str
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
report_exists:
  description: Whether O(report_path) exists.
  returned: when O(report_path) is set
  type: bool
table_lines:
  description:
    - Plan and actual side by side, one line each, after a title that names the figure that sized the KV pool
      (O(kv_sizing)); the other figure's row says C(not used).
  returned: success
  type: list
  elements: str
"""

import datetime
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

METRICS = ("vllm:cache_config_info", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
           "vllm:num_requests_waiting")
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# GPU workers log "Available KV cache memory: X GiB"; CPU workers "Explicitly set (X/Y) GiB for KV cache".
# The serve unit's helper (roles/serve/files/serve-unit, KV_POOL_LINE) reads the same lines at each
# start, a script on the host that cannot import this: a change here is a change there.
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


NOT_USED = "not used"


def table_lines(plan, actual, kv_sizing="gmu"):
    """Plan and actual side by side. The figure that sized the KV pool comes first; the other one
    is marked as not used (vLLM reports its default for it, 0.92 for an unused utilization)."""
    config = actual.get("cache_config") or {}
    gmu_row = ("gpu-memory-utilization", _fmt(plan.get("gmu")), _fmt(_float(config.get("gpu_memory_utilization"))))
    bytes_row = ("kv-cache-memory-bytes", _fmt(plan.get("kv_cache_memory_bytes")), _fmt(_int(config.get("kv_cache_memory_bytes"))))
    if kv_sizing == "bytes":
        title = "KV pool sized by --kv-cache-memory-bytes (gpu-memory-utilization is not used)"
        sizing = [bytes_row, (gmu_row[0], NOT_USED, NOT_USED)]
    else:
        title = "KV pool sized by --gpu-memory-utilization (kv-cache-memory-bytes is not used)"
        sizing = [gmu_row, (bytes_row[0], NOT_USED, NOT_USED)]
    rows = [("figure", "plan", "actual")] + sizing + [
        ("budget (GiB)", _fmt(plan.get("budget_gib")), "-"),
        ("KV cache (GiB)", _fmt(plan.get("kv_exp_gib")), _fmt(actual.get("kv_cache_gib"))),
        ("KV tokens / blocks", "-", "%s / %s" % (_fmt(actual.get("kv_cache_tokens")), _fmt(actual.get("num_blocks")))),
        ("full-length requests", _fmt(plan.get("full_length_fit")), "-"),
        ("docker --memory (GiB)", _fmt(plan.get("docker_memory_gib")), "-"),
        ("time to healthy (s)", "-", _fmt(actual.get("time_to_healthy_s"))),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return [title] + ["%-*s  %*s  %s" % (w0, r[0], w1, r[1], r[2]) for r in rows]


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


# --- the unit behind the server -------------------------------------------------------------
UNIT_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "Result", "ExecMainStatus", "InvocationID")
# An exception line as Python prints it last in a traceback ("ValueError: ...", "torch.OutOfMemoryError: ...").
_EXCEPTION = re.compile(r"^\s*(?:[A-Za-z_][\w]*\.)*(?:[A-Z]\w*(?:Error|Exception)|KeyboardInterrupt|SystemExit)(?::\s|$)")
# vLLM's logger prefix: the process ("(EngineCore pid=23) "), then "ERROR 11-29 15:22:17 [core.py:1510] ".
_LOG_PREFIX = re.compile(r"^\s*(?:\(\w+ pid=\d+\)\s*)?(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\]\s*)?")
# Wrappers that only point at the real cause printed above them.
_WRAPPER = re.compile(r"See root cause above|Engine core initiali[sz]ation failed|core proc\(s\)|died unexpectedly", re.I)


def parse_show(text):
    """`systemctl show -p A,B` output -> {A: value, B: value}."""
    props = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def start_failure(props, base_restarts):
    """Why the unit's start has failed, or None while it may still come up.

    A start has failed when systemd waits to restart the unit (SubState auto-restart), gave up on
    it (failed), it is no longer running at all (inactive: stopped, or exited with success), or it
    was restarted since the wait began (NRestarts grew: a failed start was seen too late)."""
    active, sub = props.get("ActiveState", ""), props.get("SubState", "")
    restarts = _int(props.get("NRestarts"))
    detail = "Result=%s, exit status %s" % (props.get("Result", "?"), props.get("ExecMainStatus", "?"))
    if sub == "auto-restart":
        return "the start failed (%s); systemd restarts it after RestartSec" % detail
    if active == "failed":
        return "the unit failed (%s)" % detail
    if active == "inactive":
        return "the unit is not running (%s, %s)" % (sub or "dead", detail)
    if restarts is not None and base_restarts is not None and restarts > base_restarts:
        return "the unit restarted %d time(s) while waiting (%s)" % (restarts - base_restarts, detail)
    return None


def telling_line(lines):
    """The line that says why vLLM stopped: the last exception line that is not a mere wrapper
    ("Engine core initialization failed. See root cause above"), else the last exception line.
    vLLM's logger prefix ("(EngineCore pid=23) ERROR 11-29 15:22:17 [core.py:1510] ") is dropped."""
    found = [line for line in (_LOG_PREFIX.sub("", raw).strip() for raw in lines) if _EXCEPTION.match(line)]
    for line in reversed(found):
        if not _WRAPPER.search(line):
            return line
    return found[-1] if found else None


def exit_hint(props):
    status = _int(props.get("ExecMainStatus"))
    if status == 137:
        return " The container was killed (status 137: SIGKILL, often the --memory limit's OOM killer)."
    if status in (125, 126, 127):
        return " docker run itself failed (status %s: the daemon, the image or its entrypoint)." % status
    return ""


def failure_message(base, unit, reason, invocation, lines, cause, waited, props):
    head = "vLLM at %s did not come up: %s %s after %s s." % (base, unit, reason, waited)
    head += exit_hint(props)
    if cause:
        head += "\nvLLM says: %s" % cause
    if lines:
        query = "journalctl -u %s%s" % (unit, " _SYSTEMD_INVOCATION_ID=" + invocation if invocation else "")
        head += "\nLast %d lines of `%s` (the docker run output):\n%s" % (len(lines), query, "\n".join(lines))
    else:
        head += "\nThe unit's journal holds no output for that start (journalctl -u %s)." % unit
    return head


class Unit:
    """Reads the unit's state and its journal through systemctl and journalctl."""

    def __init__(self, module, name, lines):
        self.module = module
        self.name = name
        self.lines = lines

    def show(self):
        rc, out, err = self.module.run_command(
            ["systemctl", "show", "-p", ",".join(UNIT_PROPERTIES), self.name])
        if rc != 0:
            return {"error": (err or out).strip() or "systemctl show exited %d" % rc}
        return parse_show(out)

    def journal(self, invocation, count):
        cmd = ["journalctl", "-u", self.name]
        if invocation:
            cmd.append("_SYSTEMD_INVOCATION_ID=" + invocation)
        cmd += ["-n", str(count), "-o", "cat", "--no-pager"]
        rc, out, _err = self.module.run_command(cmd)
        return out.splitlines() if rc == 0 else []

    def failed_start(self, invocation):
        """(last lines, telling line) of one start's output. journald may not have stored the
        last lines of a process that just ended: read once more after a second when no
        exception line is there yet. The wider read finds a cause further up the traceback."""
        wide = max(200, self.lines)
        lines = self.journal(invocation, wide)
        if telling_line(lines) is None:
            time.sleep(1)
            lines = self.journal(invocation, wide)
        if not lines and invocation:  # a journal that does not tag the output with the invocation
            invocation = ""
            lines = self.journal(invocation, wide)
        return lines[-self.lines:], telling_line(lines), invocation


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            container=dict(type="str", default=""),
            unit=dict(type="str", default=""),
            journal_lines=dict(type="int", default=40),
            timeout_s=dict(type="int", default=1200),
            delay_s=dict(type="int", default=5),
            plan=dict(type="dict", default={}),
            kv_sizing=dict(type="str", default="gmu", choices=["gmu", "bytes"]),
            report_path=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    base = p["url"].rstrip("/")
    unit = Unit(module, p["unit"], max(1, p["journal_lines"])) if p["unit"] else None
    result = {"changed": False}
    if p["report_path"]:
        result["report_exists"] = os.path.exists(p["report_path"])
    props, base_restarts, invocation = {}, None, ""
    if unit:
        props = unit.show()
        result["unit_state"] = props
        base_restarts = _int(props.get("NRestarts"))
        invocation = props.get("InvocationID", "")
    start = time.monotonic()
    healthy, last_error = False, ""
    while True:
        try:
            code, _body = _get(base + "/health")
            healthy = code == 200
            last_error = "HTTP %s" % code
        except Exception as exc:  # connection refused while vLLM loads
            last_error = str(exc)
        if healthy:
            break
        if unit:
            seen_invocation = invocation
            props = unit.show()
            result["unit_state"] = props
            reason = start_failure(props, base_restarts)
            if reason:
                # In auto-restart and failed the unit still names the start that failed; once a
                # restart began it names the new one, and the failed start is the one seen before.
                failed = props.get("InvocationID", "")
                if props.get("ActiveState") in ("activating", "active") and props.get("SubState") != "auto-restart":
                    failed = seen_invocation or failed
                props = dict(props, InvocationID=failed)
                lines, cause, matched = unit.failed_start(failed)
                waited = round(time.monotonic() - start, 1)
                module.fail_json(msg=failure_message(base, p["unit"], reason, matched, lines, cause, waited, props),
                                 healthy=False, waited_s=waited, unit_state=props, journal=lines, cause=cause or "")
            invocation = props.get("InvocationID", invocation)
        if time.monotonic() - start >= p["timeout_s"]:
            break
        time.sleep(max(1, p["delay_s"]))
    seen = datetime.datetime.now(datetime.timezone.utc)
    waited = round(time.monotonic() - start, 1)
    started, exists = None, False
    if p["container"]:
        rc, out, _err = module.run_command(
            ["docker", "inspect", "--format", "{{.State.StartedAt}}", p["container"]])
        exists = rc == 0
        if exists:
            started = parse_docker_time(out)
    if not healthy:
        if unit:
            lines = unit.journal(invocation, unit.lines)
            where = "Last lines of `journalctl -u %s _SYSTEMD_INVOCATION_ID=%s`:\n%s" % (
                p["unit"], invocation, "\n".join(lines))
        elif exists:
            rc, out, err = module.run_command(["docker", "logs", "--tail", "30", p["container"]])
            where = "Last log lines:\n%s" % (out + err)
        else:
            where = "The container %s is gone (a --rm container is removed when it stops): see its unit's journal." % (
                p["container"] or "(none given)")
        module.fail_json(msg="vLLM at %s was not healthy after %s s (%s). %s" % (base, p["timeout_s"], last_error, where),
                         healthy=False, waited_s=waited, **result)
    log_text = ""
    if exists:
        rc, out, err = module.run_command(["docker", "logs", p["container"]])
        if rc == 0:
            log_text = out + err
    try:
        _code, metrics_text = _get(base + "/metrics")
    except Exception as exc:
        module.fail_json(msg="vLLM at %s is healthy but /metrics failed: %s" % (base, exc),
                         healthy=True, waited_s=waited, **result)
    actual = actual_from(metrics_text, log_text)
    actual["time_to_healthy_s"] = round((seen - started).total_seconds(), 1) if started else None
    result.update(healthy=True, waited_s=waited, actual=actual,
                  table_lines=table_lines(p["plan"], actual, p["kv_sizing"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
