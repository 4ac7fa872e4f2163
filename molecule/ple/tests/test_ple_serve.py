"""PLE served from the pack (docs/ple-runtime.md): the tiny Gemma 4 served by the lab's CPU vLLM.

The unit (serve role) runs the runtime image with the pack mounted and SPARKOPS_PLE_FILE set, so
the image's PLE plugin reads the per-layer rows from the mmap'd pack. A second container of the
same image without the pack (stock vLLM, SPARKOPS_PLE_REPORT_WEIGHTS=1 so it logs its resident
weight bytes) answers the same prompts: the outputs must agree. Measurements are printed (pytest
-s / molecule verify -v shows them).
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
sys.path.insert(0, os.path.join(PROJECT, "tests", "support"))
from lab_key import auth_header  # noqa: E402 (tests/support is put on the path just above)
SCENARIO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPARK = "sparkops-molecule-ple"
SERVER = "sparkops-vllm-" + SPARK
STOCK = "sparkops-molecule-ple-stock"
SVC = "sparkops-serve.service"
MODEL = "/srv/sparkops/models/tiny-gemma4"
PACK = MODEL + ".ple"
PLUGIN_PORT, STOCK_PORT = 8000, 8001
PROMPTS = ["The spark", "Memory cache token model", "Kernel page block layer weight", "Drain the fleet and"]
# Same weights and arithmetic on both sides (the plugin only changes where the BF16 rows come
# from): tokens must be identical; logprobs may differ by float reordering only.
LOGPROB_TOL = 1e-3


def docker(*args, timeout=120):
    return subprocess.run(["docker"] + list(args), capture_output=True, text=True, timeout=timeout, check=False)


def request(port, body, timeout=120):
    """POST /v1/completions from inside the Spark (the servers share its network)."""
    out = docker("exec", SPARK, "curl", "-sS", "--max-time", str(timeout), "-H", "Content-Type: application/json",
                 "-H", "Authorization: " + auth_header()["Authorization"],
                 "-d", json.dumps(body), "http://127.0.0.1:%d/v1/completions" % port, timeout=timeout + 10)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def healthy(port):
    return docker("exec", SPARK, "curl", "-fsS", "--max-time", "5", "http://127.0.0.1:%d/health" % port).returncode == 0


def wait_healthy(port, container, bound_s=900):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if healthy(port):
            return
        # the unit's container has --rm (gone when it exits): anything but "true" is a dead server
        state = docker("inspect", "-f", "{{.State.Running}}", container)
        assert state.stdout.strip() == "true", "%s is not running (%s): %s" % (
            container, state.stderr.strip(), docker("logs", "--tail", "40", container).stderr)
        time.sleep(2)
    pytest.fail("%s not healthy within %d s" % (container, bound_s))


def unit_docker_args():
    """The unit's own docker run line (image, vLLM args), read from the rendered unit."""
    unit = docker("exec", SPARK, "systemctl", "cat", SVC).stdout
    rest = unit.split("/usr/bin/docker run", 1)[1].splitlines()
    line = []
    for part in rest:   # the command ends at the first line that does not continue with a backslash
        line.append(part.rstrip("\\"))
        if not part.endswith("\\"):
            break
    return " ".join(line).split()


@pytest.fixture(scope="module")
def servers():
    """The unit's server (plugin) and a stock server of the same image, both warmed up."""
    wait_healthy(PLUGIN_PORT, SERVER)
    args = unit_docker_args()
    image = next((a for a in args if a.startswith("sparkops/molecule-ple-runtime:")), None)
    assert image, args
    vllm_args = args[args.index(image) + 1:]
    vllm_args[vllm_args.index("--port") + 1] = str(STOCK_PORT)
    docker("rm", "-f", STOCK)
    env = [line for line in docker("exec", SPARK, "cat", "/etc/sparkops/sparkops-serve.env").stdout.splitlines()
           if "=" in line and not line.startswith("#") and not line.startswith("SPARKOPS_PLE_FILE=")]
    # no --rm: the log of a failed start stays readable; the finally below removes it
    run = docker("run", "-d", "--name", STOCK, "--network", "container:" + SPARK,
                 *[a for line in env for a in ("-e", line)], "-e", "SPARKOPS_PLE_REPORT_WEIGHTS=1",
                 "-v", docker("inspect", "-f", "{{.GraphDriver.Data.MergedDir}}", SPARK).stdout.strip() + MODEL + ":/model:ro",
                 image, *vllm_args)
    assert run.returncode == 0, run.stderr
    try:
        wait_healthy(STOCK_PORT, STOCK)
        for port in (PLUGIN_PORT, STOCK_PORT):  # the lab vLLM's first request must be short
            request(port, {"model": "tiny-gemma4", "prompt": "hello", "max_tokens": 4})
        yield
    finally:
        print("stock server log tail:\n" + docker("logs", "--tail", "5", STOCK).stderr)
        docker("rm", "-f", STOCK)


def logs(container):
    out = docker("logs", container)
    return out.stdout + out.stderr


def test_the_unit_passes_the_pack_and_the_plugin_takes_the_table(servers):
    env = docker("exec", SPARK, "cat", "/etc/sparkops/sparkops-serve.env").stdout
    assert "SPARKOPS_PLE_FILE=/opt/sparkops/ple/ple.pack" in env
    mounts = json.loads(docker("inspect", "-f", "{{json .Mounts}}", SERVER).stdout)
    ple = [m for m in mounts if m["Destination"] == "/opt/sparkops/ple/ple.pack"]
    assert ple and ple[0]["RW"] is False
    log = logs(SERVER)
    assert "model.embed_tokens_per_layer.weight BF16 [512, 4096] (4194304 bytes) is read from /opt/sparkops/ple/ple.pack" in log
    assert "sparkops-ple" not in logs(STOCK).replace("sparkops-ple: resident model weights", "")


def test_the_image_label_is_the_plugin_digest_so_the_tag_follows_the_plugin(servers):
    """The digest of the plugin's files is a LABEL line of the Dockerfile, whose hash is the tag."""
    import hashlib  # pylint: disable=import-outside-toplevel

    base = os.path.join(PROJECT, "roles", "runtime_image", "files", "sparkops_vllm_ple")
    names = ["sparkops_vllm_ple/__init__.py", "sparkops_vllm_ple/pack.py", "sparkops_vllm_ple/models.py",
             "sparkops_vllm_ple-1.0.0.dist-info/METADATA", "sparkops_vllm_ple-1.0.0.dist-info/entry_points.txt",
             "sparkops_vllm_ple-1.0.0.dist-info/top_level.txt"]
    texts = []
    for name in names:
        with open(os.path.join(base, name), encoding="utf-8") as f:
            texts.append(f.read().rstrip())  # the file lookup strips trailing whitespace
    digest = hashlib.sha256("\n--file--\n".join(texts).encode("utf-8")).hexdigest()
    image = next(a for a in unit_docker_args() if a.startswith("sparkops/molecule-ple-runtime:"))
    label = docker("image", "inspect", "-f", '{{index .Config.Labels "io.sparkops.ple-plugin"}}', image).stdout.strip()
    assert label == digest
    dockerfile = docker("exec", SPARK, "cat", "/var/lib/sparkops/runtime-image/Dockerfile").stdout
    assert 'LABEL io.sparkops.ple-plugin="%s"' % digest in dockerfile


def test_the_image_records_the_nccl_and_vllm_it_ships(servers):
    """The runtime_image role reads NCCL and vLLM in the image it built (files/probe_versions.py) and
    labels the tagged image with them: the lab's CPU build ships no NCCL and vLLM 0.32.0. The probe is
    a LABEL of the Dockerfile (a changed probe, a new tag); the first build's stage tag is gone."""
    import hashlib  # pylint: disable=import-outside-toplevel

    image = next(a for a in unit_docker_args() if a.startswith("sparkops/molecule-ple-runtime:"))
    labels = json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}", image).stdout)
    assert labels["io.sparkops.nccl-version"] == "none" and labels["io.sparkops.vllm-version"] == "0.32.0", labels
    with open(os.path.join(PROJECT, "roles", "runtime_image", "files", "probe_versions.py"), "rb") as f:
        assert labels["io.sparkops.version-probe"] == hashlib.sha256(f.read()).hexdigest()
    tags = docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "sparkops/molecule-ple-runtime").stdout.split()
    assert image in tags and image + "-stage" not in tags, tags


def completions(port, temperature, seed=None):
    out = []
    for prompt in PROMPTS:
        body = {"model": "tiny-gemma4", "prompt": prompt, "max_tokens": 12, "temperature": temperature,
                "logprobs": 1, "ignore_eos": True}
        if seed is not None:
            body["seed"] = seed
        choice = request(port, body)["choices"][0]
        out.append((choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"]))
        assert healthy(port), "the engine died on %r (temperature %s)" % (prompt, temperature)
    return out


def test_same_prompts_same_tokens_with_and_without_the_pack(servers):
    plugin = completions(PLUGIN_PORT, 0.0)
    stock = completions(STOCK_PORT, 0.0)
    diffs = [abs(a - b) for (_tok_a, la), (_tok_b, lb) in zip(plugin, stock) for a, b in zip(la, lb)]
    print("greedy: tokens identical: %s; logprob max |diff| %.2e over %d tokens"
          % ([p[0] for p in plugin] == [s[0] for s in stock], max(diffs), len(diffs)))
    assert [p[0] for p in plugin] == [s[0] for s in stock]
    assert max(diffs) <= LOGPROB_TOL


def test_resident_weights_are_lower_by_the_table_bytes(servers):
    def resident(container):
        found = re.findall(r"sparkops-ple: resident model weights (\d+) bytes", logs(container))
        assert found, "no weight report in %s's log" % container
        return int(found[-1])

    index = json.loads(docker("exec", SPARK, "python3", "-c",
                              "import json,struct,sys;f=open(%r,'rb');n=struct.unpack('<8sIIQ',f.read(24))[3];"
                              "print(f.read(n).decode())" % PACK).stdout)
    table = index["ple_bytes"]
    with_pack, stock = resident(SERVER), resident(STOCK)
    print("resident weights: stock %d bytes, with the pack %d bytes, difference %d, PLE table %d (%.2f %%)"
          % (stock, with_pack, stock - with_pack, table, 100.0 * (stock - with_pack - table) / table))
    assert abs((stock - with_pack) - table) <= 0.01 * table


def pack_mapping(container):
    """(Rss kB, Anonymous kB) of the pack's mappings over the container's processes."""
    script = ("import glob,re\nrss=anon=0\n"
              "for p in glob.glob('/proc/[0-9]*/smaps'):\n"
              "  try: t=open(p).read()\n  except OSError: continue\n"
              "  for m in re.finditer(r'ple\\.pack\\n(.*?)(?=\\n[0-9a-f]+-[0-9a-f]+ |\\Z)', t, re.S):\n"
              "    rss+=int(re.search(r'^Rss:\\s+(\\d+)',m.group(1),re.M).group(1))\n"
              "    anon+=int(re.search(r'^Anonymous:\\s+(\\d+)',m.group(1),re.M).group(1))\n"
              "print(rss, anon)\n")
    out = docker("exec", container, "python3", "-c", script)
    assert out.returncode == 0, out.stderr
    rss, anon = map(int, out.stdout.split())
    return rss, anon


def meminfo(key):
    with open("/proc/meminfo", encoding="ascii") as f:
        return int(next(line.split()[1] for line in f if line.startswith(key + ":")))


def test_the_table_pages_are_page_cache_not_anonymous(servers):
    before_rss, before_anon = pack_mapping(SERVER)
    cached0, anon0 = meminfo("Cached"), meminfo("AnonPages")
    # New tokens touch new rows (8 KiB each): the mapped, resident part of the pack grows.
    request(PLUGIN_PORT, {"model": "tiny-gemma4", "prompt": " ".join(PROMPTS * 3), "max_tokens": 32})
    after_rss, after_anon = pack_mapping(SERVER)
    cached1, anon1 = meminfo("Cached"), meminfo("AnonPages")
    print("pack mapping in the server: Rss %d -> %d kB, Anonymous %d -> %d kB; host Cached %+d kB, AnonPages %+d kB "
          "(whole machine, shared)" % (before_rss, after_rss, before_anon, after_anon, cached1 - cached0, anon1 - anon0))
    assert after_rss > before_rss > 0
    assert before_anon == after_anon == 0


STALE_PLAY = """\
- name: Restart the server on a stale pack (the serve role only)
  hosts: sparks
  gather_facts: true
  tasks:
    - name: Stop the server
      ansible.builtin.systemd_service:
        name: sparkops-serve.service
        state: stopped
    - name: Plan its memory, as converge.yml does
      ansible.builtin.include_role:
        name: sparkops.appliance.memory_plan
      vars:
        memory_plan_checkpoint_dir: "{{ lab_gemma_dir }}"
        memory_plan_kv_bytes_per_token: null
        memory_plan_weight_bytes: null
    - name: Serve
      ansible.builtin.include_role:
        name: sparkops.appliance.serve
"""


def test_z_a_stale_pack_stops_the_start_naming_the_table(servers, tmp_path):
    """Last: the checkpoint's shard gets a new mtime (as if rewritten), the pack is now stale."""
    shard = MODEL + "/model.safetensors"
    mtime = docker("exec", SPARK, "stat", "-c", "%Y", shard).stdout.strip()
    image = next(a for a in unit_docker_args() if a.startswith("sparkops/molecule-ple-runtime:"))
    assert docker("exec", SPARK, "touch", "-d", "@%d" % (int(mtime) + 60), shard).returncode == 0
    try:
        (tmp_path / "stale.yml").write_text(STALE_PLAY)
        # the lab overrides are the scenario's playbook group_vars: the same beside this play
        (tmp_path / "group_vars").symlink_to(os.path.join(SCENARIO, "group_vars"))
        env = dict(os.environ, MOLECULE_PROJECT_DIRECTORY=PROJECT)
        t0 = time.monotonic()
        proc = subprocess.run(["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(tmp_path / "stale.yml"),
                               "-e", "serve_ple_file=" + PACK, "-e", "serve_image=" + image],
                              capture_output=True, text=True, env=env, cwd=PROJECT, timeout=1200, check=False)
        took = time.monotonic() - t0
        out = proc.stdout + proc.stderr
        # the play's failure quotes the plugin's refusal as vLLM's own message (vllm_status's cause)
        # (whitespace folded: a long message may be wrapped by the output callback)
        said = re.findall(r"vLLM says: \S*PackMismatchError: [^|]*?stale pack[^|]*?model\.embed_tokens_per_layer\.weight",
                          " ".join(out.split()))
        print("stale pack: play failed after %.0f s: %s" % (took, said[:1]))
        assert proc.returncode != 0, out[-3000:]
        assert said, out[-3000:]
    finally:
        docker("exec", SPARK, "touch", "-d", "@" + mtime, shard)
        docker("exec", SPARK, "systemctl", "stop", SVC)
