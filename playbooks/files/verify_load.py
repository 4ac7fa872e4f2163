# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""verify.yml's load and stability client (SPEC section 9, steps 3 and 4), run on the Spark with the
host's python3 and its standard library only.

Reads one JSON object, its config, on stdin (see playbooks/verify.yml): never on its command line,
where `ps` and /proc/<pid>/cmdline show the API key to every user for the whole run; prints one
JSON report (the config without api_key):
- target_length: sequential streamed completions at the target prompt length;
- concurrency: the target concurrency, half prefill-heavy (long prompt, few tokens out), half
  decode-heavy (short prompt, many tokens out);
- rounds: a burst like the concurrency phase, an idle pause, then /proc/meminfo and the new
  kernel-log error lines; the band check says whether memory returns to a stable band.
Latencies: TTFT (first streamed token), TPOT (time per output token after the first, per request:
(e2e - TTFT) / (tokens - 1), as vLLM's own serving benchmark reports it), inter-token (the gaps between
streamed events as this client read them: events that arrive in one read give gaps of 0, so it
describes the network and the reader as much as the server), end to end.
"""

from __future__ import absolute_import, division, print_function

import asyncio
import json
import re
import subprocess
import sys
import time
from urllib.parse import urlsplit

MEMINFO_FIELDS = ("MemTotal", "MemAvailable", "MemFree", "Cached", "AnonPages", "Slab", "PageTables")
KERNEL_ERRORS = re.compile(r"NV_ERR_NO_MEMORY|Out of memory|oom-kill|Xid|NVRM: .*error", re.IGNORECASE)


def percentiles(values):
    """p50/p90/p99/max/mean in milliseconds of a list of seconds (nearest-rank)."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def rank(p):
        index = max(0, min(len(ordered) - 1, int(-(-p * len(ordered) // 100)) - 1))
        return round(ordered[index] * 1000.0, 1)
    return {"n": len(ordered), "p50_ms": rank(50), "p90_ms": rank(90), "p99_ms": rank(99),
            "max_ms": round(ordered[-1] * 1000.0, 1), "mean_ms": round(sum(ordered) / len(ordered) * 1000.0, 1)}


def band_check(rounds, band_gib):
    """Memory must come back to a stable band between rounds. The host's used memory
    (MemTotal - MemAvailable) fails the check when it keeps growing: its least-squares trend over the
    rounds adds up to more than band_gib from the first round to the last, AND the last round is
    above every round of the first half (it did not come back). A one-off step that then stays flat
    (a warm-up allocation), a spike that comes back, or noise inside the band pass; one noisy step
    down does not hide a steady leak (machine-wide figures on a shared host are noisy)."""
    used = [r["meminfo_gib"]["MemTotal"] - r["meminfo_gib"]["MemAvailable"] for r in rounds]
    if len(used) < 2:
        return {"ok": True, "reason": "fewer than two rounds", "used_gib": used}
    steps = [round(b - a, 3) for a, b in zip(used, used[1:])]
    count = len(used)
    mean_x, mean_y = (count - 1) / 2.0, sum(used) / count
    slope = (sum((i - mean_x) * (u - mean_y) for i, u in enumerate(used))
             / sum((i - mean_x) ** 2 for i in range(count)))
    trend = round(slope * (count - 1), 3)
    came_back = used[-1] <= max(used[:count // 2])
    ok = not (trend > band_gib and not came_back)
    return {"ok": ok, "band_gib": band_gib, "growth_gib": round(used[-1] - used[0], 3), "trend_gib": trend,
            "steps_gib": steps, "rising_steps": len([x for x in steps if x > 0]), "came_back": came_back,
            "used_gib": [round(u, 3) for u in used],
            "reason": ("within the band" if ok else
                       "used memory grew %.3f GiB over %d rounds (trend %.3f GiB, band %.3f GiB) and did not come back"
                       % (used[-1] - used[0], count, trend, band_gib))}


def meminfo():
    out = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            name, _sep, rest = line.partition(":")
            parts = rest.split()
            if name in MEMINFO_FIELDS and parts and parts[-1] == "kB":
                out[name] = round(int(parts[0]) / 1048576.0, 4)
    return out


def kernel_errors(since):
    """New kernel-log lines matching KERNEL_ERRORS since `since` (epoch s); source says where from."""
    try:
        proc = subprocess.run(["journalctl", "-k", "-o", "cat", "--no-pager", "--since", "@%d" % int(since)],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"source": "unavailable (%s)" % exc, "count": 0, "lines": []}
    if proc.returncode != 0:
        return {"source": "unavailable (journalctl -k: %s)" % proc.stderr.strip()[:200], "count": 0, "lines": []}
    lines = [x for x in proc.stdout.splitlines() if KERNEL_ERRORS.search(x)]
    return {"source": "journalctl -k", "count": len(lines), "lines": lines[-10:]}


async def _read_body(reader, headers):
    """Yield body pieces of a chunked or plain HTTP/1.1 response."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readline()
            yield data
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


async def completion(cfg, prompt, max_tokens):
    """One streamed completion: {'ok', 'ttft', 'itl': [...], 'tpot', 'e2e', 'tokens', 'error'}."""
    url = urlsplit(cfg["url"])
    body = json.dumps({"model": cfg["model"], "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    head = ["POST /v1/completions HTTP/1.1", "Host: %s" % url.netloc, "Content-Type: application/json",
            "Content-Length: %d" % len(body), "Connection: close", "Accept: text/event-stream"]
    if cfg.get("api_key"):
        head.append("Authorization: Bearer %s" % cfg["api_key"])
    start = time.monotonic()
    result = {"ok": False, "ttft": None, "itl": [], "tpot": None, "e2e": None, "tokens": 0, "error": ""}
    streamed = 0
    writer = None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(url.hostname, url.port or 80), cfg["request_timeout_s"])
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        status = (await reader.readline()).decode(errors="replace").split()
        headers = {}
        while True:
            line = (await reader.readline()).decode(errors="replace").strip()
            if not line:
                break
            name, _sep, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if len(status) < 2 or status[1] != "200":
            result["error"] = "HTTP %s" % (status[1] if len(status) > 1 else "?")
            return result
        buffer, last = b"", None
        async for piece in _read_body(reader, headers):
            buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = event.decode(errors="replace").strip()
                if not data.startswith("data:"):
                    continue
                data = data[5:].strip()
                if data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if chunk.get("usage"):
                    result["tokens"] = chunk["usage"].get("completion_tokens", result["tokens"])
                if any(c.get("text") for c in chunk.get("choices", [])):
                    streamed += 1
                    now = time.monotonic()
                    if last is None:
                        result["ttft"] = now - start
                    else:
                        result["itl"].append(now - last)
                    last = now
        result["e2e"] = time.monotonic() - start
        result["tokens"] = result["tokens"] or streamed
        result["tpot"] = tpot(result["ttft"], result["e2e"], result["tokens"])
        result["ok"] = result["ttft"] is not None
        if not result["ok"]:
            result["error"] = "no token streamed"
    except (OSError, asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        if writer is not None:
            writer.close()
    return result


def tpot(ttft, e2e, tokens):
    """Time per output token after the first, in s: (e2e - ttft) / (tokens - 1); None below 2 tokens."""
    if ttft is None or e2e is None or tokens < 2:
        return None
    return (e2e - ttft) / (tokens - 1)


def prompt_of(tokens):
    """About `tokens` prompt tokens (one per repeated word with Llama-style tokenizers)."""
    return " ".join(["hello"] * max(1, int(tokens)))


async def run_phase(cfg, jobs, concurrency):
    """jobs: [(kind, prompt_tokens, max_tokens)]; at most `concurrency` at once."""
    queue = list(jobs)
    results = []

    async def worker():
        while queue:
            kind, prompt_tokens, max_tokens = queue.pop(0)
            try:
                result = await asyncio.wait_for(completion(cfg, prompt_of(prompt_tokens), max_tokens), cfg["request_timeout_s"])
            except asyncio.TimeoutError:
                result = {"ok": False, "ttft": None, "itl": [], "tpot": None, "e2e": None, "tokens": 0,
                          "error": "no answer within %s s" % cfg["request_timeout_s"]}
            result["kind"] = kind
            results.append(result)
    start = time.monotonic()
    await asyncio.gather(*[worker() for _worker in range(max(1, concurrency))])
    return results, time.monotonic() - start


def summarise(results, wall):
    ok = [r for r in results if r["ok"]]
    out = {"requests": len(results), "failed": len(results) - len(ok), "wall_s": round(wall, 2),
           "ttft": percentiles([r["ttft"] for r in ok]),
           "tpot": percentiles([r["tpot"] for r in ok if r["tpot"] is not None]),
           "inter_token": percentiles([x for r in ok for x in r["itl"]]),
           "e2e": percentiles([r["e2e"] for r in ok]),
           "output_tokens": sum(r["tokens"] for r in ok),
           "errors": sorted(set(r["error"] for r in results if r["error"]))[:5]}
    out["output_tokens_per_s"] = round(out["output_tokens"] / wall, 2) if wall > 0 else None
    return out


def mixed_jobs(cfg, count):
    prefill = ("prefill", cfg["prompt_tokens"], cfg["prefill_max_tokens"])
    decode = ("decode", cfg["decode_prompt_tokens"], cfg["max_tokens"])
    return [prefill if i % 2 == 0 else decode for i in range(count)]


class LeakStandIn(object):
    """A STAND-IN for a leaking server, for tests only: a child process that keeps N MiB more per round."""

    def __init__(self, mib):
        code = ("import sys\nkept = []\nfor line in sys.stdin:\n"
                "    kept.append(bytearray(b'x' * (%d * 1048576)))\n    print('grown', flush=True)\n" % mib)
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def grow(self):
        self.proc.stdin.write("grow\n")
        self.proc.stdin.flush()
        self.proc.stdout.readline()

    def close(self):
        self.proc.kill()
        self.proc.wait()


async def main_async(cfg):
    report = {"config": dict((k, v) for k, v in cfg.items() if k != "api_key")}
    # The lab's CPU vLLM wants a short first request after a start; on a Spark it is one cheap request.
    await completion(cfg, "hello", 4)
    results, wall = await run_phase(cfg, [("target", cfg["prompt_tokens"], cfg["max_tokens"])] * cfg["requests"], 1)
    report["target_length"] = summarise(results, wall)
    results, wall = await run_phase(cfg, mixed_jobs(cfg, cfg["requests"] * cfg["concurrency"]), cfg["concurrency"])
    report["concurrency"] = summarise(results, wall)
    for kind in ("prefill", "decode"):
        report["concurrency"][kind] = summarise([r for r in results if r["kind"] == kind], wall)
    leak = LeakStandIn(cfg["leak_standin_mib"]) if cfg.get("leak_standin_mib") else None
    rounds = []
    try:
        for index in range(cfg["rounds"]):
            since = time.time()
            results, wall = await run_phase(cfg, mixed_jobs(cfg, cfg["round_requests"]), cfg["concurrency"])
            if leak:
                leak.grow()
            await asyncio.sleep(cfg["settle_s"])
            rounds.append({"round": index + 1, "load": summarise(results, wall), "meminfo_gib": meminfo(),
                           "kernel_errors": kernel_errors(since)})
    finally:
        if leak:
            leak.close()
    report["rounds"] = rounds
    report["leak_standin_mib_per_round"] = cfg.get("leak_standin_mib") or 0
    report["band"] = band_check(rounds, cfg["band_gib"])
    report["kernel_error_lines"] = sum(r["kernel_errors"]["count"] for r in rounds)
    report["failed_requests"] = (report["target_length"]["failed"] + report["concurrency"]["failed"]
                                 + sum(r["load"]["failed"] for r in rounds))
    return report


DEFAULTS = {"url": "http://127.0.0.1:8000", "model": "model", "api_key": "", "prompt_tokens": 512, "max_tokens": 64,
            "decode_prompt_tokens": 16, "prefill_max_tokens": 4, "requests": 8, "concurrency": 4, "rounds": 5,
            "round_requests": 8, "settle_s": 10, "band_gib": 0.5, "request_timeout_s": 300, "leak_standin_mib": 0}


def main():
    if len(sys.argv) > 1:
        sys.exit("verify_load.py takes its config as JSON on stdin, not as arguments (a command line is "
                 "visible to every user of the host)")
    cfg = dict(DEFAULTS)
    text = sys.stdin.read()
    cfg.update(json.loads(text) if text.strip() else {})
    print(json.dumps(asyncio.run(main_async(cfg))))


if __name__ == "__main__":
    main()
