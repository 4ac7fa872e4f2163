# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""rollout_batches: Ansible's serial sizes over rollout units; a TP=2 pair is never split."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkops.appliance.plugins.filter.rollout_batches import (
    batch_sizes, rollout_batches, rollout_lone_models, rollout_served_models)


def fleet(singles, pairs=None, extra=None):
    """hostvars and groups of an inventory like inventories/example: singles + pair groups."""
    hostvars, groups = {}, {"all": [], "sparks": [], "singles": []}
    for name in singles:
        hostvars[name] = {"group_names": ["singles", "sparks"]}
        groups["singles"].append(name)
    for group, (head, worker) in (pairs or {}).items():
        groups[group] = [head, worker]
        hostvars[head] = {"group_names": [group, "sparks"], "cluster_role": "head"}
        hostvars[worker] = {"group_names": [group, "sparks"], "cluster_role": "worker"}
    for name, values in (extra or {}).items():
        hostvars[name].update(values)
    groups["sparks"] = list(hostvars)
    groups["all"] = list(hostvars)
    return hostvars, groups


@pytest.mark.parametrize("serial, total, sizes", [
    ([1, "25%"], 8, [1, 2]),
    ([1, "25%"], 3, [1, 1]),
    ([1, "25%"], 20, [1, 5]),
    (2, 5, [2]),
    ("50%", 5, [2]),
    ("10%", 3, [1]),           # at least one host, like Ansible
    (["1", " 30 % "], 10, [1, 3]),
])
def test_batch_sizes_follow_ansible_serial(serial, total, sizes):
    assert batch_sizes(serial, total) == sizes


@pytest.mark.parametrize("serial", [[], 0, "0%", "x", True, [1, "abc"], -1])
def test_bad_serial_is_refused_naming_the_variable(serial):
    with pytest.raises(AnsibleFilterError, match="rollout_serial"):
        batch_sizes(serial, 4)


def test_singles_canary_then_quarter():
    hosts = ["s%d" % i for i in range(1, 9)]
    hostvars, groups = fleet(hosts)
    assert rollout_batches(hosts, hostvars, groups, [1, "25%"]) == [
        ["s1"], ["s2", "s3"], ["s4", "s5"], ["s6", "s7"], ["s8"]]


def test_three_lab_sparks_one_at_a_time():
    hosts = ["r1", "r2", "r3"]
    hostvars, groups = fleet(hosts)
    assert rollout_batches(hosts, hostvars, groups, [1, "25%"]) == [["r1"], ["r2"], ["r3"]]


def test_the_example_inventory_keeps_the_pair_whole():
    hosts = ["spark-01", "spark-02", "spark-03", "spark-pa-head", "spark-pa-worker"]
    hostvars, groups = fleet(hosts[:3], {"pair_a": ("spark-pa-head", "spark-pa-worker")})
    batches = rollout_batches(hosts, hostvars, groups, [1, "25%"])
    assert batches == [["spark-01"], ["spark-02"], ["spark-03"], ["spark-pa-head", "spark-pa-worker"]]


@pytest.mark.parametrize("serial", [[1, "25%"], 1, 2, 3, "50%", [1, 2, 3], [2, 1]])
@pytest.mark.parametrize("order", [
    ["a-head", "s1", "a-worker", "s2", "b-worker", "s3", "b-head", "s4"],
    ["s1", "s2", "a-head", "b-head", "a-worker", "b-worker", "s3", "s4"],
])
def test_a_pair_is_never_split_and_every_host_rolls_once(serial, order):
    hostvars, groups = fleet(["s1", "s2", "s3", "s4"], {"pair_a": ("a-head", "a-worker"), "pair_b": ("b-head", "b-worker")})
    batches = rollout_batches(order, hostvars, groups, serial)
    flat = [h for batch in batches for h in batch]
    assert sorted(flat) == sorted(order) and len(flat) == len(order)
    for head, worker in (("a-head", "a-worker"), ("b-head", "b-worker")):
        assert [b for b in batches if head in b] == [b for b in batches if worker in b]
    sizes = batch_sizes(serial, len(order))
    for i, batch in enumerate(batches):
        size = sizes[min(i, len(sizes) - 1)]
        # over the size only when a single unit is larger than it (a pair in a batch of 1)
        assert len(batch) <= max(size, 2)


def test_a_pair_as_canary_makes_a_canary_batch_of_two():
    hosts = ["a-head", "a-worker", "s1", "s2"]
    hostvars, groups = fleet(["s1", "s2"], {"pair_a": ("a-head", "a-worker")})
    assert rollout_batches(hosts, hostvars, groups, [1, "25%"]) == [["a-head", "a-worker"], ["s1"], ["s2"]]


def test_rollout_unit_groups_hosts_explicitly():
    hosts = ["s1", "s2", "s3", "s4"]
    hostvars, groups = fleet(hosts, extra={"s1": {"rollout_unit": "rack1"}, "s3": {"rollout_unit": "rack1"}})
    assert rollout_batches(hosts, hostvars, groups, [2]) == [["s1", "s3"], ["s2", "s4"]]


def test_a_pair_without_its_group_is_refused():
    hostvars, groups = fleet(["s1"], extra={"s1": {"cluster_role": "head"}})
    with pytest.raises(AnsibleFilterError, match="s1 has cluster_role 'head' but no inventory group holds its pair"):
        rollout_batches(["s1"], hostvars, groups, 1)


# --- a batch never takes the last servers of a model (docs/rollout.md#batches) ----------------

def test_a_batch_of_two_never_takes_both_servers_of_a_model():
    hosts = ["s1", "s2", "s3", "s4"]
    hostvars, groups = fleet(hosts)
    models = {"s1": "chat", "s2": "chat", "s3": "embed", "s4": "embed"}
    # without the models: [s1, s2] and [s3, s4] would each leave a model with no server
    assert rollout_batches(hosts, hostvars, groups, [2]) == [["s1", "s2"], ["s3", "s4"]]
    assert rollout_batches(hosts, hostvars, groups, [2], models=models) == [["s1"], ["s2", "s3"], ["s4"]]


def test_servers_outside_the_rollout_keep_a_model_served():
    # s3 serves chat too and is not rolled (a --limit): s1 and s2 may go in one batch
    hostvars, groups = fleet(["s1", "s2", "s3"])
    models = {"s1": "chat", "s2": "chat", "s3": "chat"}
    assert rollout_batches(["s1", "s2"], hostvars, groups, [2], models=models) == [["s1", "s2"]]


def test_a_pair_counts_as_one_server_of_its_model():
    hosts = ["a-head", "a-worker", "s1", "s2"]
    hostvars, groups = fleet(["s1", "s2"], {"pair_a": ("a-head", "a-worker")})
    models = {"a-head": "big", "s1": "big", "s2": "small"}
    # the pair and s1 are big's two servers: never one batch; s2 (small's only one) rolls alone or with either
    assert rollout_batches(hosts, hostvars, groups, [3], models=models) == [["a-head", "a-worker"], ["s1", "s2"]]
    assert rollout_lone_models(hosts, models) == {"small": ["s2"]}


def test_the_models_keep_every_other_rule():
    order = ["a-head", "s1", "a-worker", "s2", "b-worker", "s3", "b-head", "s4"]
    hostvars, groups = fleet(["s1", "s2", "s3", "s4"], {"pair_a": ("a-head", "a-worker"), "pair_b": ("b-head", "b-worker")})
    models = {"a-head": "m1", "b-head": "m1", "s1": "m2", "s2": "m2", "s3": "m3", "s4": "m3"}
    for serial in ([1, "25%"], 2, 3, "50%", [2, 4], 8):
        batches = rollout_batches(order, hostvars, groups, serial, models=models)
        assert sorted(h for b in batches for h in b) == sorted(order)
        for batch in batches:
            for model in set(models.values()):
                servers = [h for h, m in models.items() if m == model]
                assert not set(servers) <= set(batch), (serial, batches, model)
        for head, worker in (("a-head", "a-worker"), ("b-head", "b-worker")):
            assert [b for b in batches if head in b] == [b for b in batches if worker in b]


def test_the_served_models_come_from_the_serve_fact_else_the_inventory():
    hostvars, _groups = fleet(["s1", "s2", "s3", "s4"], {"pair_a": ("a-head", "a-worker")},
                              extra={"s1": {"spark_serve": {"model": "noted"}, "serve_served_model_name": "inventory"},
                                     "s2": {"serve_served_model_name": "named"}, "s3": {"spark_model_name": "dir-name"},
                                     "a-head": {"spark_serve": {"model": "big"}}, "a-worker": {"spark_model_name": "big"}})
    assert rollout_served_models(["s1", "s2", "s3", "s4", "a-head", "a-worker", "elsewhere"], hostvars) == {
        "s1": "noted", "s2": "named", "s3": "dir-name", "a-head": "big"}


def test_a_spark_with_several_models_is_a_server_of_each_and_never_in_a_batch_with_their_last_other_server():
    hostvars = {"s1": {"spark_serve": {"model": "chat"}}, "s2": {"spark_serve": {"model": "chat"}},
                "two": {"spark_models": [{"name": "chat"}, {"name": "embed"}], "spark_serve": {"model": "model"}}}
    groups = {"sparks": ["s1", "s2", "two"]}
    models = rollout_served_models(["s1", "s2", "two"], hostvars)
    assert models == {"s1": "chat", "s2": "chat", "two": ["chat", "embed"]}
    # embed has one server (two's): out while it restarts; chat has three
    assert rollout_lone_models(["s1", "s2", "two"], models) == {"embed": ["two"]}
    assert rollout_lone_models(["s1"], models) == {}
    # chat's three servers never in one batch; two's models restart one after the other inside it
    assert rollout_batches(["two", "s1", "s2"], hostvars, groups, [3], models=models) == [["two", "s1"], ["s2"]]
    # only two and s1 serve chat: they are never in one batch
    models2 = rollout_served_models(["s1", "two"], hostvars)
    assert rollout_batches(["two", "s1"], hostvars, groups, [2], models=models2) == [["two"], ["s1"]]
