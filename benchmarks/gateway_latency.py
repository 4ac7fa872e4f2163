"""The gateway's added latency on a short completion, against the same server asked directly, in
one run (docs/gateway.md). Target: the gateway's median <= 1.05x the direct median.

Both paths send the same request (the served model, a short prompt, max_tokens tokens, temperature
0). The gateway balances over every server of the model and nothing is changed for the run: its
answers are kept only when its X-Sparkops-Server header names the server the direct path asks, so
both columns time the same vLLM. Each round asks the gateway until that server answers, then replays
the same sequence directly: the servers the gateway reached first in the round are asked directly
first (their answers not kept), then the kept direct request. So each kept request of either path
follows the same requests to the same servers: on the lab, where every Spark's CPU vLLM shares the
machine's cores, a completion that follows one on another server is slower (that server is still
busy finishing) than one that follows its own, and asking the direct path without the replay timed
that difference as the gateway's (1.11-1.19x, benchmarks/README.md). Rounds alternate, so a drift of
the machine's load hits both alike. One warm-up request each first.

Reported: requests kept per path, median / p90 ms per path, and the ratio of the medians.

Usage (the built-in lab, after `make lab`):
  python3 benchmarks/gateway_latency.py [--rounds 150] [--gateway http://172.31.250.21:8080]
      [--server spark-lab-1 --direct http://172.31.250.11:8000] [--keep-alive]
      [--direct-of spark-lab-2=http://172.31.250.12:8000 ...] [--sequence-check]
--direct-of: how to reach each other server of the model directly (default: the lab inventory's
Sparks at their lab_ip, port 8000).
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


def lab_servers():
    """{inventory name: its server's URL} for the lab inventory's Sparks (lab_ip, the served port 8000)."""
    with open(os.path.join(ROOT, "inventories", "lab", "hosts.yml")) as handle:
        hosts = yaml.safe_load(handle)["all"]["children"]["lab"]["children"]["sparks"]["hosts"]
    return {name: "http://%s:8000" % spec["lab_ip"] for name, spec in hosts.items()}


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


def sequence_check(args, key, direct_of):
    """Direct only, alternating: the server's completion right after one to itself, and right after
    one to another server (the first other of direct_of)."""
    others = [url for name, url in sorted(direct_of.items()) if name != args.server]
    if not others:
        sys.exit("--sequence-check needs another server (--direct-of NAME=URL)")

    def ask(url):
        return completion(url, key, args.model, args.max_tokens, args.keep_alive)[0]

    ask(args.direct)
    ask(others[0])
    after_itself, after_other = [], []
    for _round in range(args.rounds):
        ask(args.direct)
        after_itself.append(ask(args.direct))
        ask(others[0])
        after_other.append(ask(args.direct))
    itself, other = statistics.median(after_itself), statistics.median(after_other)
    print(json.dumps({"rounds": args.rounds, "after_itself_ms": round(itself * 1000, 2),
                      "after_another_server_ms": round(other * 1000, 2), "ratio_median": round(other / itself, 3)}, indent=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--gateway", default="http://172.31.250.21:8080")
    parser.add_argument("--direct", default="http://172.31.250.11:8000")
    parser.add_argument("--server", default="spark-lab-1", help="the inventory name of the server --direct reaches")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--gateway-key", default=None)
    parser.add_argument("--server-key", default=None)
    parser.add_argument("--keep-alive", action="store_true",
                        help="one kept connection per path (an API client's pool) instead of a new one per request")
    parser.add_argument("--sequence-check", action="store_true",
                        help="no gateway: the direct server's completion after one to itself against after one to "
                             "another server (the effect the replay evens out)")
    parser.add_argument("--direct-of", action="append", default=[], metavar="NAME=URL",
                        help="another server of the model and its URL, for the direct replay (repeatable)")
    args = parser.parse_args()
    direct_of = lab_servers() if not args.direct_of else {}
    for item in args.direct_of:
        name, _sep, url = item.partition("=")
        if not url:
            sys.exit("--direct-of %s: expected NAME=URL" % item)
        direct_of[name] = url
    direct_of[args.server] = args.direct
    server_key = args.server_key or lab_key("sparks", "vault_serve_api_key")
    if args.sequence_check:
        sequence_check(args, server_key, direct_of)
        return
    gateway_key = args.gateway_key or lab_key("gateways", "vault_gateway_client_api_keys")
    completion(args.direct, server_key, args.model, args.max_tokens, args.keep_alive)
    completion(args.gateway, gateway_key, args.model, args.max_tokens, args.keep_alive)
    direct, gateway, other = [], [], 0
    for _round in range(args.rounds):
        # the gateway balances over the backend's servers: ask until it is the same one (at most 5)
        before = []
        for _try in range(5):
            took, server = completion(args.gateway, gateway_key, args.model, args.max_tokens, args.keep_alive)
            if server == args.server:
                gateway.append(took)
                break
            before.append(server)
            other += 1
        else:
            continue
        # the same sequence directly: the servers the gateway reached first, then the kept request
        for server in before:
            if server not in direct_of:
                sys.exit("the gateway's answer came from %s, which --direct-of does not name" % server)
            completion(direct_of[server], server_key, args.model, args.max_tokens, args.keep_alive)
        direct.append(completion(args.direct, server_key, args.model, args.max_tokens, args.keep_alive)[0])
    if not gateway or not direct:
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
