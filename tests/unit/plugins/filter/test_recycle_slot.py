"""sparkops.appliance.recycle_slot: each serving host of the fleet group waits its place in the
group's inventory order times the slot, so a fleet recycles one host at a time (a recycle per
host with its own random delay put all three single Sparks of the example fleet down at once on
about a quarter of nights)."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.recycle_slot import recycle_slot

GROUPS = {"sparks": ["spark-01", "spark-02", "spark-pa-head", "spark-pa-worker", "spark-03"],
          "singles": ["spark-01", "spark-02", "spark-03"]}
HOSTVARS = {"spark-01": {}, "spark-02": {}, "spark-03": {},
            "spark-pa-head": {"cluster_role": "head"}, "spark-pa-worker": {"cluster_role": "worker"}}


def test_every_serving_host_has_its_own_slot_in_inventory_order():
    waits = {h: recycle_slot(h, HOSTVARS, GROUPS, "sparks", 1800) for h in GROUPS["sparks"]}
    assert waits == {"spark-01": 0, "spark-02": 1800, "spark-pa-head": 3600, "spark-pa-worker": 0, "spark-03": 5400}
    serving = [w for h, w in waits.items() if h != "spark-pa-worker"]
    assert len(set(serving)) == len(serving)          # no two serving hosts share a slot


def test_the_slot_does_not_depend_on_what_a_run_touched():
    """A run with --limit spark-03 changes neither groups nor hostvars: the same slot."""
    assert recycle_slot("spark-03", HOSTVARS, GROUPS, "sparks", 600) == 1800
    assert recycle_slot("spark-03", HOSTVARS, GROUPS, "singles", 600) == 1200


def test_no_slots_and_hosts_outside_the_group_wait_nothing():
    assert recycle_slot("spark-03", HOSTVARS, GROUPS, "sparks", 0) == 0
    assert recycle_slot("spark-pa-head", HOSTVARS, GROUPS, "singles", 1800) == 0


def test_a_missing_group_or_a_negative_slot_is_refused_naming_the_variable():
    with pytest.raises(AnsibleFilterError, match="serve_recycle_fleet_group: no inventory group 'gpus'"):
        recycle_slot("spark-01", HOSTVARS, GROUPS, "gpus", 1800)
    with pytest.raises(AnsibleFilterError, match="serve_recycle_slot_s = -1"):
        recycle_slot("spark-01", HOSTVARS, GROUPS, "sparks", -1)
