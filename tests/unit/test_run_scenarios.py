"""tests/run_scenarios.py: the Makefile's lanes name every Molecule scenario once; a lane list that
leaves one out, names one twice or names a stranger is refused; the times table."""
import importlib.util
import os
import re

import pytest

from harness import ROOT

_spec = importlib.util.spec_from_file_location("run_scenarios", os.path.join(ROOT, "tests", "run_scenarios.py"))
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)


def makefile_lanes():
    with open(os.path.join(ROOT, "Makefile")) as handle:
        return re.search(r"^MOLECULE_LANES \?= (.+)$", handle.read(), re.M).group(1)


def test_the_makefiles_lanes_name_every_scenario_once():
    lanes = runner.parse_lanes(makefile_lanes(), runner.scenarios_on_disk())
    assert len(lanes) == 2 and all(lanes)
    assert sorted(s for lane in lanes for s in lane) == runner.scenarios_on_disk()
    # one runtime image repository per lane: serve and another scenario building into the same
    # repository beside it would rebuild the tag under the other's server
    repos = {}
    for index, lane in enumerate(lanes):
        for scenario in lane:
            with open(os.path.join(ROOT, "molecule", scenario, "molecule.yml")) as handle:
                found = re.search(r"^\s+runtime_image_repo: (\S+)", handle.read(), re.M)
            if found:
                repos.setdefault(found.group(1), set()).add(index)
    assert repos and all(len(lanes_of) == 1 for lanes_of in repos.values()), repos


@pytest.mark.parametrize("text, words", [
    ("a,b c", ["in no lane: d"]),
    ("a,b c,d,e", ["not a scenario under molecule/: e"]),
    ("a,b c,d,a", ["in more than one place: a"]),
    ("", ["in no lane: a, b, c, d"]),
])
def test_a_lane_list_that_is_not_every_scenario_once_is_refused(text, words):
    with pytest.raises(SystemExit) as refused:
        runner.parse_lanes(text, ["a", "b", "c", "d"])
    for word in words + ["MOLECULE_LANES"]:
        assert word in str(refused.value)


def test_report_reads_the_times_and_says_which_failed(tmp_path, capsys):
    times = str(tmp_path / "times.tsv")
    runner.record(times, "unit", 95.4, 0)
    runner.record(times, "molecule serve", 610, 2)
    assert runner.main(["--report", times]) == 1
    out = capsys.readouterr().out
    assert re.search(r"unit\s+95 s  ok", out) and re.search(r"molecule serve\s+610 s  FAILED \(2\)", out), out
