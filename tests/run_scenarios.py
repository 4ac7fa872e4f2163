# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run every Molecule scenario in lanes: the scenarios of a lane one after the other, the lanes side by
side (make molecule; MOLECULE_LANES in the Makefile says which scenario runs in which lane).

A lab Spark spends much of a scenario waiting (a vLLM start, a health poll, the prober's pace) with the
controller on one core, so two lanes use the machine's two cores. Scenarios that build into the same
runtime image repository must share a lane (one would rebuild the tag under the other's server).

Each scenario's output goes to LOG_DIR/<scenario>.log and is printed whole when it ends, with its wall
time; every scenario under molecule/ must be named in exactly one lane (a new scenario is never left
out silently). A failed scenario does not stop its lane: every failure is reported at the end, and
the exit status is 1 when any failed. Wall times go to TIMES (tab-separated: name, seconds, status).

  python3 tests/run_scenarios.py --lanes "rollout,serve memwatch,production" [--log-dir build/molecule]
  python3 tests/run_scenarios.py --report build/times.tsv     # the table of every suite's and scenario's time
"""
import argparse
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scenarios_on_disk():
    base = os.path.join(ROOT, "molecule")
    return sorted(name for name in os.listdir(base) if os.path.isfile(os.path.join(base, name, "molecule.yml")))


def parse_lanes(text, on_disk):
    """'a,b c' -> [['a', 'b'], ['c']]; refused unless every scenario on disk is in exactly one lane."""
    lanes = [[name for name in lane.split(",") if name] for lane in text.split()]
    named = [name for lane in lanes for name in lane]
    problems = []
    unknown = sorted(set(named) - set(on_disk))
    missing = sorted(set(on_disk) - set(named))
    twice = sorted(name for name in set(named) if named.count(name) > 1)
    if unknown:
        problems.append("not a scenario under molecule/: %s" % ", ".join(unknown))
    if missing:
        problems.append("in no lane: %s" % ", ".join(missing))
    if twice:
        problems.append("in more than one place: %s" % ", ".join(twice))
    if not lanes or problems:
        raise SystemExit("MOLECULE_LANES %r: %s. Name every scenario under molecule/ once, lanes separated by "
                         "spaces, the scenarios of a lane by commas." % (text, "; ".join(problems) or "empty"))
    return lanes


def record(times, name, seconds, status):
    os.makedirs(os.path.dirname(os.path.abspath(times)), exist_ok=True)
    with open(times, "a") as handle:
        handle.write("%s\t%d\t%s\n" % (name, seconds, status))


def report(times):
    """The table of every recorded suite and scenario, in the order they ended."""
    rows = []
    if os.path.exists(times):
        with open(times) as handle:
            rows = [line.rstrip("\n").split("\t") for line in handle if line.strip()]
    print("wall time of each suite and scenario (%s):" % os.path.relpath(times, ROOT))
    for name, seconds, status in rows:
        print("  %-22s %6s s  %s" % (name, seconds, "ok" if status == "0" else "FAILED (%s)" % status))
    return rows


def run_lane(index, lane, log_dir, times, results, lock, environ):
    for scenario in lane:
        log_path = os.path.join(log_dir, scenario + ".log")
        start = time.monotonic()
        with open(log_path, "w") as log:
            status = subprocess.call(["molecule", "test", "-s", scenario], cwd=ROOT, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environ)
        took = time.monotonic() - start
        with lock:
            results.append((scenario, status, took))
            record(times, "molecule " + scenario, took, status)
            sys.stdout.write("\n===== molecule scenario %s (lane %d): %s in %.0f s =====\n"
                             % (scenario, index + 1, "passed" if status == 0 else "FAILED (%d)" % status, took))
            with open(log_path, errors="replace") as log:
                for line in log:
                    sys.stdout.write(line)
            sys.stdout.write("===== end of molecule scenario %s: %s in %.0f s =====\n"
                             % (scenario, "passed" if status == 0 else "FAILED", took))
            sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", help="scenarios of a lane separated by commas, lanes by spaces")
    parser.add_argument("--log-dir", default=os.path.join(ROOT, "build", "molecule"))
    parser.add_argument("--times", default=os.path.join(ROOT, "build", "times.tsv"))
    parser.add_argument("--report", metavar="TIMES", help="print the table of a times file and exit")
    args = parser.parse_args(argv)
    if args.report:
        rows = report(args.report)
        return 1 if any(status != "0" for _n, _s, status in rows) else 0
    if not args.lanes:
        parser.error("--lanes or --report is needed")
    lanes = parse_lanes(args.lanes, scenarios_on_disk())
    os.makedirs(args.log_dir, exist_ok=True)
    results, lock = [], threading.Lock()
    shown = " | ".join(", ".join(lane) for lane in lanes)
    print("molecule: %d scenarios in %d lanes: %s" % (sum(len(lane) for lane in lanes), len(lanes), shown))
    sys.stdout.flush()
    start = time.monotonic()
    threads = [threading.Thread(target=run_lane, args=(index, lane, args.log_dir, args.times, results, lock, dict(os.environ)))
               for index, lane in enumerate(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [name for name, status, _took in results if status != 0]
    print("\nmolecule: %d scenarios in %.0f s wall (%.0f s if run one after the other)%s"
          % (len(results), time.monotonic() - start, sum(took for _n, _s, took in results),
             "; FAILED: " + ", ".join(failed) if failed else "; all passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
