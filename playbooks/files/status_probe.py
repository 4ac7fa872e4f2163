# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One reading of a Spark for playbooks/status.yml, in one remote call: the serving (or Ray) unit,
its restarts in the last 24 h, liveness, the plan and the KV pool serve recorded, MemAvailable and
MemFree against memwatch's thresholds, memwatch's last event, the runtime image's tags, the next
recycle. Reads only; prints one JSON object. Standard library only.

Argument: the settings as JSON (base64), see DEFAULTS. docs/monitoring.md describes the view."""
import base64
import json
import os
import subprocess
import sys
import time

DEFAULTS = {
    "unit": "sparkops-serve.service",         # the server, or a pair worker's Ray unit
    "memwatch_unit": "memwatch.service",
    "recycle_timer": "sparkops-serve-recycle.timer",
    "liveness_state": "/var/lib/sparkops/serve/sparkops-serve-liveness/state.json",
    "serve_report": "/var/lib/sparkops/serve/plan-vs-actual.json",
    "memwatch_config": "/etc/sparkops/memwatch.json",
    "memwatch_log": "/var/log/memwatch/memwatch.log",
    "image_state": "/var/lib/sparkops/runtime-image/state.json",
    "meminfo": "/proc/meminfo",
    "systemctl": "systemctl",
    "journalctl": "journalctl",
    "now": None,
}
# systemd's "Scheduled restart job" message (an automatic restart of the unit)
RESTART_MESSAGE_ID = "5eb03494b6584870a536b337290809b3"
MEMWATCH_EVENTS = ("fired", "action", "rearmed", "incident_closed")


def run(argv, timeout=20):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    return done.stdout, (done.stderr.strip() if done.returncode else None)


def read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle), None
    except (OSError, ValueError) as exc:
        return None, "%s: %s" % (path, exc)


def unit_show(cfg, unit, props):
    out, err = run([cfg["systemctl"], "show", unit, "-p", ",".join(props)])
    values = {}
    for line in (out or "").splitlines():
        key, _sep, value = line.partition("=")
        values[key] = value
    return values, err


def usec_to_epoch(text):
    """systemd's ...USec* / ...Timestamp*Monotonic values are microseconds; 0 / empty is 'never'."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        return None
    return value / 1e6 if value > 0 else None


def restarts_24h(cfg, unit, now):
    out, err = run([cfg["journalctl"], "-u", unit, "--since", "@%d" % int(now - 86400), "-o", "json", "--no-pager",
                    "MESSAGE_ID=" + RESTART_MESSAGE_ID])
    if out is None:
        return None, err
    return sum(1 for line in out.splitlines() if line.strip()), None


def meminfo_gib(path):
    values = {}
    try:
        with open(path) as handle:
            for line in handle:
                name, _sep, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable", "MemFree"):
                    values[name] = round(int(rest.split()[0]) / 1048576.0, 3)
    except (OSError, ValueError, IndexError) as exc:
        return {}, "%s: %s" % (path, exc)
    return values, None


def last_memwatch_event(path):
    """The newest line of memwatch's JSON-lines log whose event is one of MEMWATCH_EVENTS."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 262144))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") in MEMWATCH_EVENTS:
            return {k: event.get(k) for k in ("ts", "time", "event", "rule", "result") if k in event}
    return None


def probe(cfg):
    now = cfg["now"] or time.time()
    errors = []
    unit, err = unit_show(cfg, cfg["unit"], ["ActiveState", "SubState", "ActiveEnterTimestampMonotonic",
                                             "ActiveEnterTimestamp", "NRestarts"])
    if err:
        errors.append(err)
    restarts, err = restarts_24h(cfg, cfg["unit"], now)
    if err:
        errors.append(err)
    memwatch, _err = unit_show(cfg, cfg["memwatch_unit"], ["ActiveState"])
    timer, _err = unit_show(cfg, cfg["recycle_timer"], ["ActiveState", "NextElapseUSecRealtime"])
    liveness, _err = read_json(cfg["liveness_state"])
    report, _err = read_json(cfg["serve_report"])
    thresholds, _err = read_json(cfg["memwatch_config"])
    image, _err = read_json(cfg["image_state"])
    mem, err = meminfo_gib(cfg["meminfo"])
    if err:
        errors.append(err)
    plan = (report or {}).get("plan") or {}
    actual = (report or {}).get("actual") or {}
    return {
        "unit": cfg["unit"], "state": unit.get("ActiveState") or "unknown", "sub_state": unit.get("SubState"),
        "since": unit.get("ActiveEnterTimestamp") or None, "restarts_boot": unit.get("NRestarts"),
        "restarts_24h": restarts,
        "liveness": (liveness or {}).get("state"), "liveness_reason": (liveness or {}).get("reason"),
        "image": (image or {}).get("current") or (report or {}).get("image"), "image_previous": (image or {}).get("previous"),
        "plan_gmu": plan.get("gmu"), "plan_kv_gib": plan.get("kv_exp_gib"), "actual_kv_gib": actual.get("kv_cache_gib"),
        "mem_available_gib": mem.get("MemAvailable"), "mem_free_gib": mem.get("MemFree"), "mem_total_gib": mem.get("MemTotal"),
        "memwatch": memwatch.get("ActiveState") or "unknown",
        "memwatch_available_lt_gib": (thresholds or {}).get("available_lt_gib"),
        "memwatch_available_and_free_available_lt_gib": (thresholds or {}).get("available_and_free_available_lt_gib"),
        "memwatch_available_and_free_free_lt_gib": (thresholds or {}).get("available_and_free_free_lt_gib"),
        "memwatch_last_event": last_memwatch_event(cfg["memwatch_log"]),
        "next_recycle": (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(usec_to_epoch(timer.get("NextElapseUSecRealtime"))))
                         if timer.get("ActiveState") == "active" and usec_to_epoch(timer.get("NextElapseUSecRealtime"))
                         else None),
        "errors": errors,
    }


def problems(row, kind):
    """Why a host is unhealthy (empty: healthy). kind: single, head or worker."""
    out = []
    if row["state"] != "active":
        out.append("%s is %s" % (row["unit"], row["state"]))
    if kind != "worker" and row["liveness"] not in ("live", None):
        out.append("liveness %s" % row["liveness"])
    if row["memwatch"] != "active":
        out.append("memwatch is %s" % row["memwatch"])
    avail, limit = row["mem_available_gib"], row["memwatch_available_lt_gib"]
    if avail is not None and limit is not None and avail < limit:
        out.append("MemAvailable %.2f GiB under memwatch's %.2f GiB" % (avail, limit))
    b_avail, b_free = row["memwatch_available_and_free_available_lt_gib"], row["memwatch_available_and_free_free_lt_gib"]
    if (avail is not None and row["mem_free_gib"] is not None and b_avail is not None and b_free is not None
            and avail < b_avail and row["mem_free_gib"] < b_free):
        out.append("MemAvailable and MemFree under memwatch's rule B")
    return out


def main(argv):
    """One reading (a JSON object); with "servers" (a Spark with several models: each its model, unit,
    recycle_timer, liveness_state and serve_report), a JSON list of one reading per model."""
    cfg = dict(DEFAULTS)
    if len(argv) > 1:
        cfg.update(json.loads(base64.b64decode(argv[1]).decode("utf-8")))
    rows = []
    for server in cfg.get("servers") or [{}]:
        row = probe(dict(cfg, **server))
        row["problems"] = problems(row, cfg.get("kind", "single"))
        if server:
            row["model"] = server["model"]
        rows.append(row)
    print(json.dumps(rows if cfg.get("servers") else rows[0], sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
