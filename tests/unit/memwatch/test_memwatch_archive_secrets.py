"""Incident archives are made to be handed around: they hold no secret.

`docker inspect` of the serving container carries its environment (Config.Env: VLLM_API_KEY and
whatever serve_env holds, from the env file `docker run --env-file` read). The archive keeps the
names and drops the values, and drops the value of a credential option on the command line.
"""
import json
import os
import tarfile

from test_memwatch_daemon import drive

SECRETS = ("sekrit-api-key-0001", "hf_serve_env_value_0002", "s3cr3t=with=equals", "argv-key-0003")


def inspect_doc(running=True):
    return [{
        "Id": "0123abcd",
        "Name": "/vllm-test",
        "Path": "vllm",
        "Args": ["serve", "/models/m", "--api-key", SECRETS[3], "--port", "8000"],
        "State": {"Running": running},
        "Config": {
            "Env": ["VLLM_API_KEY=" + SECRETS[0], "HF_TOKEN=" + SECRETS[1], "ODD=" + SECRETS[2], "EMPTY=",
                    "PATH=/usr/local/bin:/usr/bin"],
            "Cmd": ["serve", "/models/m", "--api-key=" + SECRETS[3]],
            "Image": "vllm:test",
        },
        "HostConfig": {"Binds": ["/models:/models:ro"]},
    }]


def test_archive_holds_no_env_value_but_keeps_the_names(mw, lab):
    lab.set_container(inspect=inspect_doc())
    dog = lab.watchdog(mw, stop_grace_s=3)
    assert drive(dog, lab, [(60, 30)] * 3 + [(5, 3)] * 12) == [(8, "available")]
    (archive,) = os.listdir(lab.config["archive_dir"])
    members = {}
    with tarfile.open(os.path.join(lab.config["archive_dir"], archive)) as tar:
        for info in tar.getmembers():
            if info.isfile():
                members[os.path.basename(info.name)] = tar.extractfile(info).read()
    assert "container-inspect.json" in members, sorted(members)
    for name, data in members.items():
        for secret in SECRETS:
            assert secret.encode() not in data, (name, secret)
    doc = json.loads(members["container-inspect.json"])
    env = doc[0]["Config"]["Env"]
    assert [e.split("=", 1)[0] for e in env] == ["VLLM_API_KEY", "HF_TOKEN", "ODD", "EMPTY", "PATH"], env
    assert all(e.endswith("=<redacted>") for e in env), env
    assert doc[0]["Args"][:4] == ["serve", "/models/m", "--api-key", "<redacted>"] and doc[0]["Args"][5] == "8000", doc
    assert doc[0]["Config"]["Cmd"][2] == "--api-key=<redacted>", doc
    assert doc[0]["Config"]["Image"] == "vllm:test" and doc[0]["HostConfig"] == {"Binds": ["/models:/models:ro"]}


def test_unparsable_inspect_is_not_archived_raw(mw):
    """An inspect answer that is not JSON cannot be redacted: it is left out, with a note."""
    text = 'not json VLLM_API_KEY=%s' % SECRETS[0]
    assert SECRETS[0] not in mw.redact_inspect(text)
    assert mw.redact_inspect(json.dumps(inspect_doc())).count("<redacted>") == 7
