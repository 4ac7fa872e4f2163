"""Make the shared test helpers kept in tests/unit itself (ansible_json) importable from its subfolders.

And the order pytest-xdist's --dist loadfile hands the files out in: the slowest first. xdist would
otherwise sort the files by their number of tests, which puts a batch file (one ansible-playbook
start for all its cases, so few tests, but the longest run) last, where it alone on one worker
is the end of the run while the others idle. HEAVIEST_FIRST: the files that take longest (CPU
seconds of the file with its subprocesses, measured on a 2-core machine), heaviest first; a file not
listed that starts Ansible follows them, then the rest in their collection order."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

HEAVIEST_FIRST = [
    "roles/test_runtime_image_labels.py",
    "roles/test_host_tuning_role.py",
    "roles/test_vllm_kv_spec.py",
    "roles/test_checkpoint_staged.py",
    "roles/test_checkpoint_staged_hub.py",
    "roles/test_checkpoint_hub.py",
    "playbooks/test_plan_playbook.py",
    "roles/test_cluster_role.py",
    "roles/test_serve_unit.py",
    "memwatch/test_memwatch_retry.py",
    "roles/test_ple_role.py",
    "roles/test_preflight_known_bad.py",
    "roles/test_serve_liveness.py",
    "plugins/filter/test_memory_plan_properties.py",
    "roles/test_serve_prepare.py",
    "roles/test_preflight_restarts.py",
    "roles/test_preflight_image_labels.py",
    "memwatch/test_memwatch_daemon.py",
    "memwatch/test_memwatch_docker_unknown.py",
    "roles/test_serve_memcheck.py",
    "roles/test_preflight_nvidia_runtime.py",
    "roles/test_checkpoint_wait.py",
    "plugins/callback/test_spark_summary.py",
    "playbooks/test_rollout_playbook.py",
    "roles/test_vllm_check_args.py",
    "playbooks/test_rollout_batch_failure.py",
    "roles/test_drivers_validate.py",
    "memwatch/test_memwatch_role.py",
    "roles/test_drivers_gpu_checks.py",
    "plugins/modules/test_checkpoint_modules.py",
    "roles/test_checks_as_data.py",
    "plugins/modules/test_ple_pack.py",
    "plugins/module_utils/test_checkpoint.py",
    "roles/test_checkpoint_allow_http.py",
    "roles/test_checkpoint_peer_trust.py",
    "memwatch/test_memwatch_rules.py",
    "plugins/modules/test_vllm_status.py",
    "plugins/modules/test_spark_facts.py",
    "test_lab_config.py",
    "plugins/test_role_inputs.py",
]
STARTS_ANSIBLE = ("run_playbook(", "play_json(", "run_adhoc(")


def _rank(path, cache={}):  # pylint: disable=dangerous-default-value
    """0.. for a listed file (its place), then len(HEAVIEST_FIRST) for one that starts Ansible, then one more."""
    if path not in cache:
        rel = os.path.relpath(path, HERE).replace(os.sep, "/")
        if rel in HEAVIEST_FIRST:
            cache[path] = HEAVIEST_FIRST.index(rel)
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            cache[path] = len(HEAVIEST_FIRST) + (0 if any(call in text for call in STARTS_ANSIBLE) else 1)
    return cache[path]


def pytest_configure(config):
    """xdist: hand the files out in the collection order below, not sorted by their number of tests."""
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    """The files heaviest first (a stable sort: each file's tests stay together and in order)."""
    items.sort(key=lambda item: _rank(str(item.path)))
