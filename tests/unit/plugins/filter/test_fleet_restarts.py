"""sparkops.appliance.fleet_restarts: the servers serving now that a run would restart, with why. A
pair's worker runs no server, but what restarts it (Docker, a reboot, its Ray node) stops its head's
server: the worker's reasons count against that head, so a pair is one server, never none."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.fleet_restarts import fleet_restarts


def spark(host, reasons=(), serving=True, role="", pair=""):
    return {"host": host, "cluster_name": pair, "cluster_role": role, "serving": serving, "reasons": list(reasons)}


def test_only_serving_servers_with_a_reason_are_listed_in_order():
    out = fleet_restarts([spark("s1", ["its unit or environment changes"]), spark("s2"),
                          spark("s3", ["Docker restarts (/etc/docker/daemon.json changes)"]),
                          spark("s4", ["its unit or environment changes"], serving=False)])
    assert out == [
        {"host": "s1", "reasons": ["its unit or environment changes"], "text": "s1 (its unit or environment changes)"},
        {"host": "s3", "reasons": ["Docker restarts (/etc/docker/daemon.json changes)"],
         "text": "s3 (Docker restarts (/etc/docker/daemon.json changes))"}]


def test_a_workers_restart_counts_against_its_heads_server():
    out = fleet_restarts([spark("pa-head", role="head", pair="pa"),
                          spark("pa-worker", ["the host reboots (the NVIDIA driver moves to nvidia-driver-580-open)"],
                                serving=False, role="worker", pair="pa"),
                          spark("pb-head", role="head", pair="pb"),
                          spark("pb-worker", role="worker", pair="pb", serving=False)])
    assert out == [{"host": "pa-head",
                    "reasons": ["its worker pa-worker: the host reboots (the NVIDIA driver moves to nvidia-driver-580-open)"],
                    "text": "pa-head (its worker pa-worker: the host reboots (the NVIDIA driver moves to nvidia-driver-580-open))"}]


def test_a_head_and_its_worker_are_one_server_and_a_head_that_serves_nothing_is_not_counted():
    out = fleet_restarts([spark("pa-head", ["its Ray node restarts (sparkops-ray.service: its unit or environment changes)"],
                                role="head", pair="pa"),
                          spark("pa-worker", ["its Ray node restarts (sparkops-ray.service: its unit or environment changes)"],
                                role="worker", pair="pa"),
                          spark("pb-head", serving=False, role="head", pair="pb"),
                          spark("pb-worker", ["Docker restarts (/etc/docker/daemon.json changes)"], role="worker", pair="pb")])
    assert [s["host"] for s in out] == ["pa-head"]
    assert len(out[0]["reasons"]) == 2 and out[0]["reasons"][1].startswith("its worker pa-worker: its Ray node restarts")


@pytest.mark.parametrize("forecasts, words", [
    ("not a list", "expects a list"),
    ([{"host": "s1"}], "needs the keys"),
    ([spark("s1", role="primary")], "cluster_role of s1"),
    ([dict(spark("s1"), reasons="Docker")], "reasons of s1 must be a list"),
])
def test_bad_forecasts_are_refused_naming_what_is_wrong(forecasts, words):
    with pytest.raises(AnsibleFilterError, match=words):
        fleet_restarts(forecasts)
