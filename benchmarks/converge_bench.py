# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Re-converge speed on the lab: a no-op site.yml against a play that only gathers facts, 2 and 6 lab Sparks.

Brings up its OWN lab Sparks (hosts bench-1..bench-N, containers sparkops-bench-N, serving containers
sparkops-vllm-bench-N, Docker network sparkops-bench on a free 172.31.x.0/24) with lab/lab.yml and a
generated inventory that reuses inventories/lab/group_vars, converges them all with site.yml, then,
in the same run and alternating, times for 2 and for N Sparks (--limit):
  * facts   a play that only gathers facts (the least any run pays: a connection and `setup`)
  * no-op   site.yml on the converged Sparks (it must report changed=0)
and prints both, their ratio (target <= 10) and the no-op time of N Sparks over that of 2
(target <= 1.5), with the CPU seconds each no-op cost the controller and the whole machine
(/proc/stat: the lab Sparks' own work shares these cores) and the least wall time that leaves.
With --profile, the no-op run on 2 Sparks also prints the 10 slowest tasks
(ansible.posix.profile_tasks). With --before DIR (a checkout of another commit, e.g. made by
`git archive`), the no-op on 2 Sparks is also timed with that checkout's site.yml and ansible.cfg,
on the same Sparks, in every round (unprofiled, alternating with this checkout's runs), and
profiled once. At the end it removes what it created (--keep leaves it up): the lab Sparks,
their serving containers and the network; the runtime image is shared with the lab and stays.

  python3 benchmarks/converge_bench.py [--sparks 6] [--rounds 2] [--profile] [--before DIR] [--keep]

Each lab Spark serves the tiny model (about 1 GiB of memory each): look at `free -g` first.
"""
import argparse
import ipaddress
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "bench"
NETWORK = "sparkops-bench"
SETTLE = ["-e", "serve_health_timeout_s=3600"]   # passed to every site.yml run (see main)
FACTS_PLAY = """---
- name: Only gather facts
  hosts: sparks
  gather_facts: true
  tasks: []
"""


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)


def free_subnet():
    """A 172.31.x.0/24 that no Docker network on this engine uses (the lab's is 172.31.250.0/24)."""
    used = []
    names = sh(["docker", "network", "ls", "-q"]).stdout.split()
    if names:
        out = sh(["docker", "network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}"] + names).stdout
        used = [ipaddress.ip_network(s, strict=False) for s in out.split() if ":" not in s]
    for third in range(240, 200, -1):
        net = ipaddress.ip_network("172.31.%d.0/24" % third)
        if not any(net.overlaps(u) for u in used):
            return net
    sys.exit("no free 172.31.x.0/24 subnet for the benchmark's network")


def write_inventory(inv_dir, count, subnet):
    hosts = {}
    for i in range(1, count + 1):
        hosts["%s-%d" % (PREFIX, i)] = {
            "lab_ip": str(subnet.network_address + 10 + i),
            # host variables: they win over inventories/lab/group_vars/lab.yml's lab network
            "lab_network": NETWORK,
            "lab_subnet": str(subnet),
        }
    doc = {"all": {"children": {"lab": {"children": {"sparks": {"hosts": hosts}}}}}}
    with open(os.path.join(inv_dir, "hosts.yml"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)   # JSON is YAML
    os.symlink(os.path.join(ROOT, "inventories", "lab", "group_vars"), os.path.join(inv_dir, "group_vars"))
    return sorted(hosts, key=lambda h: int(h.rsplit("-", 1)[1]))


def machine_busy_s():
    """CPU seconds every process of this machine has used since boot (user, nice, system, irq,
    softirq of /proc/stat): the controller, the lab Sparks' own work, their vLLMs, the Docker engine."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    return sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) / os.sysconf("SC_CLK_TCK")


class Runner:
    def __init__(self, inv_dir, env):
        self.inv_dir = inv_dir
        self.env = env
        self.last_cpu = 0.0     # CPU seconds (user + sys) of the last run and what it started, on this machine
        self.last_machine = 0.0  # CPU seconds every process of this machine used during the last run

    def playbook(self, book, *extra, project=ROOT, profile=False, check=True):
        env = dict(self.env, ANSIBLE_CONFIG=os.path.join(project, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
        if profile:
            env["ANSIBLE_CALLBACKS_ENABLED"] = "ansible.posix.profile_tasks"
            env["PROFILE_TASKS_TASK_OUTPUT_LIMIT"] = "10"
            env["PROFILE_TASKS_SORT_ORDER"] = "descending"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy = machine_busy_s()
        start = time.monotonic()
        res = subprocess.run(["ansible-playbook", "-i", self.inv_dir, book] + list(extra), env=env, cwd=project,
                             capture_output=True, text=True, check=False)
        took = time.monotonic() - start
        self.last_machine = machine_busy_s() - busy
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.last_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        out = res.stdout + res.stderr
        if check and res.returncode != 0:
            sys.stderr.write(out[-6000:])
            raise RuntimeError("%s %s failed (rc %d)" % (book, " ".join(extra), res.returncode))
        return took, out


def changed_total(out):
    return sum(int(n) for n in re.findall(r"^\S+\s+: ok=\d+\s+changed=(\d+)", out, re.M))


def slowest(out):
    """profile_tasks' summary: the lines after the last ==== line, 'task name ---- 12.34s'."""
    lines = out.splitlines()
    tail = [i for i, line in enumerate(lines) if re.match(r"^=+\s*$", line)]
    if not tail:
        return []
    return [line for line in lines[tail[-1] + 1:] if re.search(r"-+ \d+\.\d+s$", line)][:10]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sparks", type=int, default=6, help="the larger fleet (the smaller is 2)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds of each measurement (the median is reported)")
    ap.add_argument("--profile", action="store_true", help="print the 10 slowest tasks of a no-op run on 2 Sparks")
    ap.add_argument("--before", default=None,
                    help="another checkout: also time its no-op site.yml on 2 Sparks in every round, and profile it")
    ap.add_argument("--keep", action="store_true", help="leave the lab Sparks up at the end")
    ap.add_argument("--reuse", action="store_true", help="the benchmark's lab Sparks of an earlier --keep run are up: use them")
    a = ap.parse_args()
    if a.sparks < 3:
        sys.exit("--sparks must be 3 or more (it is compared with 2)")
    lab_image = os.environ.get("SPARKOPS_LAB_IMAGE") or sh([os.path.join(ROOT, "lab", "image", "tag.sh")]).stdout.strip()
    runtime = os.environ.get("SPARKOPS_LAB_RUNTIME_IMAGE") or sh([os.path.join(ROOT, "lab", "runtime", "tag.sh")]).stdout.strip()
    env = dict(os.environ, SPARKOPS_LAB_IMAGE=lab_image, SPARKOPS_LAB_RUNTIME_IMAGE=runtime)
    existing = sh(["docker", "network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}}{{end}}", NETWORK])
    if existing.returncode == 0 and not a.reuse:
        sys.exit("the Docker network %s exists already (another benchmark run?): remove it first, or --reuse it" % NETWORK)
    work = tempfile.mkdtemp(prefix="converge-bench-")
    inv_dir = os.path.join(work, "inventory")    # ansible reads every file of an inventory folder
    os.mkdir(inv_dir)
    subnet = ipaddress.ip_network(existing.stdout.strip()) if existing.returncode == 0 else free_subnet()
    hosts = write_inventory(inv_dir, a.sparks, subnet)
    run = Runner(inv_dir, env)
    lab = os.path.join(ROOT, "lab", "lab.yml")
    site = os.path.join(ROOT, "playbooks", "site.yml")
    facts = os.path.join(work, "facts.yml")
    with open(facts, "w", encoding="utf-8") as f:
        f.write(FACTS_PLAY)
    small = ",".join(hosts[:2])
    big = ",".join(hosts)
    print("lab Sparks: %s on %s (%s)" % (big, NETWORK, subnet), flush=True)
    try:
        took, _out = run.playbook(lab, "-e", "lab_image=" + lab_image)
        print("lab up: %.1f s" % took, flush=True)
        # Setup, not measured: N vLLMs starting at once on a small machine may need more than
        # serve_health_timeout_s's default. Every site.yml run below passes the same value: the
        # recycle script holds it, so a run without it would rewrite that script (not a no-op).
        took, out = run.playbook(site, *SETTLE)
        print("first converge of %d Sparks: %.1f s (changed=%d)" % (len(hosts), took, changed_total(out)), flush=True)
        times = {"facts": {2: [], a.sparks: []}, "noop": {2: [], a.sparks: []}, "cpu": {2: [], a.sparks: []},
                 "machine": {2: [], a.sparks: []}}
        before = os.path.abspath(a.before) if a.before else None
        before_noop = []
        for rnd in range(a.rounds):
            if before:   # alternating with this checkout's runs, unprofiled, on the same 2 Sparks
                took, out = run.playbook(os.path.join(before, "playbooks", "site.yml"), "--limit", small, *SETTLE,
                                         project=before)
                before_noop.append(took)
                print("round %d, 2 Sparks: no-op of %s %.1f s (changed=%d)" % (rnd + 1, before, took, changed_total(out)),
                      flush=True)
            for count, limit in ((2, small), (a.sparks, big)):
                took, _out = run.playbook(facts, "--limit", limit)
                times["facts"][count].append(took)
                took, out = run.playbook(site, "--limit", limit, *SETTLE)
                times["noop"][count].append(took)
                times["cpu"][count].append(run.last_cpu)
                times["machine"][count].append(run.last_machine)
                print("round %d, %d Sparks: facts %.1f s, no-op %.1f s (changed=%d, controller CPU %.1f s, machine CPU %.1f s)"
                      % (rnd + 1, count, times["facts"][count][-1], took, changed_total(out), run.last_cpu, run.last_machine),
                      flush=True)
                if changed_total(out):
                    print("  WARNING: the no-op run changed something:\n" + out[-3000:], flush=True)
        if a.profile:
            took, out = run.playbook(site, "--limit", small, *SETTLE, profile=True)
            print("\nthis checkout, no-op on 2 Sparks, profiled: %.1f s; the 10 slowest tasks:" % took)
            print("\n".join("  " + line for line in slowest(out)), flush=True)
        if before:
            took, out = run.playbook(os.path.join(before, "playbooks", "site.yml"), "--limit", small, *SETTLE,
                                     project=before, profile=True)
            print("\n%s, no-op on 2 Sparks, profiled: %.1f s (changed=%d); the 10 slowest tasks:"
                  % (before, took, changed_total(out)))
            print("\n".join("  " + line for line in slowest(out)), flush=True)

        def med(values):
            values = sorted(values)
            return values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2

        print("\nRESULT (median of %d rounds)" % a.rounds)
        for count in (2, a.sparks):
            f_s, n_s = med(times["facts"][count]), med(times["noop"][count])
            print("  %d Sparks: no-op site.yml %.1f s, facts only %.1f s, ratio %.1fx (target <= 10x)"
                  % (count, n_s, f_s, n_s / f_s))
        n2, nbig = med(times["noop"][2]), med(times["noop"][a.sparks])
        if before:
            b2 = med(before_noop)
            print("  2 Sparks: no-op site.yml %.1f s here, %.1f s with %s (this / that = %.2f)" % (n2, b2, before, n2 / b2))
        f2, fbig = med(times["facts"][2]), med(times["facts"][a.sparks])
        print("  no-op %d Sparks / 2 Sparks: %.2fx (target <= 1.5x); facts only: %.2fx" % (a.sparks, nbig / n2, fbig / f2))
        # The lab's Sparks share this machine's cores with the controller: the no-op on N Sparks
        # cannot take less wall time than its controller-side CPU spread over every core (the lab
        # Sparks' own CPU, not counted here, comes on top).
        cores = len(os.sched_getaffinity(0))
        c2, cbig = med(times["cpu"][2]), med(times["cpu"][a.sparks])
        print("  controller CPU of a no-op: 2 Sparks %.1f s, %d Sparks %.1f s; on %d cores the %d-Spark run "
              "needs at least %.1f s wall = %.2fx the 2-Spark run" % (c2, a.sparks, cbig, cores, a.sparks,
                                                                      cbig / cores, cbig / cores / n2))
        # Everything on this machine (the lab Sparks' modules, their idle vLLMs, the Docker engine
        # too): the floor for this lab, which real Sparks (their own cores each) do not have.
        m2, mbig = med(times["machine"][2]), med(times["machine"][a.sparks])
        print("  machine CPU of a no-op (every process): 2 Sparks %.1f s, %d Sparks %.1f s; on %d cores the %d-Spark "
              "run needs at least %.1f s wall = %.2fx the 2-Spark run" % (m2, a.sparks, mbig, cores, a.sparks,
                                                                          mbig / cores, mbig / cores / n2))
    finally:
        if a.keep:
            print("kept: inventory %s (remove with: ansible-playbook -i %s %s -e lab_state=absent)" % (inv_dir, inv_dir, lab))
        else:
            took, out = run.playbook(lab, "-e", "lab_state=absent", check=False)
            print("lab down: %.1f s" % took)
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
