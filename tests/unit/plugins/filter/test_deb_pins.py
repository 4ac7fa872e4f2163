"""deb_pins and deb_version_compare: dpkg's version order, and what to do about each pinned package."""
import shutil
import subprocess

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.deb_installed import deb_installed
from ansible_collections.sparkops.appliance.plugins.filter.deb_pins import deb_pins, deb_version_compare

# (smaller, larger) pairs in dpkg's order, the NVIDIA package versions among them.
ORDERED = [
    ("1.17.8-1", "1.18.0-1"),
    ("1.18.0~rc.1-1", "1.18.0-1"),
    ("1.18.0-1", "1.18.0-1.1"),
    ("580.65.06-0ubuntu1", "580.95.05-0ubuntu1"),
    ("580.95.05-0ubuntu0.24.04.1", "580.95.05-0ubuntu0.24.04.2"),
    ("580.95.05-0ubuntu0.24.04.2", "580.95.05-0ubuntu1"),
    ("9.9-1", "1:0.1-1"),
    ("1.0~", "1.0"),
    ("1.0~~", "1.0~"),
    ("1.0a", "1.0+"),
    ("1.9", "1.10"),
    ("1.0-1", "1.0-1a"),
    ("1.01", "1.2"),
    ("20.10.24+dfsg1-1+deb12u1", "20.10.24+dfsg1-1+deb12u1+b6"),
]


@pytest.mark.parametrize("smaller, larger", ORDERED)
def test_version_order(smaller, larger):
    assert deb_version_compare(smaller, larger) == -1
    assert deb_version_compare(larger, smaller) == 1
    assert deb_version_compare(smaller, smaller) == 0


@pytest.mark.parametrize("same", [("1.0", "1.00"), ("0:1.0", "1.0"), ("1.0", "1.0-0")])
def test_equal_versions(same):
    assert deb_version_compare(*same) == 0


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg is not installed here")
@pytest.mark.parametrize("smaller, larger", ORDERED)
def test_order_agrees_with_dpkg(smaller, larger):
    def dpkg_says(left, op, right):
        return subprocess.run(["dpkg", "--compare-versions", left, op, right], check=False).returncode == 0
    assert dpkg_says(smaller, "lt", larger)
    assert dpkg_says(larger, "gt", smaller)


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg is not installed here")
def test_equal_as_dpkg_says():
    for left, right in [("1.0", "1.00"), ("0:1.0", "1.0"), ("1.0", "1.0-0")]:
        assert subprocess.run(["dpkg", "--compare-versions", left, "eq", right], check=False).returncode == 0


def test_a_bad_epoch_is_refused():
    with pytest.raises(AnsibleFilterError, match="epoch"):
        deb_version_compare("x:1.0", "1.0")


INSTALLED = {
    "nvidia-container-toolkit": [{"name": "nvidia-container-toolkit", "version": "1.18.0-1"}],
    "libnvidia-container1": [{"name": "libnvidia-container1", "version": "1.17.8-1"}],
    "libnvidia-container-tools": [{"name": "libnvidia-container-tools", "version": "1.18.1-1"}],
    "nvidia-driver-580-open": [{"name": "nvidia-driver-580-open", "version": "580.95.05-0ubuntu1"}],
}
PINS = [
    {"name": "nvidia-driver-580-open", "version": ""},
    {"name": "nvidia-container-toolkit", "version": "1.18.0-1"},
    {"name": "nvidia-container-toolkit-base", "version": "1.18.0-1"},
    {"name": "libnvidia-container-tools", "version": "1.18.0-1"},
    {"name": "libnvidia-container1", "version": "1.18.0-1"},
]


def test_plan_per_package():
    plan = {p["name"]: (p["action"], p["installed"], p["spec"]) for p in deb_pins(PINS, INSTALLED)}
    assert plan == {
        "nvidia-driver-580-open": ("keep", "580.95.05-0ubuntu1", "nvidia-driver-580-open"),
        "nvidia-container-toolkit": ("keep", "1.18.0-1", "nvidia-container-toolkit=1.18.0-1"),
        "nvidia-container-toolkit-base": ("install", "", "nvidia-container-toolkit-base=1.18.0-1"),
        "libnvidia-container-tools": ("newer", "1.18.1-1", "libnvidia-container-tools=1.18.0-1"),
        "libnvidia-container1": ("upgrade", "1.17.8-1", "libnvidia-container1=1.18.0-1"),
    }


def test_force_downgrades_only_the_newer_one():
    actions = [p["action"] for p in deb_pins(PINS, INSTALLED, force=True)]
    assert actions == ["keep", "keep", "install", "downgrade", "upgrade"]


def test_installed_must_be_package_facts():
    with pytest.raises(AnsibleFilterError, match="ansible_facts.packages"):
        deb_pins(PINS, ["nvidia-container-toolkit"])


def test_bare_names_take_the_given_version():
    plan = deb_pins(["libnvidia-container1", "nvidia-container-toolkit"], INSTALLED, version="1.18.0-1")
    assert [(p["name"], p["version"], p["action"]) for p in plan] == [
        ("libnvidia-container1", "1.18.0-1", "upgrade"), ("nvidia-container-toolkit", "1.18.0-1", "keep")]


def test_installed_from_dpkg_query_counts_installed_packages_only():
    text = ("nvidia-container-toolkit\tii \t1.18.0-1\n"
            "libnvidia-container1\thi \t1.17.8-1\n"          # on hold, installed
            "nvidia-driver-570-open\trc \t570.1-1\n"          # removed, configuration files left
            "nvidia-driver-580-open\tun \t\n"                 # known, not installed
            "garbage line\n")
    assert deb_installed(text) == {
        "nvidia-container-toolkit": [{"name": "nvidia-container-toolkit", "version": "1.18.0-1"}],
        "libnvidia-container1": [{"name": "libnvidia-container1", "version": "1.17.8-1"}]}


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="dpkg is not installed here")
def test_installed_reads_real_dpkg_query_output():
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${db:Status-Abbrev}\t${Version}\n", "dpkg", "no-such-package-x"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1                                       # one name unknown: exit 1, the rest listed
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "dpkg"], capture_output=True, text=True, check=True).stdout
    assert deb_installed(proc.stdout) == {"dpkg": [{"name": "dpkg", "version": version}]}
