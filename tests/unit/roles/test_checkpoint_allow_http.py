"""The checkpoint role fetches over https:// only unless checkpoint_allow_http:
a plain http:// checkpoint_url, checkpoint_manifest or Hub endpoint is refused by tasks_from=validate,
as site.yml's first play runs it, with a message naming the variable and the fix.

One ansible-playbook start checks every case (harness.validate_batch: one local host per case)."""
import pytest

from harness import host_results, validate_batch

SHA = "0123456789abcdef0123456789abcdef01234567"
HF = {"checkpoint_source": "huggingface", "checkpoint_hf_repo": "org/model", "checkpoint_revision": SHA}
CASES = {
    "http-url": ({"checkpoint_source": "http", "checkpoint_url": "http://models.example/m"}, "checkpoint_url"),
    "http-manifest": ({"checkpoint_source": "http", "checkpoint_url": "https://models.example/m",
                       "checkpoint_manifest": "http://models.example/m.json"}, "checkpoint_manifest"),
    "http-hub": (dict(HF, checkpoint_hf_endpoint="http://hub.example"), "checkpoint_hf_endpoint"),
    "https-url": ({"checkpoint_source": "http", "checkpoint_url": "https://models.example/m"}, None),
    "https-hub": (dict(HF), None),
    "allowed-url": ({"checkpoint_source": "http", "checkpoint_url": "http://127.0.0.1:8088/good",
                     "checkpoint_allow_http": True}, None),
    "allowed-hub": (dict(HF, checkpoint_hf_endpoint="http://127.0.0.1:9", checkpoint_allow_http=True), None),
    "none-source": ({"checkpoint_source": "none", "checkpoint_url": "http://ignored.example"}, None),
    "allow-not-bool": ({"checkpoint_source": "http", "checkpoint_url": "https://models.example/m",
                        "checkpoint_allow_http": "yes"}, "checkpoint_allow_http"),
}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("checkpoint-allow-http")
    return validate_batch(tmp_path, "checkpoint", {name: extra for name, (extra, _v) in CASES.items()},
                          name="batch-inventory.json")


def outcome(doc, host):
    results = [r for play, _t, r in host_results(doc, host) if play == "Validate"]
    assert results, "%s ran no task" % host
    messages = [r.get("msg", "") for r in results if r.get("failed")]
    return bool(messages) or doc["stats"][host]["failures"] > 0, " | ".join(messages)


@pytest.mark.parametrize("case", sorted(CASES))
def test_plain_http_is_refused_unless_allowed(batch, case):
    _extra, variable = CASES[case]
    failed, message = outcome(batch, case)
    if variable is None:
        assert not failed, message
    else:
        assert failed and variable in message, message
        if variable != "checkpoint_allow_http":
            assert "https://" in message and "checkpoint_allow_http: true" in message, message
