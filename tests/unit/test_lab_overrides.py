"""The lab is the example inventory plus ONE override file, and that file may only hold what a lab
Spark physically lacks: a role that works only because the lab sets a variable is a bug the lab
hides. A new variable in the override file makes this test fail until it is put on the allow-list
below, with its reason, in review."""
import os
import re

import yaml

import harness

ROOT = harness.ROOT
SPARKS_VARS = os.path.join(ROOT, "inventories", "lab", "group_vars", "sparks")
OVERRIDES = os.path.join(SPARKS_VARS, "lab_overrides.yml")

# What a lab Spark physically lacks, and the variables that say so. Nothing else.
ALLOWED = {
    # no GPU, and a machine smaller than a Spark
    "spark_expect_gpu", "preflight_expected_arch", "preflight_min_mem_total_gib",
    "preflight_min_free_disk_gib", "serve_gpus", "serve_kv_sizing", "serve_extra_args", "serve_env",
    "memory_plan_mem_total_gib", "memory_plan_host_reserve_gib",
    "cluster_gpus", "cluster_ray_num_gpus",
    # no kernel log in a container
    "memwatch_kernel_log_source",
    # the lab machine's hard open-files limit (20000), which its runc may not raise
    "serve_nofile_limit",
    # the tiny lab model instead of the real one, and its plan figures
    "spark_model_name", "checkpoint_source", "checkpoint_src_path", "ple_enabled",
    "memory_plan_weight_bytes", "memory_plan_ple_gib", "memory_plan_mtp_enabled",
    "memory_plan_mtp_off_credit_gib", "memory_plan_overhead_gib", "memory_plan_mtp_gib",
    "memory_plan_max_model_len", "memory_plan_kv_bytes_per_token", "memory_plan_kv_cache_dtype",
    "memory_plan_kv_target_gib",
    # the CPU runtime image as base, no registry, no network in the build
    "runtime_image_base", "runtime_image_pull_base", "runtime_image_install_jemalloc",
    # one Docker engine for every lab Spark: one build of a tag at a time
    "runtime_image_build_throttle",
    # one Docker engine (the machine's) for every lab Spark
    "spark_serve_container_name", "serve_docker_network", "serve_engine_root_container",
    "spark_ray_container_name", "cluster_docker_network", "cluster_engine_root_container",
    # one kernel (the machine's) for every lab Spark: --ipc host would give a pair's two nodes one /dev/shm
    "cluster_ipc", "cluster_shm_size", "serve_ipc",
    # no user's vault: the example's group_vars/sparks/vault.yml is the user's to fill and encrypt
    "vault_serve_api_key",
}


def _overrides():
    with open(OVERRIDES) as handle:
        return yaml.safe_load(handle)


def test_the_override_file_holds_only_what_a_lab_spark_lacks():
    extra = sorted(set(_overrides()) - ALLOWED)
    assert extra == [], (
        "inventories/lab/group_vars/sparks/lab_overrides.yml sets %s, which is not something a lab "
        "Spark physically lacks. Make the role work with its defaults and the example inventory "
        "instead." % ", ".join(extra))


def test_every_override_says_why():
    lines = open(OVERRIDES).read().splitlines()
    keys = [i for i, line in enumerate(lines) if re.match(r"^[a-z_]+:", line)]
    for n, start in enumerate(keys):
        end = keys[n + 1] if n + 1 < len(keys) else len(lines)
        block = [line for line in lines[start:end] if line.strip()]
        before = lines[start - 1] if start > 0 else ""
        assert any("#" in line for line in block) or before.startswith("#"), \
            "%s has no reason (a comment) on its line" % lines[start].split(":")[0]


def test_the_lab_is_the_example_inventory_plus_the_overrides():
    assert sorted(os.listdir(SPARKS_VARS)) == ["example.yml", "lab_overrides.yml"]
    example = os.path.join(SPARKS_VARS, "example.yml")
    assert os.path.islink(example)
    assert os.path.realpath(example) == os.path.join(ROOT, "inventories", "example", "group_vars", "sparks", "main.yml")
    # Ansible loads a group_vars folder's files in name order: the overrides come last.
    assert sorted(os.listdir(SPARKS_VARS))[-1] == "lab_overrides.yml"


def test_the_production_scenario_uses_the_lab_inventory_vars():
    with open(os.path.join(ROOT, "molecule", "production", "molecule.yml")) as handle:
        scenario = yaml.safe_load(handle)
    link = scenario["provisioner"]["inventory"]["links"]["group_vars"]
    target = os.path.normpath(os.path.join(ROOT, "molecule", "production", link))
    assert target == os.path.join(ROOT, "inventories", "lab", "group_vars")


# The lab's gateway: the example's group_vars/gateways as they are, plus its own override file, which
# may hold only the key a user would vault (a lab gateway lacks nothing else).
GATEWAY_VARS = os.path.join(ROOT, "inventories", "lab", "group_vars", "gateways")
GATEWAY_ALLOWED = {"vault_gateway_client_api_keys"}


def test_the_lab_gateway_is_the_example_plus_only_its_vault():
    assert sorted(os.listdir(GATEWAY_VARS)) == ["example.yml", "lab_overrides.yml"]
    example = os.path.join(GATEWAY_VARS, "example.yml")
    assert os.path.realpath(example) == os.path.join(ROOT, "inventories", "example", "group_vars", "gateways", "main.yml")
    with open(os.path.join(GATEWAY_VARS, "lab_overrides.yml")) as handle:
        assert set(yaml.safe_load(handle)) <= GATEWAY_ALLOWED
