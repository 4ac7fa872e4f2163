"""The checkpoint role's secret handling and its Hugging Face helper (the Hub itself is not reachable
here: its HTTP API is a stand-in server, hub_standin.py, and huggingface_hub a recording stand-in)."""
import glob
import json
import os
import re
import sys
import threading
import types

import yaml

from harness import walk_tasks
from hub_standin import REPO, REVISION, Hub

ROLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "roles", "checkpoint")
SECRETS = ("checkpoint_hf_token",)


def test_every_task_that_touches_the_token_has_no_log():
    seen = 0
    for path in glob.glob(os.path.join(ROLE, "tasks", "*.yml")):
        for task in walk_tasks(yaml.safe_load(open(path))):
            if "block" in task:
                continue
            text = yaml.safe_dump(task)
            if any(re.search(r"\{\{[^}]*\b%s\b" % s, text) for s in SECRETS):  # the value is templated in
                seen += 1
                assert task.get("no_log") is True, "%s: %s lacks no_log" % (os.path.basename(path), task.get("name"))
                # the token goes into its 0600 file, never on a command line, stdin or environment
                assert "ansible.builtin.copy" in task and task["ansible.builtin.copy"]["mode"] == "0600"
            for key in ("ansible.builtin.command", "environment"):
                assert "checkpoint_hf_token" not in yaml.safe_dump(task.get(key, {}))
    assert seen == 1  # the token file


def test_argument_spec_marks_the_token_no_log():
    spec = yaml.safe_load(open(os.path.join(ROLE, "meta", "argument_specs.yml")))
    opts = spec["argument_specs"]["main"]["options"]
    assert opts["checkpoint_hf_token"]["no_log"] is True
    defaults = yaml.safe_load(open(os.path.join(ROLE, "defaults", "main.yml")))
    assert set(defaults) == set(opts)  # every default is documented, and nothing else


def load_helper(monkeypatch, calls):
    """hf_fetch.py with a recording stand-in huggingface_hub (its plan asks the stand-in Hub directly)."""
    hub = types.ModuleType("huggingface_hub")

    def snapshot_download(**kw):
        calls.append(("snapshot_download", kw))
        os.makedirs(kw["local_dir"], exist_ok=True)
        with open(os.path.join(kw["local_dir"], "config.json"), "w") as f:
            f.write("{}\n")
        return kw["local_dir"]

    hub.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    import importlib.util
    spec = importlib.util.spec_from_file_location("hf_fetch", os.path.join(ROLE, "files", "hf_fetch.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hf_plan_lists_the_hubs_sizes_and_lfs_sha256_over_every_page(monkeypatch, tmp_path, capsys):
    mod = load_helper(monkeypatch, [])
    (tmp_path / "token").write_text("hf_secret\n")
    with Hub("hf_secret") as hub:
        assert mod.main(["plan", "--repo", REPO, "--revision", REVISION, "--endpoint", hub.url, "--token-file", str(tmp_path / "token"),
                         "--allow-pattern", "*.safetensors", "--allow-pattern", "*.json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert len([p for p, _a in hub.auth_seen if p.startswith("/api/")]) == 2  # 4 entries, 2 a page
        assert out["expected"] == [
            {"path": "config.json", "size": len(hub.files["config.json"][0]), "sha256": None},
            {"path": "extra/adapter.safetensors", "size": 4096, "sha256": hub.sha256("extra/adapter.safetensors")},
            {"path": "model.safetensors", "size": 96 * 1024, "sha256": hub.sha256("model.safetensors")}]
        assert out["total_bytes"] == sum(e["size"] for e in out["expected"]) and out["files"] == 3 and out["revision"] == REVISION


def test_hf_download_passes_revision_local_dir_endpoint_token_and_writes_progress(monkeypatch, tmp_path, capsys):
    calls = []
    mod = load_helper(monkeypatch, calls)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    (tmp_path / "token").write_text("hf_secret")
    prog = str(tmp_path / "p.json")
    with Hub("hf_secret") as hub:
        assert mod.main(["download", "--repo", REPO, "--revision", REVISION, "--local-dir", str(tmp_path / "d"), "--endpoint", hub.url,
                         "--token-file", str(tmp_path / "token"), "--progress-file", prog]) == 0
        total = sum(len(d) for d, _lfs in hub.files.values())
    dl = [c for c in calls if c[0] == "snapshot_download"][0][1]
    assert dl == {"repo_id": REPO, "revision": REVISION, "local_dir": str(tmp_path / "d"), "allow_patterns": None,
                  "token": "hf_secret", "endpoint": hub.url}
    p = json.load(open(prog))
    assert p["state"] == "done" and p["total"] == total and p["done"] == 3


def test_hf_progress_done_record_counts_the_bytes_of_the_end(monkeypatch, tmp_path):
    # The download ends while the progress loop measures the folder (seen in CI under load: the
    # final record said done with 0 bytes). The record that says done must hold the final size.
    mod = load_helper(monkeypatch, [])
    stop = threading.Event()
    sizes = iter([0, 3, 3])

    def measure(_root):
        stop.set()              # the download ends during the first measurement
        return next(sizes)

    monkeypatch.setattr(mod, "dir_bytes", measure)
    prog = str(tmp_path / "p.json")
    mod.progress_loop(prog, str(tmp_path), 3, stop)
    p = json.load(open(prog))
    assert p["state"] == "done" and p["done"] == 3, p
