"""What a user of the lab Spark sees after the checkpoint role ran (http and path sources)."""
import json
import os
import subprocess

import pytest

SCENARIO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = os.path.dirname(os.path.dirname(SCENARIO))
MODELS = "/srv/sparkops/models"
SRC = "/srv/lab-http/good"
SHARDS = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
          "model-00003-of-00003.safetensors", "config.json", "tokenizer/tokenizer.json"]


@pytest.mark.parametrize("kind", ["http", "path"])
def test_files_manifest_and_fingerprint(host, kind):
    d = "%s/lab-model-%s" % (MODELS, kind)
    for rel in SHARDS:
        f = host.file("%s/%s" % (d, rel))
        assert f.is_file, rel
        assert f.size == host.file("%s/%s" % (SRC, rel)).size
        assert f.sha256sum == host.file("%s/%s" % (SRC, rel)).sha256sum
        assert not host.file("%s/%s.part" % (d, rel)).exists
    manifest = json.loads(host.file(d + "/.sparkops-manifest.json").content_string)
    assert sorted(e["path"] for e in manifest["files"]) == sorted(SHARDS)
    fp = json.loads(host.file(d + "/.sparkops-fingerprint.json").content_string)
    assert [row[0] for row in fp["files"]] == sorted(SHARDS)


def test_path_source_got_a_manifest_equal_to_the_publishers(host):
    """The NFS stand-in had no manifest: the one built on first fetch has the publisher's sums."""
    assert not host.file("/srv/nfs-model/.sparkops-manifest.json").exists
    built = json.loads(host.file(MODELS + "/lab-model-path/.sparkops-manifest.json").content_string)
    published = json.loads(host.file(SRC + "/.sparkops-manifest.json").content_string)
    assert built["files"] == published["files"]


def test_server_listens_on_loopback_only(host):
    assert host.socket("tcp://127.0.0.1:8088").is_listening
    assert not host.socket("tcp://0.0.0.0:8088").is_listening


def test_failure_cases_play():
    """negative.yml: corrupted byte named, interrupted download resumed, reverify, disk check,
    unpinned HF revision; and the HF token never appears in the output."""
    env = dict(os.environ)
    env.setdefault("ANSIBLE_CONFIG", os.path.join(PROJECT, "ansible.cfg"))
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(PROJECT, ".collections")
    env["ANSIBLE_FORCE_COLOR"] = "0"
    out = subprocess.run(
        ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], os.path.join(SCENARIO, "negative.yml")],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=900, check=False)
    log = out.stdout + out.stderr
    print(log[-20000:])
    assert out.returncode == 0
    assert "failed=0" in log and "rescued=5" in log
    assert "hf_SECRET_lab_token_never_shown" not in log
    # the resumed fetch printed its progress file (bytes done / total) when the wait ended
    assert "of 48.3 MiB (" in log
