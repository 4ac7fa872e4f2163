# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bad-input sweep: site.yml with one bad value at a time (-e), against a converged lab Spark.

Every value must be refused in the first play (no later play starts, no task reports a change),
with a message that names the variable, and afterwards the host's files, units and images that
site.yml owns are byte-identical to before.

Runs in the production scenario's verify (MOLECULE_INVENTORY_FILE is Molecule's inventory) and by
hand against the lab:

  SPARKOPS_LAB_RUNTIME_IMAGE=$(lab/runtime/tag.sh) MOLECULE_INVENTORY_FILE=inventories/lab SWEEP_HOST=spark-lab-1 \\
    python3 -m pytest -q -s molecule/production/tests/test_bad_input_sweep.py --hosts=docker://sparkops-spark-lab-1

(testinfra's ansible backend does not template the lab inventory's ansible_host, so the lab Spark is
reached as its container; SWEEP_HOST is its inventory name, which the playbook runs are limited to.)

Cases run SWEEP_PARALLEL (2) at a time; the wall time is printed (-s shows it). SWEEP_ONLY=id,id
runs only those cases; SWEEP_LOG_DIR=dir keeps each case's output; SWEEP_CHECK=1 adds --check to every run (to show on older code, without
changing the Spark, which values were not refused in the first play).
"""
import json
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import testinfra.utils.ansible_runner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
if "MOLECULE_INVENTORY_FILE" in os.environ and not os.path.isabs(INVENTORY):
    INVENTORY = os.path.join(PROJECT, INVENTORY)
PARALLEL = int(os.environ.get("SWEEP_PARALLEL", "2"))
ONLY = [case_id for case_id in os.environ.get("SWEEP_ONLY", "").split(",") if case_id]
CHECK = ["--check"] if os.environ.get("SWEEP_CHECK") == "1" else []
LOG_DIR = os.environ.get("SWEEP_LOG_DIR", "")  # each case's output is written there when set
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("sparks")[:1]

# What site.yml writes on a Spark, and the state of what it runs (a restart changes InvocationID; a
# new runtime image changes runtime-image/state.json): all must be identical afterwards.
OWNED_FILES = ("/etc/fstab /etc/sysctl.d/* /etc/sparkops/* /etc/systemd/system/sparkops-* "
               "/etc/systemd/system/memwatch* /usr/local/bin/memwatch /usr/local/sbin/sparkops-* "
               "/var/lib/sparkops/runtime-image/*")
SNAPSHOT = (
    "sha256sum %s 2>/dev/null | sort -k2; "
    "ls -la /etc/sysctl.d /etc/sparkops /etc/systemd/system 2>/dev/null | grep -v ' \\.\\.\\?$' | awk '{print $1, $5, $NF}'; "
    "systemctl show -p Id,ActiveState,InvocationID,NRestarts,MainPID 'sparkops-*' memwatch.service 2>/dev/null; "
    "true" % OWNED_FILES)

# (id, extra vars, the variable the message must name). Every role's inputs, each kind of refusal.
CASES = [
    # booleans given as strings (a non-empty string is true in a condition)
    ("bool-runtime_image_install_jemalloc", {"runtime_image_install_jemalloc": "false"}, "runtime_image_install_jemalloc"),
    ("bool-runtime_image_pull_base", {"runtime_image_pull_base": "no"}, "runtime_image_pull_base"),
    ("bool-serve_jemalloc", {"serve_jemalloc": "false"}, "serve_jemalloc"),
    ("bool-serve_enable_prefix_caching", {"serve_enable_prefix_caching": "false"}, "serve_enable_prefix_caching"),
    ("bool-memwatch_service_enabled", {"memwatch_service_enabled": "false"}, "memwatch_service_enabled"),
    ("bool-checkpoint_validate_certs", {"checkpoint_validate_certs": "false"}, "checkpoint_validate_certs"),
    ("bool-ple_verify", {"ple_verify": "false"}, "ple_verify"),
    ("bool-spark_expect_gpu", {"spark_expect_gpu": "false"}, "spark_expect_gpu"),
    ("bool-host_tuning_swap_off", {"host_tuning_swap_off": "false"}, "host_tuning_swap_off"),
    ("bool-serve_recycle_enabled", {"serve_recycle_enabled": "false"}, "serve_recycle_enabled"),
    ("bool-memwatch_dry_run", {"memwatch_dry_run": "true"}, "memwatch_dry_run"),
    ("bool-memory_plan_mtp_enabled", {"memory_plan_mtp_enabled": "false"}, "memory_plan_mtp_enabled"),
    ("bool-min_free_kbytes_force", {"host_tuning_min_free_kbytes_force": "yes"}, "host_tuning_min_free_kbytes_force"),
    ("bool-as-number", {"serve_gpus": 0}, "serve_gpus"),
    # other types converted silently before
    ("list-as-string-serve_extra_args", {"serve_extra_args": "--enforce-eager"}, "serve_extra_args"),
    ("str-as-list-spark_model_name", {"spark_model_name": ["tiny-llama"]}, "spark_model_name"),
    ("list-as-string-expected_arch", {"preflight_expected_arch": "x86_64"}, "preflight_expected_arch"),
    ("str-as-int-serve_api_key", {"serve_api_key": 12345}, "serve_api_key"),
    ("int-as-word-serve_port", {"serve_port": "http"}, "serve_port"),
    ("dict-as-list-serve_env", {"serve_env": ["A=1"]}, "serve_env"),
    ("dict-as-string-sysctl_extra", {"host_tuning_sysctl_extra": "vm.swappiness=10"}, "host_tuning_sysctl_extra"),
    ("float-as-word", {"memwatch_available_lt_gib": "six"}, "memwatch_available_lt_gib"),
    ("list-as-string-shm_patterns", {"memwatch_shm_patterns": "psm_*"}, "memwatch_shm_patterns"),
    ("int-as-bool-max_model_len", {"serve_max_model_len": True}, "serve_max_model_len"),
    ("float-as-word-min_mem", {"preflight_min_mem_total_gib": "lots"}, "preflight_min_mem_total_gib"),
    # a control character would add a line to a rendered file
    ("newline-sysctl-value", {"host_tuning_sysctl_extra": {"vm.swappiness": "10\nkernel.panic = 1"}}, "host_tuning_sysctl_extra"),
    ("newline-env-key", {"serve_env": {"A\nSPARKOPS_INJECTED": "1"}}, "serve_env"),
    ("newline-extra-arg", {"serve_extra_args": ["/x\nExecStartPost=/bin/touch /tmp/sparkops-pwned"]}, "serve_extra_args"),
    ("newline-api-key", {"serve_api_key": "k\nSPARKOPS_INJECTED=1"}, "serve_api_key"),
    ("newline-image-env", {"runtime_image_env": {"A": "1\nRUN touch /pwned"}}, "runtime_image_env"),
    ("newline-kernel-log-pattern", {"memwatch_kernel_log_pattern": "NV_ERR\nX"}, "memwatch_kernel_log_pattern"),
    ("tab-served-model-name", {"serve_served_model_name": "m\tx"}, "serve_served_model_name"),
    ("newline-alloc-conf", {"serve_pytorch_cuda_alloc_conf": "expandable_segments:True\nX=1"}, "serve_pytorch_cuda_alloc_conf"),
    ("newline-memory-max", {"memwatch_memory_max": "128M\nMemoryMax=infinity"}, "memwatch_memory_max"),
    ("newline-image-base", {"runtime_image_base": "debian:12\nRUN touch /pwned"}, "runtime_image_base"),
    ("semicolon-calendar", {"serve_recycle_on_calendar": "every day; rm -rf /"}, "serve_recycle_on_calendar"),
    # paths: absolute, normalised, no whitespace; names without / or ..
    ("space-memwatch_bin_path", {"memwatch_bin_path": "/usr/local/bin/mem watch"}, "memwatch_bin_path"),
    ("dotdot-sysctl_file", {"host_tuning_sysctl_file": "/etc/sysctl.d/../x.conf"}, "host_tuning_sysctl_file"),
    ("sysctl_file-outside-sysctl.d", {"host_tuning_sysctl_file": "/etc/sysctl.conf"}, "host_tuning_sysctl_file"),
    ("sysctl_file-not-conf", {"host_tuning_sysctl_file": "/etc/sysctl.d/90-sparkops"}, "host_tuning_sysctl_file"),
    ("dotdot-model-name", {"spark_model_name": "../tiny-llama"}, "spark_model_name"),
    ("slash-model-name", {"spark_model_name": "a/b"}, "spark_model_name"),
    ("relative-model-dir", {"spark_model_dir": "srv/models"}, "spark_model_dir"),
    ("trailing-slash-config-dir", {"serve_config_dir": "/etc/sparkops/"}, "serve_config_dir"),
    ("double-slash-config-path", {"memwatch_config_path": "/etc/sparkops//memwatch.json"}, "memwatch_config_path"),
    ("space-state-dir", {"memwatch_state_dir": "/var/lib/mem watch"}, "memwatch_state_dir"),
    ("relative-report-path", {"serve_report_path": "plan-vs-actual.json"}, "serve_report_path"),
    ("relative-cache-dir", {"serve_cache_dir": "var/cache/vllm"}, "serve_cache_dir"),
    ("dotdot-checkpoint_dir", {"checkpoint_dir": "/srv/sparkops/models/../x"}, "checkpoint_dir"),
    ("relative-checkpoint-src", {"checkpoint_src_path": "lab-source/tiny-llama"}, "checkpoint_src_path"),
    ("metrics-not-prom", {"memwatch_metrics_file": "/var/lib/node-exporter/memwatch.txt"}, "memwatch_metrics_file"),
    ("shm-pattern-with-slash", {"serve_shm_patterns": ["../etc/*"]}, "serve_shm_patterns"),
    # ranges and relations
    ("vfs_cache_pressure-negative", {"host_tuning_vfs_cache_pressure": -100}, "host_tuning_vfs_cache_pressure"),
    ("min_free_kbytes-negative-forced", {"host_tuning_min_free_kbytes": -1, "host_tuning_min_free_kbytes_force": True},
     "host_tuning_min_free_kbytes"),
    ("min_free_kbytes-low", {"host_tuning_min_free_kbytes": 1000}, "host_tuning_min_free_kbytes"),
    ("sysctl-value-list", {"host_tuning_sysctl_extra": {"vm.swappiness": [10]}}, "host_tuning_sysctl_extra"),
    ("sysctl-bad-key", {"host_tuning_sysctl_extra": {"vm swappiness": 10}}, "host_tuning_sysctl_extra"),
    ("sysctl_apply-string", {"host_tuning_sysctl_apply": "always"}, "host_tuning_sysctl_apply"),
    ("stop_grace-negative", {"serve_stop_grace_s": -1}, "serve_stop_grace_s"),
    ("stop_timeout-below-grace", {"serve_stop_timeout_s": 10}, "serve_stop_timeout_s"),
    ("memwatch-above-memtotal", {"memwatch_available_lt_gib": 1000}, "memwatch_available_lt_gib"),
    ("memwatch-rule-b-free-above-available", {"memwatch_available_and_free_free_lt_gib": 12}, "memwatch_available_and_free_free_lt_gib"),
    ("max_model_len-zero", {"serve_max_model_len": 0}, "serve_max_model_len"),
    ("port-too-high", {"serve_port": 70000}, "serve_port"),
    ("port-zero", {"serve_port": 0}, "serve_port"),
    ("max_num_seqs-zero", {"serve_max_num_seqs": 0}, "serve_max_num_seqs"),
    ("health_delay-zero", {"serve_health_delay_s": 0}, "serve_health_delay_s"),
    ("start_limit_burst-zero", {"serve_start_limit_burst": 0}, "serve_start_limit_burst"),
    ("memwatch-consecutive-zero", {"memwatch_consecutive_samples": 0}, "memwatch_consecutive_samples"),
    ("memwatch-interval-zero", {"memwatch_interval_s": 0}, "memwatch_interval_s"),
    ("memwatch-oom-score", {"memwatch_oom_score_adjust": -1000}, "memwatch_oom_score_adjust"),
    ("memwatch-unit-name", {"memwatch_unit_name": "memwatch"}, "memwatch_unit_name"),
    ("memwatch-kernel-log-file-without-path", {"memwatch_kernel_log_source": "file"}, "memwatch_kernel_log_path"),
    ("ple-alignment", {"ple_enabled": True, "ple_alignment": 5000}, "ple_alignment"),
    ("checkpoint-retries-negative", {"checkpoint_fetch_retries": -1}, "checkpoint_fetch_retries"),
    ("checkpoint-http-without-url", {"checkpoint_source": "http", "checkpoint_url": ""}, "checkpoint_url"),
    ("checkpoint-hf-branch", {"checkpoint_source": "huggingface", "checkpoint_hf_repo": "o/n", "checkpoint_revision": "main"},
     "checkpoint_revision"),
    ("runtime-repo-uppercase", {"runtime_image_repo": "Sparkops/VLLM"}, "runtime_image_repo"),
    ("serve-network", {"serve_docker_network": "host; rm"}, "serve_docker_network"),
    ("container-name-space", {"spark_serve_container_name": "bad name"}, "spark_serve_container_name"),
    ("serve-kv-sizing", {"serve_kv_sizing": "both"}, "serve_kv_sizing"),
    ("serve-env-nested", {"serve_env": {"A": {"b": 1}}}, "serve_env"),
    # the memory plan's own refusals, and TP > 1 (needs the cluster role)
    ("tensor-parallel-2", {"memory_plan_tensor_parallel_size": 2}, "memory_plan_tensor_parallel_size"),
    ("plan-max_model_len-too-long", {"memory_plan_max_model_len": 100000000}, "memory_plan_max_model_len"),
    ("plan-host-reserve-too-big", {"memory_plan_host_reserve_gib": 100000}, "memory_plan_host_reserve_gib"),
    ("plan-kv-dtype", {"memory_plan_kv_cache_dtype": "int8"}, "memory_plan_kv_cache_dtype"),
    # collision guards (names and files that are someone else's)
    # two of ours with one name, or a unit name the system uses: refused controller-side
    ("unit-serve-is-memwatch", {"spark_serve_unit_name": "memwatch"}, "spark_serve_unit_name"),
    ("unit-memwatch-is-serve", {"memwatch_unit_name": "sparkops-serve.service"}, "memwatch_unit_name"),
    ("unit-memwatch-is-recycle", {"memwatch_unit_name": "sparkops-serve-recycle.service"}, "memwatch_unit_name"),
    ("unit-memwatch-is-journald", {"memwatch_unit_name": "systemd-journald.service"}, "memwatch_unit_name"),
    ("unit-serve-is-docker", {"spark_serve_unit_name": "docker"}, "spark_serve_unit_name"),
    ("path-report-is-memwatch-config", {"serve_report_path": "/etc/sparkops/memwatch.json"}, "serve_report_path"),
    # on the host, not the collection's (FOREIGN below makes the unit file, sysctl.d file and containers)
    ("unit-memwatch-from-lib", {"memwatch_unit_name": "debug-shell.service"}, "memwatch_unit_name"),
    ("unit-memwatch-foreign-file", {"memwatch_unit_name": "sweep-foreign.service"}, "memwatch_unit_name"),
    ("container-foreign", {"spark_serve_container_name": "sweep-foreign-{host}"}, "spark_serve_container_name"),
    ("container-labelled-not-this-hosts", {"spark_serve_container_name": "sweep-labelled-{host}"}, "spark_serve_container_name"),
    ("file-sysctl-distribution-link", {"host_tuning_sysctl_file": "/etc/sysctl.d/99-sysctl.conf"}, "host_tuning_sysctl_file"),
    ("file-sysctl-foreign", {"host_tuning_sysctl_file": "/etc/sysctl.d/50-sweep-foreign.conf"}, "host_tuning_sysctl_file"),
    ("file-memwatch-bin-is-docker", {"memwatch_bin_path": "/usr/bin/docker"}, "memwatch_bin_path"),
    ("dir-memwatch-log-is-var-log", {"memwatch_log_dir": "/var/log"}, "memwatch_log_dir"),
    # checks as data (refused flags, env keys, bounds)
    ("extra-args-max-model-len", {"serve_extra_args": ["--enforce-eager", "--max-model-len", "2048"]}, "serve_extra_args"),
    ("extra-args-gmu", {"serve_extra_args": ["--gpu-memory-utilization=0.9"]}, "serve_extra_args"),
    ("serve-env-api-key", {"serve_env": {"VLLM_API_KEY": "k"}}, "serve_env"),
    ("extra-args-swap-space", {"serve_extra_args": ["--swap-space", "16"]}, "serve_extra_args"),
    ("memwatch-interval-too-rare", {"memwatch_interval_s": 60}, "memwatch_interval_s"),
    # closed by default: no key on a wildcard bind (behind a gateway too: the server must bind the address it uses)
    ("empty-api-key-wildcard-bind", {"serve_api_key": ""}, "serve_api_key"),
    ("empty-api-key-gateway-wildcard-bind", {"serve_api_key": "", "serve_behind_gateway": True}, "serve_bind_host"),
]

if ONLY:
    CASES = [case for case in CASES if case[0] in ONLY]

# site.yml checks these roles' values before it connects to a host (their checks read no fact).
BY_VALUES = ("host_tuning_", "drivers_", "checkpoint_", "ple_")
# ... except where the check is whether the host already has the name (preflight reads it).
READS_THE_HOST = ("file-sysctl-distribution-link", "file-sysctl-foreign")

# What the collision cases find on the Spark, made before the first snapshot and removed after the
# last: a unit file and a sysctl.d file the collection did not write, a container without the
# collection's label, and one with it that this Spark's unit does not run. ({host}: the Spark's name.)
FOREIGN_UNIT = "/etc/systemd/system/sweep-foreign.service"
FOREIGN_SYSCTL = "/etc/sysctl.d/50-sweep-foreign.conf"
FOREIGN_CONTAINERS = ("sweep-foreign-{host}", "sweep-labelled-{host}")

_RESULTS = {}
_TIMES = {}


def _run_case(host_name, case):
    case_id, extra, _name = case
    extra = dict((k, v.replace("{host}", host_name) if isinstance(v, str) else v) for k, v in extra.items())
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="sweep-", delete=False) as handle:
        json.dump(extra, handle)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    start = time.time()
    try:
        proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, os.path.join(PROJECT, "playbooks", "site.yml"),
                               "--limit", host_name, "-e", "@" + handle.name] + CHECK,
                              env=env, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=600, check=False)
    finally:
        os.unlink(handle.name)
    if LOG_DIR:
        with open(os.path.join(LOG_DIR, case_id + ".log"), "w") as log:
            log.write(proc.stdout)
    return case_id, proc.returncode, proc.stdout, time.time() - start


@pytest.fixture(scope="module")
def foreign(host):
    """The foreign unit file, sysctl.d file and containers (the engine's, through the Spark's docker
    CLI; the image is the one this Spark serves), removed afterwards."""
    host_name = os.environ.get("SWEEP_HOST") or host.backend.host
    names = [name.replace("{host}", host_name) for name in FOREIGN_CONTAINERS]
    image = host.check_output("docker ps --filter label=io.sparkops.unit --format '{{.Image}}' | head -n 1")
    assert image, "no container of the collection's on the Spark: is it converged?"
    made = []
    try:
        host.run_expect([0], "test ! -e %s && printf '[Unit]\\nDescription=not made by the collection\\n[Service]\\nExecStart=/bin/true\\n' > %s"
                        % (FOREIGN_UNIT, FOREIGN_UNIT))
        made.append(FOREIGN_UNIT)
        host.run_expect([0], "test ! -e %s && echo 'vm.swappiness = 60' > %s" % (FOREIGN_SYSCTL, FOREIGN_SYSCTL))
        made.append(FOREIGN_SYSCTL)
        for name, label in zip(names, ("", "--label io.sparkops.unit=sparkops-serve")):
            host.run_expect([0], "docker run -d --name %s %s --network none --entrypoint sleep %s 3600" % (name, label, image))
            made.append(name)
        yield names
    finally:
        for thing in made:
            if thing.startswith("/"):
                host.run("rm -f %s" % thing)
            else:
                host.run("docker rm -f %s" % thing)


@pytest.fixture(scope="module")
def sweep(host, foreign):
    """Snapshot, every case PARALLEL at a time, snapshot again: ({id: (rc, output)}, before, after, wall s)."""
    if LOG_DIR:
        os.makedirs(LOG_DIR, exist_ok=True)
    host_name = os.environ.get("SWEEP_HOST") or host.backend.host
    before = host.check_output(SNAPSHOT)
    start = time.time()
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        for case_id, rc, out, took in pool.map(lambda case: _run_case(host_name, case), CASES):
            _RESULTS[case_id] = (rc, out)
            _TIMES[case_id] = took
    wall = time.time() - start
    after = host.check_output(SNAPSHOT)
    print("\nbad-input sweep: %d cases, %d at a time, %.0f s wall (slowest: %s)"
          % (len(CASES), PARALLEL, wall, ", ".join("%s %.0f s" % item for item in sorted(_TIMES.items(), key=lambda i: -i[1])[:3])))
    return _RESULTS, before, after, wall


@pytest.mark.skipif(bool(ONLY), reason="SWEEP_ONLY picks cases")
def test_the_table_covers_every_role():
    assert len(CASES) >= 60
    assert len({case[0] for case in CASES}) == len(CASES)
    prefixes = ("spark_", "preflight_", "host_tuning_", "checkpoint_", "ple_", "memory_plan_", "runtime_image_", "serve_", "memwatch_")
    for prefix in prefixes:
        assert any(name.startswith(prefix) for _i, _e, name in CASES), prefix


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_refused_in_the_first_play_naming_the_variable(sweep, case):
    case_id, extra, name = case
    rc, out = sweep[0][case_id]
    tail = out[-4000:]
    assert rc != 0, "accepted: %s\n%s" % (json.dumps(extra), tail)
    assert "PLAY [Preflight" in out, tail
    assert "PLAY [Host tuning" not in out, "refused only after the first play: %s\n%s" % (json.dumps(extra), tail)
    assert not re.search(r"^changed: \[", out, re.M) and re.search(r"\bchanged=0\b", out), tail
    failed = out[out.index("fatal:"):] if "fatal:" in out else out
    assert name in failed, "the message does not name %s:\n%s" % (name, tail)
    if name.startswith(BY_VALUES) and case_id not in READS_THE_HOST:
        first_failure = re.search(r"^(fatal|failed): \[", out, re.M)
        assert first_failure and "TASK [Gather facts]" not in out[:first_failure.start()], \
            "refused only after a connection: %s\n%s" % (name, tail)


def test_files_and_units_are_byte_identical_afterwards(sweep):
    _results, before, after, _wall = sweep
    assert before.strip(), "nothing to compare: is the Spark converged?"
    assert after == before
