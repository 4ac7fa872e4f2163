"""Helpers of the memwatch scenario's tests: the lab Spark's files memwatch reads and writes, the
stand-in serving container's state, and a bounded wait."""
import base64
import json
import time

NAME = "sparkops-memwatch-test-serve"
TEST_DIR = "/var/lib/memwatch-test"
METRICS = "/var/lib/prometheus/node-exporter/memwatch.prom"
ARCHIVES = "/var/lib/memwatch/incidents"
LOG = "/var/log/memwatch/memwatch.log"
GIB = 1024 * 1024
IGNORE_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "print('stand-in vLLM ignoring SIGTERM: serving', flush=True); time.sleep(1800)")
NV = "NVRM: nvAssertFailedNoLog: NV_ERR_NO_MEMORY occurred (test line %d)"


def meminfo(avail_gib, free_gib):
    return ("MemTotal:       127599524 kB\nMemFree:        %d kB\nMemAvailable:   %d kB\n"
            "Cached:         30000000 kB\nAnonPages:       3000000 kB\nShmem:             20000 kB\n"
            "Slab:             900000 kB\nPageTables:        65000 kB\n" % (free_gib * GIB, avail_gib * GIB))


def write_meminfo(host, avail_gib, free_gib):
    text = meminfo(avail_gib, free_gib)
    # only letters, digits, spaces, colons and newlines: safe inside a printf format
    cmd = "printf '%s' > %s/meminfo.tmp && mv %s/meminfo.tmp %s/meminfo" % (
        text.replace("\n", "\\n"), TEST_DIR, TEST_DIR, TEST_DIR)
    host.run_test(cmd)
    assert host.file(TEST_DIR + "/meminfo").content_string == text


def metrics(host):
    out = {}
    for line in host.file(METRICS).content_string.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def wait_for(what, check, timeout=60, step=0.5):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = check()
        if last:
            return last
        time.sleep(step)
    raise AssertionError("timed out after %ss waiting for %s (last: %r)" % (timeout, what, last))


def container_state(host):
    res = host.run("docker inspect -f '{{.State.Running}} {{.State.ExitCode}}' %s" % NAME)
    if res.rc != 0:
        return None
    running, code = res.stdout.split()
    return running == "true", int(code)


def events(host, name):
    return [json.loads(line) for line in host.file(LOG).content_string.splitlines()
            if json.loads(line)["event"] == name]


def put_file(host, path, text, mode="0644"):
    """Write ``text`` to ``path`` on the lab Spark exactly (base64: no quoting issues)."""
    data = base64.b64encode(text.encode("utf-8")).decode("ascii")
    host.run_test("echo %s | base64 -d > %s.tmp && chmod %s %s.tmp && mv %s.tmp %s" % (data, path, mode, path, path, path))
    assert host.file(path).content_string == text


def start_the_serve_unit_and_fire(host, nth, timeout=60):
    """Start sparkops-serve.service, wait for its container, make memory low and return memwatch's
    nth action (waited for in its log, at most `timeout` s)."""
    host.run_test("systemctl daemon-reload && systemctl start sparkops-serve.service")
    wait_for("the unit's container", lambda: container_state(host) == (True, 0))
    write_meminfo(host, 5, 3)
    return wait_for("action %d" % nth, lambda: len(events(host, "action")) == nth and events(host, "action"), timeout)[-1]
