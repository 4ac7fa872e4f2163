"""roles/serve/files/vllm_check_args.py against every layout of vLLM's serve parser (stand-in
`vllm` trees from vllm_layouts on PYTHONPATH, run as the role runs it: `python3 - ARGS` with the
script on stdin), and the role's two refusals: "vLLM rejected the line" quotes vLLM, "the checker
could not load vLLM" blames the image. The real vLLM of the lab image is checked by the serve
Molecule scenario."""
import json
import os
import subprocess
import sys

import pytest
import yaml

import harness
import vllm_layouts

ROOT = harness.ROOT
ROLE = os.path.join(ROOT, "roles", "serve")
CHECKER = os.path.join(ROLE, "files", "vllm_check_args.py")

# What the serve role passes (roles/serve/vars/main.yml: __serve_vllm_args), in the lab's shape.
LINE = ["/model", "--served-model-name", "tiny-llama", "--host", "0.0.0.0", "--port", "8000",
        "--kv-cache-memory-bytes", "67108864", "--kv-cache-dtype", "auto", "--max-model-len", "1024",
        "--max-num-seqs", "4", "--max-num-batched-tokens", "1024", "--enable-prefix-caching",
        "--enforce-eager", "--distributed-executor-backend", "uni"]

WHERE = {  # layout -> (FlexibleArgumentParser's module, where the serve parser came from)
    "0.10": ("vllm.utils", "vllm.entrypoints.cli.serve.ServeSubcommand"),
    "0.12": ("vllm.utils.argparse_utils", "vllm.entrypoints.cli.serve.ServeSubcommand"),
    "0.32": ("vllm.utils.argparse_utils", "vllm.entrypoints.cli.serve.ServeSubcommand"),
    "lazy": ("vllm.utils.argparse_utils", "vllm.entrypoints.cli.serve.ServeSubcommand"),
    "no-cli": ("vllm.utils", "vllm.entrypoints.openai.cli_args.make_arg_parser"),
}


def check(tree, argv):
    """The checker as the role runs it; -S keeps any vLLM installed here out of the way."""
    env = dict(os.environ, PYTHONPATH=str(tree) if tree else "")
    with open(CHECKER, encoding="utf-8") as script:
        return subprocess.run([sys.executable, "-S", "-"] + list(argv), stdin=script, env=env,
                              capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(name="layout", params=sorted(vllm_layouts.LAYOUTS))
def _layout(request, tmp_path):
    return request.param, vllm_layouts.write(tmp_path / request.param, vllm_layouts.LAYOUTS[request.param])


def test_the_roles_line_is_accepted_by_every_layout(layout):
    name, tree = layout
    r = check(tree, LINE)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["accepted"] and out["model"] == "/model" and out["argv"] == LINE
    assert out["vllm_version"] == vllm_layouts.LAYOUTS[name]["vllm/__init__.py"].split('"')[1]
    assert out["parser"] == list(WHERE[name])


def test_an_unknown_flag_is_rejected_by_vllms_own_parser(layout):
    _name, tree = layout
    r = check(tree, LINE + ["--cudagraph_mode", "FULL"])
    assert r.returncode == 2
    # vLLM's FlexibleArgumentParser read the underscore form: its parser, not plain argparse
    assert "error: unrecognized arguments: --cudagraph-mode FULL" in r.stderr
    r = check(tree, LINE + ["--max-model-len", "long"])
    assert r.returncode == 2 and "argument --max-model-len: invalid int value: 'long'" in r.stderr


def test_vllms_validation_of_the_parsed_line_rejects(layout):
    _name, tree = layout
    r = check(tree, LINE + ["--enable-auto-tool-choice"])
    assert r.returncode == 3
    assert r.stderr.strip() == "vllm serve: error: Error: --enable-auto-tool-choice requires --tool-call-parser"
    assert check(tree, LINE + ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]).returncode == 0


def test_help_serves_nothing_and_is_rejected(layout):
    _name, tree = layout
    r = check(tree, LINE + ["--help"])
    assert r.returncode == 3 and "asks for help" in r.stderr


@pytest.mark.parametrize("broken", sorted(vllm_layouts.BROKEN) + ["no-vllm"])
def test_a_vllm_that_cannot_be_loaded_is_not_a_rejected_line(tmp_path, broken):
    tree = vllm_layouts.write(tmp_path / broken, vllm_layouts.BROKEN.get(broken, {}))
    r = check(tree, LINE)
    assert r.returncode == 4, r.stderr
    assert r.stderr.startswith("vllm_check_args: cannot load vLLM's serve parser from this image:")
    assert "error: unrecognized" not in r.stderr and r.stdout == ""
    # what was tried is named, newest place first
    assert r.stderr.index("vllm.utils.argparse_utils") < r.stderr.index("vllm.utils:")
    if broken == "import-fails":
        assert "libcudart.so.12: cannot open shared object file" in r.stderr
    if broken == "unknown-layout":
        assert "vllm.utils: has no FlexibleArgumentParser" in r.stderr


# --- the role's refusals, the tasks taken from roles/serve/tasks/check_args.yml as they are ---

def _role_tasks(*names):
    with open(os.path.join(ROLE, "tasks", "check_args.yml"), encoding="utf-8") as f:
        tasks = {t["name"]: t for t in yaml.safe_load(f)}
    return [tasks[n] for n in names]


PLAN = {"gmu": 0.2, "kv_cache_memory_bytes": 67108864, "docker_memory_gib": 6.5, "docker_memory_bytes": 6979321856, "budget_bytes": 1610612736,
        "inputs": {"max_model_len": 1024, "max_num_seqs": 4, "max_num_batched_tokens": 1024,
                   "kv_cache_dtype": "auto", "mtp_enabled": False, "mtp_num_speculative_tokens": 0}}


# The role's check run once for every case: one ansible-playbook start, one host per case (all on
# this machine). A case's variables come in as the play's last vars_files entry, after the role's
# defaults and vars, so they win over both exactly as the -e of one run per case did (nothing here
# sets facts or includes vars that -e would also have outranked).
ROLE_CASES = {  # host -> (the stand-in tree: a layout or a broken one, variables over the common ones)
    "good": (vllm_layouts.LAYOUTS["0.10"], {}),
    "rejected": (vllm_layouts.LAYOUTS["0.10"], {"serve_extra_args": ["--cudagraph_mode", "FULL"]}),
    "broken": (vllm_layouts.BROKEN["import-fails"], {}),
    "no-python": (vllm_layouts.LAYOUTS["0.32"], {"python": "/nonexistent/python3"}),
}


@pytest.fixture(name="role_check", scope="module")
def fixture_role_check(tmp_path_factory):
    """The role's check-and-refuse tasks with the image's `python3 -` replaced by this one, one host
    per case: {case: (whether that host failed, [its task results in order])}."""
    base = tmp_path_factory.mktemp("role-check")
    check_task = {
        "name": "Validate the vLLM command line (here: a stand-in vLLM tree, not an image)",
        "ansible.builtin.command": {"argv": "{{ [python, '-S', '-'] + __serve_vllm_args }}",
                                    "stdin": "{{ lookup('ansible.builtin.file', checker) }}"},
        "environment": {"PYTHONPATH": "{{ tree }}"},
        "register": "__serve_validate", "changed_when": False, "failed_when": False,
    }
    refusals = _role_tasks("Fail when the line could not be checked (the image is the problem, not the line)",
                           "Fail on a command line that vLLM rejects (the running service is untouched)")
    playbook = base / "check.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "sparks", "gather_facts": False,
        "vars_files": [os.path.join(ROOT, "roles", "common", "defaults", "main.yml"),
                       os.path.join(ROLE, "defaults", "main.yml"), os.path.join(ROLE, "vars", "main.yml"),
                       "{{ case_vars_file }}"],
        "tasks": [check_task] + refusals}], sort_keys=False))
    hosts = {}
    for case, (files, extra) in ROLE_CASES.items():
        tree = vllm_layouts.write(base / case / "tree", files)
        case_vars = {"spark_memory_plan": PLAN, "spark_model_dir": "/srv/sparkops/models",
                     "spark_model_name": "tiny-llama", "serve_image": "sparkops/vllm-runtime:0123456789ab",
                     "serve_kv_sizing": "bytes", "python": sys.executable, "checker": CHECKER,
                     "ansible_python_interpreter": sys.executable, "tree": str(tree)}
        case_vars.update(extra)
        (base / case / "vars.json").write_text(json.dumps(case_vars))
        hosts[case] = {"case_vars_file": str(base / case / "vars.json")}
    doc = harness.play_json(playbook, inventory=harness.batch_inventory(base, hosts), connection=None)
    return {case: (harness.host_failure(doc, case) is not None, [r for _p, _t, r in harness.host_results(doc, case)])
            for case in ROLE_CASES}


def test_the_role_quotes_vllm_when_it_rejects_and_blames_the_image_when_it_cannot_load(role_check):
    failed, results = role_check["good"]
    assert not failed and not any(r.get("failed") for r in results), results

    failed, results = role_check["rejected"]   # serve_extra_args: --cudagraph_mode FULL
    msg = " ".join(results[-1]["msg"].split())
    assert failed and msg.startswith("serve: vLLM in sparkops/vllm-runtime:0123456789ab rejects the command line")
    assert msg.endswith("vllm: error: unrecognized arguments: --cudagraph-mode FULL")
    assert results[1].get("skipped")

    failed, results = role_check["broken"]     # vllm_layouts.BROKEN["import-fails"]
    msg = " ".join(results[1]["msg"].split())
    assert failed and len(results) == 2
    assert msg.startswith("serve: the command line could not be checked: the checker could not load vLLM "
                          "from sparkops/vllm-runtime:0123456789ab: vllm_check_args: cannot load")
    assert "libcudart.so.12" in msg and "This says nothing about the line" in msg and "rejects" not in msg


def test_the_role_names_a_checker_that_did_not_run(role_check):
    failed, results = role_check["no-python"]  # python=/nonexistent/python3
    assert failed
    msg = " ".join(results[1]["msg"].split())
    assert "the checker did not run in sparkops/vllm-runtime:0123456789ab" in msg, msg


def test_the_layouts_mimic_what_they_name():
    """The stand-ins keep vLLM's names where the checker looks for them (guards the test itself)."""
    for name, files in vllm_layouts.LAYOUTS.items():
        text = "\n".join("%s\n%s" % (path, src) for path, src in files.items())
        assert "FlexibleArgumentParser(argparse.ArgumentParser)" in text, name
        assert "def make_arg_parser(parser)" in text and "def validate_parsed_serve_args(args)" in text, name
    assert "vllm/utils/argparse_utils.py" not in vllm_layouts.LAYOUTS["0.10"]
    assert "FlexibleArgumentParser" not in vllm_layouts.LAYOUTS["0.12"]["vllm/utils/__init__.py"]
    assert "vllm/entrypoints/openai/cli_args.py" not in vllm_layouts.LAYOUTS["0.32"]
