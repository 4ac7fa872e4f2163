"""known_bad: the known-bad list's entries matched against observed versions (branch, exact, range),
refused or warned with the entry's reason and fix, accepted knowingly; and the shipped list itself."""
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.known_bad import known_bad, parse_versions, version_matches

from harness import ROOT

LIST = os.path.join(ROOT, "roles", "preflight", "files", "known_bad.yml")


def entry(**over):
    base = {"id": "driver-590", "component": "driver", "versions": "590.*", "action": "refuse",
            "reason": "the 590 branch deadlocks CUDA graphs", "reported_at": "https://example.invalid/590",
            "fix": "stay on 580"}
    base.update(over)
    return base


def seen(component, version, source="the loaded NVIDIA driver"):
    return {"component": component, "version": version, "source": source}


@pytest.mark.parametrize("versions, version, hit", [
    ("590.*", "590.44.01", True),
    ("590.*", "590", True),                      # a branch pin (drivers_driver_branch)
    ("590.*", "5900.1", False),
    ("590.*", "580.95.05", False),
    ("< 2.30.4", "2.28.9", True),
    ("< 2.30.4", "2.30.4", False),
    ("< 2.30.4", "2.30.10", False),             # numeric, not string order
    ("< 2.30.4", "2.9.1", True),
    ("== 7.0.0-1019-nvidia", "7.0.0-1019-nvidia", True),
    ("7.0.0-1019-nvidia", "7.0.0-1019-nvidia", True),
    ("== 7.0.0-1019-nvidia", "6.17.0-1032-nvidia", False),
    (">= 0.23.0, < 0.24.0", "0.23.1", True),
    (">= 0.23.0, < 0.24.0", "0.24.0", False),
    ("!= 1.0", "1.1", True),
])
def test_version_clauses(versions, version, hit):
    assert version_matches(version, parse_versions(versions)) is hit


@pytest.mark.parametrize("bad", ["", "~> 1.0", "< ", "590.*.1", "1.0 2.0"])
def test_an_unreadable_clause_is_an_error(bad):
    with pytest.raises(ValueError):
        parse_versions(bad)


def test_a_match_is_refused_with_the_reason_the_source_and_the_fix():
    out = known_bad([entry()], [seen("driver", "590.44.01"), seen("kernel", "6.17.0-1032-nvidia", "the running kernel")])
    assert out["warnings"] == [] and out["unchecked"] == []
    [message] = out["refusals"]
    assert message.startswith("the loaded NVIDIA driver = 590.44.01: known bad (driver-590, driver 590.*): ")
    assert "the 590 branch deadlocks CUDA graphs." in message
    assert "Reported: https://example.invalid/590." in message
    assert "Fix: stay on 580. Or, to run it knowingly, add driver-590 to preflight_accept_known_bad." in message


def test_no_match_no_message_and_an_empty_version_is_unchecked():
    out = known_bad([entry()], [seen("driver", "580.95.05"), seen("nccl", "", "runtime_image_nccl_version")])
    assert out == {"refusals": [], "warnings": [], "unchecked": ["nccl"]}


def test_accepted_knowingly_it_warns_instead():
    out = known_bad([entry()], [seen("driver", "590.44.01")], ["driver-590"])
    assert out["refusals"] == []
    [message] = out["warnings"]
    assert "the 590 branch deadlocks CUDA graphs." in message
    assert "Accepted knowingly (preflight_accept_known_bad lists driver-590)" in message


def test_a_warn_entry_only_warns():
    out = known_bad([entry(id="nccl-old", component="nccl", versions="< 2.30.4", action="warn", reason="graph deadlock")],
                    [seen("nccl", "2.28.9", "runtime_image_nccl_version"), seen("driver", "590.44.01")])
    assert out["refusals"] == []
    assert out["warnings"] == ["runtime_image_nccl_version = 2.28.9: known bad (nccl-old, nccl < 2.30.4): graph deadlock. "
                               "Reported: https://example.invalid/590. Fix: stay on 580."]


def test_an_unknown_accepted_id_is_refused():
    out = known_bad([entry()], [], ["driver-59O"])
    assert out["refusals"] == ['preflight_accept_known_bad = ["driver-59O"]: \'driver-59O\' names no known-bad entry '
                               "(known: driver-590). Fix: give the id of an entry, or remove it."]


def test_an_unorderable_version_matches_no_range():
    assert known_bad([entry(versions="< 600")], [seen("driver", "x:1")])["refusals"] == []


@pytest.mark.parametrize("bad, words", [
    ({"component": "gpu"}, "has the component 'gpu'"),
    ({"action": "block"}, "has the action 'block'"),
    ({"reason": ""}, "lacks reason"),
    ({"versions": "~> 590"}, "versions: '~> 590' is not a version clause"),
    ({"id": "Driver 590"}, "has the id 'Driver 590'"),
    ({"note": "x"}, "has unknown keys note"),
])
def test_a_malformed_entry_is_an_error_naming_it(bad, words):
    with pytest.raises(AnsibleFilterError, match="known-bad entry .*" + words.replace("(", r"\(")):
        known_bad([entry(**bad)], [])


def test_a_repeated_id_is_an_error():
    with pytest.raises(AnsibleFilterError, match="driver-590 repeats an id"):
        known_bad([entry(), entry()], [])


def test_the_shipped_list_is_well_formed_and_covers_each_component():
    with open(LIST) as handle:
        entries = yaml.safe_load(handle)["known_bad"]
    assert known_bad(entries, [])["refusals"] == []           # every entry parses (or this raises)
    assert sorted(set(e["component"] for e in entries)) == ["driver", "kernel", "nccl", "vllm"]
    assert all(e["reported_at"].startswith("https://") for e in entries)
    refused = known_bad(entries, [seen("driver", "590.48.01"), seen("kernel", "7.0.0-1019-nvidia", "the running kernel")])
    assert [m.split(":")[0] for m in refused["refusals"]] == ["the loaded NVIDIA driver = 590.48.01", "the running kernel = 7.0.0-1019-nvidia"]
    passed = known_bad(entries, [seen("driver", "580.95.05"), seen("kernel", "6.17.0-1032-nvidia"), seen("nccl", "2.30.4"),
                                 seen("vllm", "0.24.0")])
    assert passed == {"refusals": [], "warnings": [], "unchecked": []}
    warned = known_bad(entries, [seen("nccl", "2.28.9"), seen("vllm", "0.23.0")])
    assert warned["refusals"] == [] and len(warned["warnings"]) == 2


@pytest.mark.parametrize("versions", ["!= 2.30.4", "none.*", "< 2.30.4"])
def test_none_is_a_component_not_shipped_neither_matched_nor_unchecked(versions):
    # an image without NCCL (the lab's CPU build) records "none": no entry can match what is not there
    out = known_bad([entry(id="nccl-any", component="nccl", versions=versions)],
                    [seen("nccl", "none", "sparkops/vllm-runtime:0123456789ab (its label io.sparkops.nccl-version)")])
    assert out == {"refusals": [], "warnings": [], "unchecked": []}
