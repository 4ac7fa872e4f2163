"""The gateway's added latency on a short completion, against the same server asked directly, in
one run (docs/gateway.md). Target: the gateway's median <= 1.05x the direct median.

Both paths send the same request (the served model, a short prompt, max_tokens tokens, temperature
0). The gateway balances over every server of the model and nothing is changed for the run: its
answers are kept only when its X-Sparkops-Server header names the server the direct path asks, so
both columns time the same vLLM. Rounds alternate (direct, gateway, direct, ...) so that a drift of
the machine's load hits both alike. One warm-up request each first.

Reported: requests kept per path, median / p90 ms per path, and the ratio of the medians.

Usage (the built-in lab, after `make lab`):
  python3 benchmarks/gateway_latency.py [--rounds 60] [--gateway http://172.31.250.21:8080]
      [--server spark-lab-1 --direct http://172.31.250.11:8000] [--keep-alive]
Keys: the lab's (inventories/lab/group_vars/*/lab_overrides.yml), or --gateway-key / --server-key.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import time
import urllib.parse
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB = os.path.join(ROOT, "inventories", "lab", "group_vars")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def lab_key(group, name):
    with open(os.path.join(LAB, group, "lab_overrides.yml")) as handle:
        value = yaml.safe_load(handle)[name]
    return value[0] if isinstance(value, list) else value


_KEPT = {}   # --keep-alive: one HTTP/1.1 connection per base URL, as an API client's pool keeps it


def completion(url, key, model, max_tokens, keep_alive=False):
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    if keep_alive:
        start = time.perf_counter()
        conn = _KEPT.get(url)
        if conn is None:
            parts = urllib.parse.urlsplit(url)
            conn = _KEPT[url] = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=120)
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return time.perf_counter() - start, resp.headers.get("X-Sparkops-Server", "")
    req = urllib.request.Request(url + "/v1/completions", data=body, headers=headers)
    start = time.perf_counter()
    with _NO_PROXY.open(req, timeout=120) as resp:
        resp.read()
        return time.perf_counter() - start, resp.headers.get("X-Sparkops-Server", "")


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--gateway", default="http://172.31.250.21:8080")
    parser.add_argument("--direct", default="http://172.31.250.11:8000")
    parser.add_argument("--server", default="spark-lab-1", help="the inventory name of the server --direct reaches")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--gateway-key", default=None)
    parser.add_argument("--server-key", default=None)
    parser.add_argument("--keep-alive", action="store_true",
                        help="one kept connection per path (an API client's pool) instead of a new one per request")
    args = parser.parse_args()
    gateway_key = args.gateway_key or lab_key("gateways", "vault_gateway_client_api_keys")
    server_key = args.server_key or lab_key("sparks", "vault_serve_api_key")
    completion(args.direct, server_key, args.model, args.max_tokens, args.keep_alive)
    completion(args.gateway, gateway_key, args.model, args.max_tokens, args.keep_alive)
    direct, gateway, other = [], [], 0
    for _round in range(args.rounds):
        direct.append(completion(args.direct, server_key, args.model, args.max_tokens, args.keep_alive)[0])
        # the gateway balances over the backend's servers: ask until it is the same one (at most 5)
        for _try in range(5):
            took, server = completion(args.gateway, gateway_key, args.model, args.max_tokens, args.keep_alive)
            if server == args.server:
                gateway.append(took)
                break
            other += 1
    if not gateway:
        sys.exit("no gateway answer came from %s (its X-Sparkops-Server): is --server the server --direct reaches?" % args.server)
    out = {
        "rounds": args.rounds, "keep_alive": args.keep_alive, "kept": {"direct": len(direct), "gateway": len(gateway)}, "other_server_answers": other,
        "direct_ms": {"median": round(statistics.median(direct) * 1000, 2), "p90": round(quantile(direct, 0.9) * 1000, 2)},
        "gateway_ms": {"median": round(statistics.median(gateway) * 1000, 2), "p90": round(quantile(gateway, 0.9) * 1000, 2)},
    }
    out["ratio_median"] = round(statistics.median(gateway) / statistics.median(direct), 3)
    out["target"] = "<= 1.05"
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
