"""The checkpoint role's secret handling and its Hugging Face helper (the Hub itself is not reachable
here, so huggingface_hub is replaced by a recording stand-in)."""
import glob
import json
import os
import re
import sys
import types

import yaml

ROLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "roles", "checkpoint")
SECRETS = ("checkpoint_hf_token",)


def walk(tasks):
    for t in tasks or []:
        yield t
        for key in ("block", "rescue", "always"):
            yield from walk(t.get(key))


def test_every_task_that_touches_the_token_has_no_log():
    seen = 0
    for path in glob.glob(os.path.join(ROLE, "tasks", "*.yml")):
        for task in walk(yaml.safe_load(open(path))):
            if "block" in task:
                continue
            text = yaml.safe_dump(task)
            if any(re.search(r"\{\{[^}]*\b%s\b" % s, text) for s in SECRETS):  # the value is templated in
                seen += 1
                assert task.get("no_log") is True, "%s: %s lacks no_log" % (os.path.basename(path), task.get("name"))
                # the token travels in the environment, never on the command line
                assert "checkpoint_hf_token" not in yaml.safe_dump(task.get("ansible.builtin.command", {}))
    assert seen == 2  # the size query and the download


def test_argument_spec_marks_the_token_no_log():
    spec = yaml.safe_load(open(os.path.join(ROLE, "meta", "argument_specs.yml")))
    opts = spec["argument_specs"]["main"]["options"]
    assert opts["checkpoint_hf_token"]["no_log"] is True
    defaults = yaml.safe_load(open(os.path.join(ROLE, "defaults", "main.yml")))
    assert set(defaults) == set(opts)  # every default is documented, and nothing else


def load_helper(monkeypatch, calls):
    hub = types.ModuleType("huggingface_hub")

    class Sibling(object):
        def __init__(self, name, size):
            self.rfilename, self.size = name, size

    class HfApi(object):
        def model_info(self, repo, revision=None, files_metadata=False, token=None):
            calls.append(("model_info", repo, revision, files_metadata, token))
            return types.SimpleNamespace(sha=revision, siblings=[
                Sibling("model-00001-of-00002.safetensors", 100), Sibling("model-00002-of-00002.safetensors", 50),
                Sibling("config.json", 7), Sibling("README.md", 3)])

    def snapshot_download(**kw):
        calls.append(("snapshot_download", kw))
        os.makedirs(kw["local_dir"], exist_ok=True)
        with open(os.path.join(kw["local_dir"], "config.json"), "w") as f:
            f.write("{}\n")
        return kw["local_dir"]

    hub.HfApi, hub.snapshot_download = HfApi, snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    import importlib.util
    spec = importlib.util.spec_from_file_location("hf_fetch", os.path.join(ROLE, "files", "hf_fetch.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hf_plan_sums_sizes_of_the_pinned_revision_with_env_token(monkeypatch, capsys):
    calls = []
    mod = load_helper(monkeypatch, calls)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    rev = "0123456789abcdef0123456789abcdef01234567"
    assert mod.main(["plan", "--repo", "o/m", "--revision", rev, "--allow-pattern", "*.safetensors",
                     "--allow-pattern", "*.json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"total_bytes": 157, "files": 3, "revision": rev}
    assert calls == [("model_info", "o/m", rev, True, "hf_secret")]


def test_hf_download_passes_revision_local_dir_and_writes_progress(monkeypatch, tmp_path, capsys):
    calls = []
    mod = load_helper(monkeypatch, calls)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    rev = "0123456789abcdef0123456789abcdef01234567"
    prog = str(tmp_path / "p.json")
    assert mod.main(["download", "--repo", "o/m", "--revision", rev, "--local-dir", str(tmp_path / "d"),
                     "--progress-file", prog]) == 0
    dl = [c for c in calls if c[0] == "snapshot_download"][0][1]
    assert dl == {"repo_id": "o/m", "revision": rev, "local_dir": str(tmp_path / "d"), "allow_patterns": None,
                  "token": None}
    p = json.load(open(prog))
    assert p["state"] == "done" and p["total"] == 160 and p["done"] == 3
