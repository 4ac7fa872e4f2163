"""vLLM's own KV cache spec at serve time: roles/serve/files/vllm_kv_spec.py, and the serve role's
tasks/kv_spec.yml as prepare.yml includes it.

- The script run as the role runs it (`python3 - ARGS` with the script on stdin): its refusals of bad
  arguments (exit 2) and of an image without a loadable vLLM (exit 4) need no vLLM; with the real
  vLLM of the lab runtime (a Python that imports it: SPARKOPS_VLLM_PYTHON, else .venv/bin/python;
  the test is skipped without one) its per-rank figures at TP 2 equal vLLM's own in the fixtures'
  table (kv_fixtures/vllm_kv_spec.json), in one run for two models (one vLLM import per rank).
- The role's prepare with a stand-in docker (vLLM's answer per image): a figure that differs makes the
  plan again with it (kv_source vllm, both readings kept) and remembers it: the second prepare with the
  same image ID and config.json asks nothing; a figure the plan cannot fit and an image whose vLLM
  cannot be loaded are refused naming the image and memory_plan_kv_bytes_per_token, before any file
  changes; a given memory_plan_kv_bytes_per_token asks nothing. One ansible-playbook start.
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.sparkops.appliance.plugins.module_utils.memory_plan import compute_plan
from harness import ROOT, ansible_env, batch_inventory, host_results, play_json

SCRIPT = os.path.join(ROOT, "roles", "serve", "files", "vllm_kv_spec.py")
FIXTURES = os.path.join(ROOT, "tests", "unit", "plugins", "module_utils", "kv_fixtures")
with open(os.path.join(FIXTURES, "vllm_kv_spec.json"), encoding="utf-8") as _handle:
    VLLM = json.load(_handle)


def fixture_text(name):
    with open(os.path.join(FIXTURES, name, "config.json"), encoding="utf-8") as handle:
        return handle.read()


def run_script(python, argv, env=None, timeout=60):
    with open(SCRIPT, encoding="utf-8") as script:
        return subprocess.run([python] + ["-"] + list(argv), stdin=script, env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)


def _vllm_python():
    for python in (os.environ.get("SPARKOPS_VLLM_PYTHON"), os.path.join(ROOT, ".venv", "bin", "python")):
        if python and os.path.exists(python) and subprocess.run(
                [python, "-c", "import vllm"], capture_output=True, timeout=120, check=False).returncode == 0:
            return python
    return None


# --- the script ---------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["--tp", "1", "[1, 2]"], "CONFIG_JSON 1 is a JSON list, not an object"),
    (["--tp", "1", "{not json"], "CONFIG_JSON 1 is not JSON"),
    (["--tp", "0", "{}"], "--tp and --max-model-len must be whole numbers >= 1"),
    (["--tp", "1"], "the following arguments are required: CONFIG_JSON"),
])
def test_bad_arguments_are_refused_before_vllm_is_imported(argv, words):
    r = run_script(sys.executable, argv)
    assert r.returncode == 2 and "vllm_kv_spec.py: error: " + words in r.stderr, r.stderr
    assert r.stdout == ""


def test_an_image_without_a_loadable_vllm_is_exit_4_not_a_measurement(tmp_path):
    """-S and an empty PYTHONPATH: neither torch nor vLLM imports, as in an image that lacks them."""
    broken = tmp_path / "tree" / "vllm"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    (tmp_path / "tree" / "torch.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "tree"))
    with open(SCRIPT, encoding="utf-8") as script:
        r = subprocess.run([sys.executable, "-S", "-", "--tp", "2", fixture_text("llama-3.1-8b")], stdin=script,
                           env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 4, r.stderr
    assert ("vllm_kv_spec: cannot load vLLM from this image: ImportError: libcudart.so.12: cannot open shared "
            "object file") in r.stderr
    assert r.stdout == ""


@pytest.fixture(name="measured", scope="module")
def fixture_measured():
    python = _vllm_python()
    if python is None:
        pytest.skip("no Python with the lab runtime's vLLM here (set SPARKOPS_VLLM_PYTHON)")
    names = ["llama-3.1-8b", "gemma-4-26B-A4B"]
    r = run_script(python, ["--tp", "2"] + [fixture_text(n) for n in names], timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return names, json.loads(r.stdout)


def test_the_figures_per_rank_are_vllms_own_of_the_fixtures(measured):
    names, out = measured
    assert out["tensor_parallel_size"] == 2 and out["vllm_version"] == VLLM["_meta"]["vllm"]
    assert len(out["specs"]) == len(names)
    for name, spec in zip(names, out["specs"]):
        table = VLLM[name]["tp2"]
        for key in ("full_layers", "full_bytes_per_token", "sliding", "chunked", "recurrent_layers",
                    "recurrent_state_bytes_per_sequence", "shared_layers", "other"):
            assert spec[key] == table[key], (name, key, spec[key], table[key])
        assert spec["tensor_parallel_size"] == 2 and spec["model_dtype"] == "bfloat16"
    assert out["specs"][1]["dropped_from_config"] == ["multimodal wrapper: text_config as Gemma4ForCausalLM"]
    # what the memory plan is given: its own reading at TP 2 agrees
    plan_inputs = dict(PLAN_INPUTS, model_config=json.loads(fixture_text(names[0])), tensor_parallel_size=2,
                       kv_layout_measured=out["specs"][0])
    assert compute_plan(plan_inputs)["kv_vllm_differs"] is False


# --- the role ---------------------------------------------------------------------------------

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
         "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
# config.json gives 131072 B/token: one request of 4096 tokens is 0.5 GiB, above the 0.3 GiB target.
PLAN_INPUTS = {"weight_bytes": 2 ** 30, "ple_gib": 0, "mtp_enabled": False, "mtp_off_credit_gib": 0,
               "overhead_gib": 0.5, "mtp_gib": 0, "max_model_len": 4096, "kv_cache_dtype": "auto",
               "kv_target_gib": 0.3, "mem_total_gib": 16, "host_reserve_gib": 2, "max_num_seqs": 1,
               "max_num_batched_tokens": 1024, "mtp_num_speculative_tokens": 0, "tensor_parallel_size": 1,
               "model_config": LLAMA}
SPEC = {"full_layers": 32, "sliding": [], "chunked": [], "recurrent_layers": 0, "recurrent_kind": None,
        "recurrent_state_bytes_per_sequence": 0, "other": [], "shared_layers": 0, "vllm_version": "0.32.0",
        "tensor_parallel_size": 1}
# The stand-in docker: logs each call; `run ... --tp` answers as vllm_kv_spec.py would in the image named
# (half: 65536 B/token, double: 262144, broken: no vLLM), any other `run` as vllm_check_args.py.
FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "$FAKE_LOG_DIR/docker.log"
case "$*" in
  *" - --tp "*)
    cat > "$FAKE_LOG_DIR/kv-stdin.py"
    case "$*" in
      *img-half*) echo '{"vllm_version": "0.32.0", "tensor_parallel_size": 1, "specs": [%(half)s]}' ;;
      *img-double*) echo '{"vllm_version": "0.32.0", "tensor_parallel_size": 1, "specs": [%(double)s]}' ;;
      *img-broken*) echo "vllm_kv_spec: cannot load vLLM from this image: ImportError: libcudart.so.12" >&2; exit 4 ;;
    esac ;;
  *) cat > /dev/null; echo '{"accepted": true}' ;;
esac
""" % {"half": json.dumps(dict(SPEC, full_bytes_per_token=65536.0)),
       "double": json.dumps(dict(SPEC, full_bytes_per_token=262144.0))}
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$FAKE_LOG_DIR/systemctl.log"
[ "$1" = is-active ] && echo active
exit 0
"""
PREPARE = {"name": "Serve prepare",
           "ansible.builtin.include_role": {"name": "sparkops.appliance.serve", "tasks_from": "prepare"},
           "vars": {"__serve_unit_path": "{{ case_dir }}/systemd/sparkops-serve.service",
                    "__serve_helper": "{{ case_dir }}/libexec/serve-unit"}}
# Two runs of prepare, as two converges (the second where the first measured): each starts from the
# memory_plan role's plan (config.json's).
PLAY = [{"name": "Prepare %d" % n, "hosts": "sparks" if n == 1 else "half", "gather_facts": True,
         "gather_subset": ["min"],
         "tasks": [
             {"name": "The memory_plan role's plan", "ansible.builtin.set_fact": {
                 "spark_memory_plan": "{{ config_plan }}", "spark_memory_plan_inputs": "{{ plan_inputs }}"}},
             PREPARE,
             {"name": "Keep the plan serve uses", "ansible.builtin.copy": {
                 "content": "{{ spark_memory_plan | to_json }}", "dest": "{{ case_dir }}/plan-%d.json" % n,
                 "mode": "0644"}}]}
        for n in (1, 2)]
CASES = {  # host -> (image, the plan's inputs)
    "half": ("sparkops/vllm-runtime:img-half", PLAN_INPUTS),
    "double": ("sparkops/vllm-runtime:img-double", PLAN_INPUTS),
    "broken": ("sparkops/vllm-runtime:img-broken", PLAN_INPUTS),
    "given": ("sparkops/vllm-runtime:img-half", dict(PLAN_INPUTS, kv_bytes_per_token=131072)),
}


@pytest.fixture(name="role", scope="module")
def fixture_role(tmp_path_factory):
    base = tmp_path_factory.mktemp("kv-spec")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("systemctl", FAKE_SYSTEMCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    hosts = {}
    for name, (image, inputs) in CASES.items():
        case = base / name
        (case / "etc").mkdir(parents=True)
        (case / "systemd").mkdir()
        (case / "log").mkdir()
        hosts[name] = {
            "case_dir": str(case), "config_plan": compute_plan(inputs), "plan_inputs": inputs, "serve_image": image,
            "spark_runtime_image_inspect": {"RepoTags": [image], "Id": "sha256:" + "1" * 64, "Config": {"Labels": {}}},
            "serve_model_path": "/srv/sparkops/models/m", "serve_config_dir": str(case / "etc"),
            "serve_state_dir": str(case / "state"), "serve_cache_dir": str(case / "cache"),
            "serve_report_path": str(case / "report" / "plan-vs-actual.json"),
            "serve_jemalloc": False, "serve_ple_file": "", "serve_bind_host": "127.0.0.1",
            "serve_kv_sizing": "bytes", "serve_refuse_fleet_restart": False,
        }
    (base / "play.yml").write_text(yaml.safe_dump(PLAY, sort_keys=False))
    env = ansible_env(PATH=str(bin_dir) + os.pathsep + os.environ["PATH"], FAKE_LOG_DIR=str(base))
    doc = play_json(base / "play.yml", inventory=batch_inventory(base, hosts), connection=None, env=env)
    calls = (base / "docker.log").read_text().splitlines()
    return {"doc": doc, "base": base, "calls": calls, "hosts": hosts}


def kv_calls(role, image):
    return [c for c in role["calls"] if " - --tp " in c and c.split(" - --tp ")[0].endswith(image)]


def failures(role, host):
    return [" ".join(r["msg"].split()) for _p, _t, r in host_results(role["doc"], host) if r.get("failed")]


def test_a_figure_that_differs_makes_the_plan_again_and_is_remembered(role):
    base, inputs = role["base"], CASES["half"][1]
    assert not failures(role, "half")
    calls = kv_calls(role, CASES["half"][0])
    # asked once for both converges: the second found the memo of this image ID, config.json and TP
    assert len(calls) == 1, role["calls"]
    # with the GPU where the server gets it (serve_gpus, true by default): a CUDA build needs its platform
    assert calls[0].startswith("run --rm -i --network none --gpus all --entrypoint python3 sparkops/vllm-runtime:img-half - "
                               "--tp 1 --max-model-len 4096 {")
    assert json.loads(calls[0].split(" --max-model-len 4096 ", 1)[1]) == LLAMA
    with open(SCRIPT, encoding="utf-8") as script:
        assert (base / "kv-stdin.py").read_text().rstrip("\n") == script.read().rstrip("\n")
    by_config = compute_plan(inputs)
    by_vllm = compute_plan(dict(inputs, kv_layout_measured=dict(SPEC, full_bytes_per_token=65536.0)))
    for n in (1, 2):
        plan = json.loads((base / "half" / ("plan-%d.json" % n)).read_text())
        assert plan["kv_source"] == "vllm" and plan["kv_vllm_differs"] is True, n
        assert plan["kv_cache_memory_bytes"] == by_vllm["kv_cache_memory_bytes"] != by_config["kv_cache_memory_bytes"]
        assert plan["gmu"] == by_vllm["gmu"] and plan["budget_bytes"] == by_vllm["budget_bytes"]
        assert plan["kv_config"]["full_bytes_per_token"] == 131072.0
        assert plan["kv_vllm"]["full_bytes_per_token"] == 65536.0
        assert plan["kv_vllm"]["image"] == CASES["half"][0]
    memo = json.loads((base / "half" / "state" / "sparkops-serve.service.kv-spec").read_text())
    assert memo["spec"]["full_bytes_per_token"] == 65536.0 and len(memo["key"]) == 64
    # the table with both readings was shown, and the unit's line carries vLLM's KV bytes
    shown = [r["msg"] for _p, t, r in host_results(role["doc"], "half") if t.endswith("where vLLM's differs from config.json's")
             and not r.get("skipped")]
    assert len(shown) == 2 and any(line.startswith("KV figure used ") and "vllm (config.json differs)" in line
                                   for line in shown[0])
    unit = [r for _p, t, r in host_results(role["doc"], "half") if t.endswith("Which files would change with vLLM's plan (check mode, nothing written)")]
    assert unit and not unit[0].get("skipped")


def test_a_plan_that_vllms_figure_does_not_fit_is_refused_before_any_change(role):
    failed = failures(role, "double")
    assert len(failed) == 1, failed
    assert failed[0].startswith("serve: with the KV figures of the vLLM in sparkops/vllm-runtime:img-double "
                                "(262144.0 B/token on one rank; config.json gave 131072.0) the memory plan refuses: "
                                "memory_plan: kv_exp"), failed[0]
    assert not (role["base"] / "double" / "plan-1.json").exists()
    assert os.listdir(role["base"] / "double" / "etc") == []


def test_an_image_whose_vllm_cannot_be_read_names_the_image_and_the_bypass(role):
    failed = failures(role, "broken")
    assert len(failed) == 1, failed
    assert failed[0] == ("serve: the KV cache spec of /srv/sparkops/models/m/config.json could not be read from the "
                         "vLLM of sparkops/vllm-runtime:img-broken: vLLM cannot be loaded from the image: "
                         "vllm_kv_spec: cannot load vLLM from this image: ImportError: libcudart.so.12. Nothing was "
                         "changed. Fix the image, or bypass: set memory_plan_kv_bytes_per_token (the plan then uses "
                         "that figure and serve does not ask vLLM).")
    assert not (role["base"] / "broken" / "state" / "sparkops-serve.service.kv-spec").exists()
    assert os.listdir(role["base"] / "broken" / "etc") == []


def test_a_given_kv_bytes_per_token_asks_nothing_and_the_plan_stands(role):
    assert not failures(role, "given")
    plan = json.loads((role["base"] / "given" / "plan-1.json").read_text())
    assert plan == json.loads(json.dumps(role["hosts"]["given"]["config_plan"]))
    assert plan["kv_source"] == "given"
    # the kv calls of the whole run: the other hosts' first converges
    assert len([c for c in role["calls"] if " - --tp " in c]) == 3  # half once, double once, broken once
