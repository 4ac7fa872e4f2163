"""Helpers for memwatch's tests: the program imported by path, fake meminfo, a fake docker CLI.

memwatch is a stand-alone executable (roles/memwatch/files/memwatch), not a package: it is loaded
with importlib from its path. The only thing faked is what cannot exist here: a serving
container behind the docker CLI (and systemctl/journalctl where a test needs to steer them).
"""
import importlib.machinery
import importlib.util
import json
import os
import stat
import sys

import pytest

import harness

ROOT = harness.ROOT
PROGRAM = os.path.join(ROOT, "roles", "memwatch", "files", "memwatch")
GIB = 1024 * 1024  # kB per GiB


def load_memwatch():
    loader = importlib.machinery.SourceFileLoader("memwatch_under_test", PROGRAM)
    spec = importlib.util.spec_from_loader("memwatch_under_test", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def mw():
    return load_memwatch()


def meminfo(avail_gib, free_gib, total_gib=121.69, **extra_kib):
    """A /proc/meminfo snapshot with MemAvailable / MemFree in GiB (printed in kB like the kernel)."""
    fields = [
        ("MemTotal", int(total_gib * GIB)),
        ("MemFree", int(free_gib * GIB)),
        ("MemAvailable", int(avail_gib * GIB)),
        ("Buffers", 1024),
        ("Cached", extra_kib.get("Cached", int(max(avail_gib - free_gib, 0) * GIB))),
        ("SwapCached", 0),
        ("AnonPages", extra_kib.get("AnonPages", 3 * GIB)),
        ("Shmem", extra_kib.get("Shmem", 2048)),
        ("Slab", extra_kib.get("Slab", 900000)),
        ("PageTables", extra_kib.get("PageTables", 65000)),
        ("HugePages_Total", 0),
    ]
    return "".join("%-16s%10d kB\n" % (k + ":", v) if not k.startswith("HugePages") else
                   "%-16s%10d\n" % (k + ":", v) for k, v in fields)


def trace(samples):
    """A trace file body: snapshots separated by lines containing only '---'."""
    return "---\n".join(meminfo(a, f) for a, f in samples)


FAKE_DOCKER = r'''#!/usr/bin/env python3
# A fake docker CLI for memwatch's tests: one container whose state is a JSON file.
import json, os, sys, time
path = os.environ["FAKE_DOCKER_STATE"]
with open(path) as h:
    st = json.load(h)
argv = sys.argv[1:]
st.setdefault("calls", []).append(argv)
def save():
    with open(path, "w") as h:
        json.dump(st, h)
save()
# The engine: "up", "down" (every call fails as when dockerd is not running) or "hang" (no
# answer: a hung engine). engine_down_calls: only the next N calls fail, then it is up again.
engine = st.get("engine", "up")
if st.get("engine_down_calls", 0) > 0:
    st["engine_down_calls"] -= 1; engine = "down"; save()
if engine == "down":
    sys.stderr.write("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                     "Is the docker daemon running?\n"); sys.exit(1)
if engine == "hang":
    time.sleep(60)
name = argv[-1]
exists = st.get("exists", True) and name == st.get("name")
if argv[0] == "inspect":
    if not exists:
        sys.stderr.write("Error: No such object: %s\n" % name); sys.exit(1)
    if "-f" in argv:
        print("%s %d" % ("true" if st["running"] else "false", st.get("exit_code", 0)))
    else:
        # "inspect": the whole document a test wants (e.g. a Config.Env with secrets)
        print(json.dumps(st.get("inspect") or [{"Name": "/" + name, "State": {"Running": st["running"]}}]))
elif argv[0] == "logs":
    if not exists:
        sys.stderr.write("Error: No such container: %s\n" % name); sys.exit(1)
    print("2025-01-01T00:00:00Z INFO serving the model")
    sys.stderr.write("2025-01-01T00:00:01Z WARNING stderr line\n")
elif argv[0] == "stop":
    mode = st.get("mode", "graceful")
    if mode == "hang":
        time.sleep(60)
    if mode == "fail":
        sys.stderr.write("Error response from daemon: cannot stop\n"); sys.exit(1)
    st["running"] = False
    st["exit_code"] = 137 if mode == "ignore_term" else 0
    save(); print(name)
elif argv[0] == "kill":
    # kill_mode "fail": the engine answers but cannot kill it (a process stuck in the driver)
    if st.get("kill_mode") == "fail":
        sys.stderr.write("Error response from daemon: cannot kill container: %s: tried to kill container, "
                         "but did not receive an exit event\n" % name); sys.exit(1)
    st["running"] = False; st["exit_code"] = 137; save(); print(name)
else:
    sys.exit(64)
'''

FAKE_SYSTEMCTL = r'''#!/usr/bin/env python3
# A fake systemctl for one unit (the serve unit). `stop <unit>` stops the fake container, as
# the serve unit's ExecStop would; unit_state is its ActiveState. stop_mode "fail": the stop
# job fails and the unit stays active; "hang": the stop job never ends (its ExecStop waits on a
# hung engine): the unit is deactivating and systemctl does not return. `kill` kills the unit's
# processes: a pending stop job then completes (inactive); like the real unit, whose main
# process is the docker client, it does not touch the container. unit_kill_mode "ignore": the
# processes do not die (stuck in the kernel): the unit keeps its state.
import json, os, sys, time
path = os.environ["FAKE_DOCKER_STATE"]
with open(path) as h:
    st = json.load(h)
argv = sys.argv[1:]
st.setdefault("systemctl_calls", []).append(argv)
loaded = st.get("unit_loaded", True)
rc = 0
if not loaded and argv[0] in ("stop", "kill"):
    sys.stderr.write("Failed to %s %s: Unit not loaded.\\n" % (argv[0], argv[-1])); rc = 5
elif argv[0] == "stop" and "--no-block" in argv:
    if st.get("unit_state", "active") == "active":
        st["unit_state"] = "deactivating"
elif argv[0] == "stop" and st.get("stop_mode") == "hang":
    st["unit_state"] = "deactivating"
    with open(path, "w") as h:
        json.dump(st, h)
    time.sleep(60)
elif argv[0] == "stop":
    if st.get("stop_mode") == "fail":
        sys.stderr.write("Job for %s failed.\\n" % argv[-1]); rc = 1
    else:
        st["running"] = False; st["exit_code"] = 0; st["unit_state"] = "inactive"
elif argv[0] == "kill" and st.get("unit_kill_mode") == "ignore":
    pass
elif argv[0] == "kill":
    st["unit_state"] = "inactive" if st.get("unit_state") == "deactivating" else "failed"
elif argv[0] == "show":
    print("LoadState=%s" % ("loaded" if loaded else "not-found"))
    print("ActiveState=%s" % (st.get("unit_state", "active") if loaded else "inactive"))
else:
    rc = 64
with open(path, "w") as h:
    json.dump(st, h)
sys.exit(rc)
'''


def _fast_shebang(body):
    """The stand-ins run under this Python directly, without site (-S: they need the standard
    library only): '#!/usr/bin/env python3' went through the pyenv shim, which costs more than the
    stand-in's own work on every docker/systemctl/journalctl call memwatch makes."""
    first, rest = body.split("\n", 1)
    assert first == "#!/usr/bin/env python3", first
    return "#!%s -S\n%s" % (sys.executable, rest)


def _script(path, body):
    with open(path, "w") as handle:
        handle.write(_fast_shebang(body))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


class Lab:
    """A temp tree for one watchdog: meminfo file, config, fake docker/systemctl, state."""

    def __init__(self, tmp_path, monkeypatch):
        self.tmp = tmp_path
        self.docker_state = tmp_path / "fake-docker.json"
        monkeypatch.setenv("FAKE_DOCKER_STATE", str(self.docker_state))
        self.set_container(running=True)
        self.meminfo_path = tmp_path / "meminfo"
        self.write_meminfo(60, 30)
        self.shm = tmp_path / "shm"
        self.shm.mkdir()
        self.config = {
            "interval_s": 0.01,
            "meminfo_path": str(self.meminfo_path),
            "container_name": "vllm-test",
            "stop_via_unit": False,
            "stop_grace_s": 0,
            "kill_timeout_s": 2,
            "docker": _script(tmp_path / "docker", FAKE_DOCKER),
            "systemctl": _script(tmp_path / "systemctl", FAKE_SYSTEMCTL),
            "archive_dir": str(tmp_path / "incidents"),
            "log_file": str(tmp_path / "log" / "memwatch.log"),
            "metrics_file": str(tmp_path / "memwatch.prom"),
            "state_file": str(tmp_path / "state.json"),
            "kernel_log_source": "none",
            "shm_dir": str(self.shm),
        }
        os.makedirs(str(tmp_path / "log"))
        self.dogs = []

    def set_container(self, **fields):
        st = {"name": "vllm-test", "running": True, "exit_code": 0, "mode": "graceful"}
        if self.docker_state.exists():
            st = json.loads(self.docker_state.read_text())
        st.update(fields)
        self.docker_state.write_text(json.dumps(st))

    def container(self):
        return json.loads(self.docker_state.read_text())

    def write_meminfo(self, avail_gib, free_gib):
        tmp = self.tmp / "meminfo.tmp"
        tmp.write_text(meminfo(avail_gib, free_gib))
        os.rename(str(tmp), str(self.meminfo_path))

    def write_config(self, **overrides):
        cfg = dict(self.config, **overrides)
        path = self.tmp / "memwatch.json"
        path.write_text(json.dumps(cfg))
        return str(path)

    def watchdog(self, mw, **overrides):
        cfg = mw.validate_config(dict(self.config, **overrides))
        dog = mw.Watchdog(cfg, mw.Log(cfg["log_file"], cfg["log_max_bytes"], stream=open(os.devnull, "w")))
        self.dogs.append(dog)
        return dog

    def close(self):
        for dog in self.dogs:
            close = getattr(dog, "close", None)
            if close is not None:
                close()

    def log_events(self):
        path = self.tmp / "log" / "memwatch.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def metrics(self):
        return parse_metrics((self.tmp / "memwatch.prom").read_text())


def parse_metrics(text):
    """Strict-enough parser of the Prometheus text format: {(name, frozenset(labels)): value}."""
    import re
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")*)\})? (\S+)$')
    out = {}
    typed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _h, _t, name, kind = line.split(" ", 3)
            assert kind in ("gauge", "counter"), line
            typed.add(name)
            continue
        if line.startswith("# HELP ") or not line:
            continue
        m = sample.match(line)
        assert m, "not a valid exposition line: %r" % line
        assert m.group(1) in typed, "sample before its TYPE: %r" % line
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(5))
    return out


@pytest.fixture
def lab(tmp_path, monkeypatch):
    the_lab = Lab(tmp_path, monkeypatch)
    yield the_lab
    the_lab.close()


@pytest.fixture
def run_memwatch():
    import subprocess

    def run(*args, **kwargs):
        return subprocess.run([sys.executable, PROGRAM] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=120, **kwargs, check=False)
    return run


# A stand-in journalctl -k (a script, named as such): entries are the lines of $FAKE_JOURNAL and
# the cursor is the line number; it appends its pid to $FAKE_JOURNAL_PIDS and sleeps
# $FAKE_JOURNAL_SLEEP seconds before answering (a slow or hung journal).
FAKE_JOURNALCTL = r'''#!/usr/bin/env python3
import os, sys, time
with open(os.environ["FAKE_JOURNAL_PIDS"], "a") as h:
    h.write("%d\n" % os.getpid())
time.sleep(float(os.environ["FAKE_JOURNAL_SLEEP"]))
lines = open(os.environ["FAKE_JOURNAL"]).read().splitlines()
after = -1
if "--after-cursor" in sys.argv:
    after = int(sys.argv[sys.argv.index("--after-cursor") + 1].split("=")[1])
assert "-k" in sys.argv and "--show-cursor" in sys.argv
shown = [(i, l) for i, l in enumerate(lines) if i > after]
for _i, l in shown:
    print(l)
if shown:
    print("-- cursor: s=%d" % shown[-1][0])
'''


def fake_journalctl(lab, monkeypatch, text, sleep_s=0):
    """Install the stand-in journalctl with text as the journal; returns (its path, the journal
    file, the file its pids are written to)."""
    journal = lab.tmp / "journal.txt"
    journal.write_text(text)
    pids = lab.tmp / "journalctl.pids"
    monkeypatch.setenv("FAKE_JOURNAL", str(journal))
    monkeypatch.setenv("FAKE_JOURNAL_PIDS", str(pids))
    monkeypatch.setenv("FAKE_JOURNAL_SLEEP", str(sleep_s))
    jctl = lab.tmp / "journalctl"
    jctl.write_text(_fast_shebang(FAKE_JOURNALCTL))
    os.chmod(str(jctl), 0o755)
    return str(jctl), journal, pids
