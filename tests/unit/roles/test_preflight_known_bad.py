"""preflight refuses a stand-in host that reports a listed driver branch or kernel (files/known_bad.yml)
with the entry's reason and fix, and a drivers pin on a listed branch; with the entry accepted it passes
with a warning. The loaded driver and the kernel release are prepared files (spark_facts reads them
without a GPU).

One ansible-playbook start runs every case: each a local host of a batch inventory."""
import os

import pytest
import yaml

from harness import ROOT, batch_inventory, host_outcomes, play_json

PLAY = """
- hosts: sparks
  gather_facts: true
  roles:
    - role: sparkops.appliance.preflight
"""

with open(os.path.join(ROOT, "roles", "preflight", "files", "known_bad.yml")) as _handle:
    ENTRIES = {e["id"]: e for e in yaml.safe_load(_handle)["known_bad"]}
DRIVER_590 = ENTRIES["driver-590-cudagraph-deadlock"]
KERNEL = ENTRIES["kernel-7.0.0-1019-nccl-roce-enomem"]
NCCL = ENTRIES["nccl-before-2.30.4-cudagraph-deadlock"]

# host: (loaded driver ("" none), kernel release, extra variables)
CASES = {
    "driver-590": ("590.44.01", "6.17.0-1032-nvidia", {}),
    "kernel-listed": ("580.95.05", "7.0.0-1019-nvidia", {}),
    "accepted": ("590.44.01", "7.0.0-1019-nvidia",
                 {"preflight_accept_known_bad": [DRIVER_590["id"], KERNEL["id"]]}),
    "pin-590": ("", "6.17.0-1032-nvidia", {"drivers_manage": True, "drivers_driver_branch": "590"}),
    "clean": ("580.95.05", "6.17.0-1032-nvidia", {"runtime_image_nccl_version": "2.28.9"}),
    "accept-typo": ("580.95.05", "6.17.0-1032-nvidia", {"preflight_accept_known_bad": ["driver-590"]}),
}
REFUSE = "Refuse a known-bad driver, kernel, NCCL or vLLM version"
WARN = "Warn of known-bad versions (accepted, or listed to warn), and say what was not checked"
debian_only = pytest.mark.skipif(not os.path.exists("/etc/debian_version"), reason="preflight expects a Debian-family host")


def _words(text):
    return " ".join(text.split())


@pytest.fixture(scope="module")
def preflight(tmp_path_factory):
    """{host: (failed, {task name: result})}, from one start."""
    tmp_path = tmp_path_factory.mktemp("known-bad")
    hosts = {}
    for host, (driver, kernel, extra) in CASES.items():
        case = tmp_path / host
        case.mkdir()
        if driver:
            (case / "nvidia-version").write_text(driver + "\n")
        (case / "osrelease").write_text(kernel + "\n")
        hosts[host] = dict({"spark_expect_gpu": False, "preflight_require_docker": False,
                            "preflight_expected_arch": [os.uname().machine],
                            "preflight_min_mem_total_gib": 0, "preflight_min_free_disk_gib": 0,
                            "spark_model_dir": str(case), "preflight_driver_version_path": str(case / "nvidia-version"),
                            "preflight_kernel_release_path": str(case / "osrelease")}, **extra)
    (tmp_path / "play.yml").write_text(PLAY)
    doc = play_json(tmp_path / "play.yml", inventory=batch_inventory(tmp_path, hosts))
    return host_outcomes(doc, CASES)


@debian_only
@pytest.mark.parametrize("host, entry, source", [
    ("driver-590", DRIVER_590, "the loaded NVIDIA driver"),
    ("kernel-listed", KERNEL, "the running kernel"),
    ("pin-590", DRIVER_590, "drivers_driver_branch = 590:"),
])
def test_a_listed_driver_or_kernel_is_refused_with_the_entry_reason_and_fix(preflight, host, entry, source):
    failed, tasks = preflight[host]
    result = tasks[REFUSE]
    assert failed and result.get("failed") is True
    message = _words(result["msg"])
    assert source in message
    assert _words(entry["reason"]) in message
    assert _words(entry["fix"]) in message
    assert "add %s to preflight_accept_known_bad" % entry["id"] in message


@debian_only
def test_accepted_knowingly_it_passes_with_a_warning(preflight):
    failed, tasks = preflight["accepted"]
    assert not failed and tasks[REFUSE].get("skipped") is True
    warnings = [_words(m) for m in tasks[WARN]["msg"]]
    for entry in (DRIVER_590, KERNEL):
        assert any(_words(entry["reason"]) in m and "Accepted knowingly" in m for m in warnings), warnings


@debian_only
def test_a_clean_host_passes_a_warn_entry_warns_and_the_unchecked_are_named(preflight):
    failed, tasks = preflight["clean"]
    assert not failed and tasks[REFUSE].get("skipped") is True
    warnings = [_words(m) for m in tasks[WARN]["msg"]]
    assert any(m.startswith("runtime_image_nccl_version = 2.28.9") and _words(NCCL["reason"]) in m for m in warnings), warnings
    assert any(m.startswith("known-bad versions not checked") and "vllm" in m for m in warnings), warnings


@debian_only
def test_an_accepted_id_that_names_no_entry_is_refused(preflight):
    failed, tasks = preflight["accept-typo"]
    assert failed and "'driver-590' names no known-bad entry" in tasks[REFUSE]["msg"]
