# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve unit's memory check before each start (roles/serve/files/serve-memcheck, SPEC §4 and
§11), run as the unit runs it, against meminfo copies in memcheck_fixtures/ (a DGX Spark's layout,
MemTotal 121.69 GiB, and a small host), a process tree under tmp_path and a plain file standing in
for /proc/sys/vm/drop_caches: enough memory starts with nothing dropped; MemFree alone short drops
the page cache (1) and starts; MemAvailable short refuses, changes nothing and names the largest
holders; need + margin == MemAvailable is enough; bad inputs exit 2 naming the option."""
import os
import re
import subprocess
import sys
import threading

import pytest

import harness

SCRIPT = os.path.join(harness.ROOT, "roles", "serve", "files", "serve-memcheck")
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memcheck_fixtures")
GIB = 1 << 30
SPARK_TOTAL_KB = 127601232                          # 121.69 GiB (SPEC §1, §3)
NEED = 786 * SPARK_TOTAL_KB * 1024 // 1000          # gmu 0.786 x MemTotal: the golden plan's budget, 95.65 GiB
MARGIN = 2 * GIB
UNTOUCHED = "0\n"                                   # what the kernel's drop_caches reads back

# pid: (status Name, VmRSS kB or None for a kernel thread, cmdline); 5555 vanishes (no status).
PROCS = {
    1: ("systemd", 13312, b"/sbin/init\0splash\0"),
    2301: ("VLLM::EngineCor", 25165824, b"python3\0-m\0vllm.entrypoints.openai.api_server\0--model\0/models/gemma-4-26b\0"
                                        b"--gpu-memory-utilization\x000.786\0"),
    2450: ("ollama", 9437184, b"/usr/local/bin/ollama\0serve\0"),
    3011: ("python3", 3145728, b"/opt/jupyter/bin/python3\0-m\0ipykernel_launcher\0-f\0/run/user/1000/kernel.json\0"),
    4000: ("kworker/u40:2", None, b""),
    812: ("dockerd", 98304, b"/usr/bin/dockerd\0-H\0fd://\0"),
}
HOLDERS_IN_ORDER = [2301, 2450, 3011, 812, 1]


def fixture(name):
    return os.path.join(FIXTURES, name)


def kb(path, field):
    with open(path, encoding="ascii") as f:
        return int(re.search(r"^%s:\s+(\d+) kB$" % field, f.read(), re.M).group(1))


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    for pid, (name, rss, cmdline) in PROCS.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        status = "Name:\t%s\nUmask:\t0022\nState:\tS (sleeping)\nPid:\t%d\n" % (name, pid)
        if rss is not None:
            status += "VmPeak:\t%8d kB\nVmSize:\t%8d kB\nVmHWM:\t%8d kB\nVmRSS:\t%8d kB\nRssAnon:\t%8d kB\n" % (
                rss * 2, rss * 2, rss, rss, rss)
        status += "Threads:\t4\n"
        (d / "status").write_text(status)
        (d / "cmdline").write_bytes(cmdline)
    gone = root / "5555"                    # exited between listing and reading: cmdline left, status gone
    gone.mkdir()
    (gone / "cmdline").write_bytes(b"huge\0")
    (root / "self").mkdir()                 # not a pid: ignored
    (root / "meminfo").write_text("not read from here\n")
    return root


@pytest.fixture
def drop(tmp_path):
    path = tmp_path / "drop_caches"
    path.write_text(UNTOUCHED)
    return path


def memcheck(*args, meminfo="spark_fresh.meminfo", proc_dir=None, drop_file=None):
    argv = [sys.executable, SCRIPT]
    if meminfo is not None:
        argv += ["--meminfo", meminfo if os.path.isabs(meminfo) else fixture(meminfo)]
    if proc_dir is not None:
        argv += ["--proc", str(proc_dir)]
    if drop_file is not None:
        argv += ["--drop-caches", str(drop_file)]
    return subprocess.run(argv + [str(a) for a in args], capture_output=True, text=True, timeout=120, check=False)


def test_enough_memory_starts_with_nothing_dropped(proc, drop):
    r = memcheck("--need-bytes", NEED, "--margin-bytes", MARGIN, "--unit", "sparkops-serve.service",
                 proc_dir=proc, drop_file=drop)
    assert r.returncode == 0, r.stderr
    assert drop.read_text() == UNTOUCHED
    assert r.stderr == ""
    assert r.stdout.count("\n") == 1 and "nothing dropped" in r.stdout
    assert "MemFree 113.40 GiB" in r.stdout and "MemAvailable 114.54 GiB" in r.stdout and "need 95.65 GiB" in r.stdout


def test_memfree_short_with_memavailable_enough_drops_the_page_cache_once(proc, drop):
    r = memcheck("--need-bytes", NEED, "--margin-bytes", MARGIN, meminfo="spark_page_cache.meminfo", proc_dir=proc, drop_file=drop)
    assert r.returncode == 0, r.stderr
    assert drop.read_text() == "1"                  # the page cache only: not 2 (slab) nor 3
    assert "page cache" in r.stdout and "MemFree 13.59 GiB before, 13.59 GiB after" in r.stdout
    # the copy does not change, so MemFree is still short: a warning, and the start goes on
    assert "warning" in r.stderr and "still below" in r.stderr and "refused" not in r.stderr


def test_memfree_read_again_after_the_drop(tmp_path, proc, drop):
    """The second read of meminfo is the kernel's state after the drop: the path is a FIFO that
    hands the before copy to the first open, and is replaced by the after copy (MemFree enough)
    before that read ends, so only a second open sees it."""
    before = open(fixture("spark_page_cache.meminfo"), encoding="ascii").read()
    after_file = tmp_path / "after.meminfo"
    after_file.write_text(re.sub(r"^MemFree:\s+\d+ kB$", "MemFree:        110000000 kB", before, flags=re.M))
    fifo = str(tmp_path / "meminfo")
    os.mkfifo(fifo)

    def serve():
        with open(fifo, "w", encoding="ascii") as f:    # blocks until the script opens it
            f.write(before)
            os.replace(str(after_file), fifo)           # the open FIFO reads on; the path is now the after copy

    writer = threading.Thread(target=serve, daemon=True)
    writer.start()
    try:
        r = memcheck("--need-bytes", NEED, "--margin-bytes", MARGIN, meminfo=fifo, proc_dir=proc, drop_file=drop)
    finally:
        while writer.is_alive():            # a script that never opened meminfo leaves the writer waiting: release it
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            writer.join(timeout=5)
            os.close(fd)
    assert r.returncode == 0, r.stderr
    assert drop.read_text() == "1"
    assert "MemFree 13.59 GiB before, 104.90 GiB after" in r.stdout
    assert r.stderr == ""


def test_memavailable_short_refuses_changes_nothing_and_names_the_holders(proc, drop):
    r = memcheck("--need-bytes", NEED, "--margin-bytes", MARGIN, "--unit", "sparkops-serve.service",
                 meminfo="spark_held.meminfo", proc_dir=proc, drop_file=drop)
    assert r.returncode == 1, r.stdout + r.stderr
    assert drop.read_text() == UNTOUCHED
    err = r.stderr
    assert "sparkops-serve.service" in err and "refused" in err and "nothing was changed" in err
    for figure in ("need 95.65 GiB", "margin 2.00 GiB", "MemAvailable 77.77 GiB", "MemFree 1.81 GiB", "short by 19.88 GiB"):
        assert figure in err, figure
    pids = [int(p) for p in re.findall(r"\bpid (\d+)\b", err)]
    assert pids == HOLDERS_IN_ORDER                  # largest VmRSS first; --top 5 by default
    assert "pid 2301 VLLM::EngineCor (python3 -m vllm.entrypoints.openai.api_server" in err and "24.00 GiB" in err
    assert "pid 2450 ollama (/usr/local/bin/ollama serve) 9.00 GiB" in err
    assert "5555" not in err and "kworker" not in err   # vanished; a kernel thread holds no RSS
    assert "Shmem holds 6.00 GiB" in err and "/dev/shm" in err
    assert "stop what holds the memory" in err and "lower the plan" in err
    assert len(err.splitlines()) <= 5
    assert r.stdout == ""


def test_refusal_names_only_top_holders_and_a_small_shmem_not_at_all(proc, drop):
    avail = kb(fixture("small.meminfo"), "MemAvailable") * 1024
    r = memcheck("--need-bytes", avail + 1, "--top", 2, meminfo="small.meminfo", proc_dir=proc, drop_file=drop)
    assert r.returncode == 1, r.stdout + r.stderr
    assert [int(p) for p in re.findall(r"\bpid (\d+)\b", r.stderr)] == HOLDERS_IN_ORDER[:2]
    assert "Shmem" not in r.stderr                   # 0.11 GiB: not a holder worth naming
    assert drop.read_text() == UNTOUCHED


def test_need_beyond_memtotal_says_lower_the_plan(proc, drop):
    r = memcheck("--need-bytes", 200 * GIB, meminfo="spark_fresh.meminfo", proc_dir=proc, drop_file=drop)
    assert r.returncode == 1
    assert "more than MemTotal" in r.stderr and "lower the plan" in r.stderr


SMALL_FREE = kb(fixture("small.meminfo"), "MemFree") * 1024
SMALL_AVAIL = kb(fixture("small.meminfo"), "MemAvailable") * 1024


@pytest.mark.parametrize("need, margin, rc, dropped", [
    (SMALL_AVAIL - GIB, GIB, 0, True),           # need + margin == MemAvailable: enough (MemFree short: drop)
    (SMALL_AVAIL - GIB + 1, GIB, 1, False),      # one byte more: refused
    (SMALL_AVAIL, 0, 0, True),                   # no margin, exactly MemAvailable
    (SMALL_FREE - GIB, GIB, 0, False),           # need + margin == MemFree: enough, nothing dropped
    (SMALL_FREE - GIB + 1, GIB, 0, True),        # one byte more: the page cache is dropped
], ids=["avail-exact", "avail-plus-1", "avail-exact-no-margin", "free-exact", "free-plus-1"])
def test_boundaries(proc, drop, need, margin, rc, dropped):
    r = memcheck("--need-bytes", need, "--margin-bytes", margin, meminfo="small.meminfo", proc_dir=proc, drop_file=drop)
    assert r.returncode == rc, r.stdout + r.stderr
    assert drop.read_text() == ("1" if dropped else UNTOUCHED)


def test_an_unwritable_drop_caches_warns_creates_nothing_and_starts(tmp_path, proc):
    missing = tmp_path / "no" / "drop_caches"
    r = memcheck("--need-bytes", NEED, meminfo="spark_page_cache.meminfo", proc_dir=proc, drop_file=missing)
    assert r.returncode == 0, r.stderr
    assert "--drop-caches" in r.stderr and "warning" in r.stderr
    assert not missing.exists()


def _meminfo_without(tmp_path, field):
    text = open(fixture("spark_fresh.meminfo"), encoding="ascii").read()
    path = tmp_path / ("no-%s.meminfo" % field)
    path.write_text(re.sub(r"^%s:.*\n" % field, "", text, flags=re.M))
    return str(path)


@pytest.mark.parametrize("args, needle", [
    (["--need-bytes", "0"], r"--need-bytes: 0 is below 1.*budget"),
    (["--need-bytes", "-5"], r"--need-bytes: -5 is below 1"),
    (["--need-bytes", "95.65GiB"], r"--need-bytes: '95.65GiB' is not a whole number.*bytes"),
    ([], r"required: --need-bytes"),
    (["--need-bytes", NEED, "--margin-bytes", "-1"], r"--margin-bytes: -1 is below 0"),
    (["--need-bytes", NEED, "--top", "five"], r"--top: 'five' is not a whole number"),
    (["--need-bytes", NEED, "--meminfo", "/nonexistent/meminfo"], r"--meminfo /nonexistent/meminfo: cannot read it"),
    (["--need-bytes", NEED, "--meminfo", "@no-MemAvailable"], r"--meminfo \S+: no MemAvailable line"),
    (["--need-bytes", NEED, "--meminfo", "@no-Shmem"], r"--meminfo \S+: no Shmem line"),
    (["--need-bytes", NEED, "--meminfo", "@bad-MemFree"], r"--meminfo \S+: the MemFree line .* is not '<number> kB'"),
], ids=["need-0", "need-negative", "need-unit", "need-missing", "margin-negative", "top-word", "meminfo-unreadable",
        "meminfo-no-available", "meminfo-no-shmem", "meminfo-bad-line"])
def test_bad_inputs_exit_2_naming_the_option(tmp_path, proc, drop, args, needle):
    args = [str(a) for a in args]
    for i, a in enumerate(args):
        if a.startswith("@no-"):
            args[i] = _meminfo_without(tmp_path, a[len("@no-"):])
        elif a == "@bad-MemFree":
            bad = tmp_path / "bad.meminfo"
            with open(fixture("spark_fresh.meminfo"), encoding="ascii") as f:
                bad.write_text(re.sub(r"^MemFree:.*$", "MemFree:        lots kB", f.read(), flags=re.M))
            args[i] = str(bad)
    meminfo = None if "--meminfo" in args else "spark_page_cache.meminfo"   # MemFree short: a drop would show
    r = memcheck(*args, meminfo=meminfo, proc_dir=proc, drop_file=drop)
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(needle, r.stderr), r.stderr
    assert drop.read_text() == UNTOUCHED
