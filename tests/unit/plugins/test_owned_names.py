"""The collection's names on a host (docs/runtime.md, "What the collection owns on a host"): the
controller-side clashes (filter name_clashes), the host-side ownership spark_facts reads (claims),
and the record sparkops.appliance.files keeps."""
import glob
import json
import os
import re
import stat

import pytest
import yaml

from ansible_collections.sparkops.appliance.plugins.filter.name_clashes import name_clashes
from ansible_collections.sparkops.appliance.plugins.filter.serve_instances import serve_claims, serve_instances
from ansible_collections.sparkops.appliance.plugins.module_utils import _owned
from ansible_collections.sparkops.appliance.plugins.modules import files as files_module
from ansible_collections.sparkops.appliance.plugins.modules import spark_facts

from harness import ROOT, trusted
from harness import run_module


def unit(var, name, value=None):
    return {"var": var, "value": value or name, "kind": "unit", "name": name}


def serve_units(serve="sparkops-serve"):
    return [unit("spark_serve_unit_name", serve + suffix, serve)
            for suffix in (".service", "-recycle.service", "-recycle.timer")]


# --- controller-side: two of ours with one name, a name the system uses -----------------------

@pytest.mark.parametrize("claims, names", [
    # the two: one unit overwrote the other
    (serve_units("memwatch") + [unit("memwatch_unit_name", "memwatch.service")],
     ["spark_serve_unit_name", "memwatch_unit_name", "memwatch.service"]),
    (serve_units() + [unit("memwatch_unit_name", "sparkops-serve.service")],
     ["spark_serve_unit_name = sparkops-serve", "memwatch_unit_name = sparkops-serve.service"]),
    (serve_units() + [unit("memwatch_unit_name", "sparkops-serve-recycle.service")],
     ["spark_serve_unit_name", "memwatch_unit_name", "sparkops-serve-recycle.service"]),
    # a pair's head: the serve and Ray containers
    ([{"var": "spark_serve_container_name", "value": "x", "kind": "container", "name": "x"},
      {"var": "spark_ray_container_name", "value": "x", "kind": "container", "name": "x"}],
     ["spark_serve_container_name = x", "spark_ray_container_name = x", "the container x"]),
    # a file over another of ours, a file over a unit file, a folder that is a file of ours
    ([{"var": "memwatch_config_path", "value": "/etc/sparkops/m.json", "kind": "file", "name": "/etc/sparkops/m.json"},
      {"var": "serve_report_path", "value": "/etc/sparkops/m.json", "kind": "file", "name": "/etc/sparkops/m.json"}],
     ["memwatch_config_path", "serve_report_path", "/etc/sparkops/m.json"]),
    (serve_units() + [{"var": "memwatch_bin_path", "value": "/etc/systemd/system/sparkops-serve.service", "kind": "file",
                       "name": "/etc/systemd/system/sparkops-serve.service"}],
     ["spark_serve_unit_name", "memwatch_bin_path"]),
    ([{"var": "serve_cache_dir", "value": "/var/log/memwatch", "kind": "directory", "name": "/var/log/memwatch", "mode": "0755"},
      {"var": "memwatch_log_dir", "value": "/var/log/memwatch/", "kind": "directory", "name": "/var/log/memwatch/", "mode": "0750"}],
     ["serve_cache_dir", "memwatch_log_dir"]),
    # a unit name the system uses: journald, whatever is on the host
    ([unit("memwatch_unit_name", "systemd-journald.service")], ["memwatch_unit_name = systemd-journald.service", "systemd-"]),
    (serve_units("docker"), ["spark_serve_unit_name = docker", "docker"]),
    ([unit("spark_ray_unit_name", "ssh.service", "ssh")], ["spark_ray_unit_name = ssh"]),
])
def test_clashes_are_refused_naming_the_variables(claims, names):
    problems = name_clashes(claims)
    assert len(problems) >= 1
    for name in names:
        assert name in problems[0], (name, problems)
    assert "Fix:" in problems[0]


def test_distinct_names_and_a_shared_folder_pass():
    claims = serve_units() + [
        unit("memwatch_unit_name", "memwatch.service"),
        {"var": "spark_serve_container_name", "value": "sparkops-vllm", "kind": "container", "name": "sparkops-vllm"},
        {"var": "serve_config_dir", "value": "/etc/sparkops", "kind": "directory", "name": "/etc/sparkops", "mode": "0755"},
        {"var": "memwatch_config_path", "value": "/etc/sparkops/memwatch.json", "kind": "directory",
         "name": "/etc/sparkops", "mode": "0755"},
        {"var": "memwatch_config_path", "value": "/etc/sparkops/memwatch.json", "kind": "file", "name": "/etc/sparkops/memwatch.json"}]
    assert name_clashes(claims) == []


def test_the_preflight_claims_of_the_defaults_do_not_clash():
    """The defaults' names, as vars/main.yml builds them (Ansible's own templating), for a single
    Spark, a pair's head and its worker."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    data = yaml.safe_load(open(os.path.join(ROOT, "roles", "preflight", "vars", "main.yml")))
    common = yaml.safe_load(open(os.path.join(ROOT, "roles", "common", "defaults", "main.yml")))
    for role in ("", "head", "worker"):
        variables = trusted(dict(common, cluster_role=role, **{k: v for k, v in data.items() if k != "__preflight_name_clashes"}))
        templar = Templar(loader=DataLoader(), variables=variables)
        # the collection's own filters, as ansible-playbook finds them (this process has no collection loader)
        for name, function in {"serve_instances": serve_instances, "serve_claims": serve_claims}.items():
            templar.environment.filters["sparkops.appliance." + name] = function
        claims = templar.template(trust_as_template("{{ __preflight_claims }}"))
        claims = json.loads(json.dumps(claims))
        assert claims and name_clashes(claims) == []
        assert {c["kind"] for c in claims} == {"unit", "container", "file", "directory"}
        containers = [c["name"] for c in claims if c["kind"] == "container"]
        assert containers == {"": ["sparkops-vllm"], "head": ["sparkops-vllm", "sparkops-ray"], "worker": ["sparkops-ray"]}[role]
        assert all(c["name"].startswith("/") for c in claims if c["kind"] in ("file", "directory"))


def test_the_fallback_defaults_are_the_roles_defaults():
    """The first play does not load the other roles: vars/main.yml reads each option with its
    role's default. A default changed in a role must change there too."""
    text = open(os.path.join(ROOT, "roles", "preflight", "vars", "main.yml")).read()
    pairs = set(re.findall(r"(\w+) \| default\('([^']*)'\)", text))
    pairs = {(name, default) for name, default in pairs if name not in ("cluster_role",)}
    defaults = {}
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "defaults", "main.yml")):
        defaults.update(yaml.safe_load(open(path)) or {})
    assert len(pairs) >= 12
    for name, default in pairs:
        assert defaults[name] == default, name


def test_every_template_and_program_carries_a_mark():
    """A file written before the record is adopted by its mark: every file the roles render or
    install carries one (literally, not through a variable)."""
    sources = glob.glob(os.path.join(ROOT, "roles", "*", "templates", "*.j2")) + [
        os.path.join(ROOT, "roles", "memwatch", "files", "memwatch"),
        os.path.join(ROOT, "roles", "serve", "files", "serve-unit"),
        os.path.join(ROOT, "roles", "cluster", "files", "cluster-nodes.py")]
    assert len(sources) >= 12
    for path in sources:
        text = open(path).read()
        # without the simple substitutions; memwatch.json.j2 is one expression whose keys are literals
        literal = re.sub(r"\{\{[^{}]*\}\}|\{%[^{}]*%\}", "", text)
        assert any(mark in literal for mark in _owned.MARKS), path


# --- host-side: spark_facts' claims ------------------------------------------------------------

MEMINFO = "MemTotal:       127601232 kB\nMemAvailable:   98765432 kB\n"


def fake_program(directory, name, script):
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A stand-in host: systemctl and docker on PATH, a meminfo, a record."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir) + os.pathsep + os.environ["PATH"])
    (tmp_path / "meminfo").write_text(MEMINFO)
    return tmp_path


def foreign(host, claims, check=True):
    args = {"meminfo_path": str(host / "meminfo"), "check_gpu": False, "check_docker": False, "packages": [],
            "python_modules": [], "claims": claims, "owned_record": str(host / "owned.json")}
    result = run_module(spark_facts, args, check=check)
    assert not result.get("failed"), result
    return result["ansible_facts"]["spark_foreign"]


def path_claim(var, path, kind="file"):
    return {"var": var, "value": str(path), "kind": kind, "name": str(path)}


def test_files_and_folders_someone_else_has_are_refused(host):
    (host / "sysctl.d").mkdir()
    distro = host / "sysctl.d" / "10-distro.conf"
    distro.write_text("net.ipv4.conf.all.rp_filter = 2\n")
    marked = host / "sysctl.d" / "90-sparkops.conf"
    marked.write_text("#\n# Ansible managed\n#\n# Unified-memory serving host (sparkops.appliance host_tuning).\n")
    recorded = host / "sysctl.d" / "80-plain.conf"
    recorded.write_text("vm.swappiness = 1\n")
    (host / "owned.json").write_text(_owned.record_text({str(recorded)}))
    link = host / "sysctl.d" / "99-sysctl.conf"
    link.symlink_to("../sysctl.conf")
    (host / "log").mkdir()
    (host / "memwatch-logs").mkdir()
    problems = foreign(host, [
        path_claim("host_tuning_sysctl_file", distro), path_claim("a_marked", marked), path_claim("a_recorded", recorded),
        path_claim("a_link", link), path_claim("a_missing", host / "nothing-there"),
        path_claim("memwatch_log_dir", host / "log", "directory"), path_claim("a_named_dir", host / "memwatch-logs", "directory"),
        path_claim("a_dir_as_file", host / "log"), path_claim("a_file_as_dir", distro, "directory")])
    said = " ".join(problems)
    assert len(problems) == 5, problems
    for name in ("host_tuning_sysctl_file", "a_link", "memwatch_log_dir", "a_dir_as_file", "a_file_as_dir"):
        assert name + " = " in said
    assert "host_tuning_sysctl_file = %s: the file %s is someone else's" % (distro, distro) in said
    assert "symbolic link to ../sysctl.conf" in said and "Fix: choose another" in said
    for name in ("a_marked", "a_recorded", "a_missing", "a_named_dir"):
        assert name not in said


SYSTEMCTL = r"""[ "$1" = show ] || exit 2
shift 2
for u in "$@"; do
  # as systemd: a template without an instance fails the whole call
  case "$u" in *@.*) echo "Failed to get properties: Unit name $u is missing the instance name." >&2; exit 1 ;; esac
done
for u in "$@"; do
  case "$u" in
    --) continue ;;
    journald.service) printf 'Id=journald.service\nLoadState=loaded\nFragmentPath=/lib/systemd/system/journald.service\n\n' ;;
    masked.service) printf 'Id=masked.service\nLoadState=masked\nFragmentPath=/etc/systemd/system/masked.service\n\n' ;;
    alias.service) printf 'Id=real.service\nLoadState=loaded\nFragmentPath=/lib/systemd/system/real.service\n\n' ;;
    *) printf 'Id=%s\nLoadState=not-found\nFragmentPath=\n\n' "$u" ;;
  esac
done
"""


def test_units_systemd_loads_from_elsewhere_are_refused(host):
    fake_program(host / "bin", "systemctl", SYSTEMCTL)
    problems = foreign(host, [unit("memwatch_unit_name", n) for n in
                              ("journald.service", "masked.service", "alias.service", "free.service")])
    said = " ".join(problems)
    assert len(problems) == 3, problems
    assert "loads it from /lib/systemd/system/journald.service" in said
    assert "masked" in said and "alias of real.service" in said and "free.service" not in said


def test_a_template_unit_among_the_claims_does_not_blind_the_others(host):
    """One `systemctl show` for every claimed unit: a template name in it (name@.service) failed the
    whole call, and every unit claim then passed unchecked (a unit the system ships was written over)."""
    fake_program(host / "bin", "systemctl", SYSTEMCTL)
    problems = foreign(host, [unit("memwatch_unit_name", n) for n in ("journald.service", "sparkops-serve-agent@.service")])
    assert len(problems) == 1 and "loads it from /lib/systemd/system/journald.service" in problems[0], problems


DOCKER = r"""[ "$1" = ps ] || exit 2
printf 'ours\timg:1\trunning\tsparkops-serve\n'
printf 'other-host\timg:1\trunning\tsparkops-serve\n'
printf 'foreign,a/link\tdebian:12\texited\t\n'
"""


def container(name, unit_file):
    return {"var": "spark_serve_container_name", "value": name, "kind": "container", "name": name,
            "label": "sparkops-serve", "unit_file": str(unit_file)}


def test_containers_the_collection_did_not_start_here_are_refused(host):
    fake_program(host / "bin", "docker", DOCKER)
    unit_file = host / "sparkops-serve.service"
    unit_file.write_text("ExecStart=/usr/bin/docker run --rm --name ours --label io.sparkops.unit=sparkops-serve img:1\n")
    problems = foreign(host, [container(n, unit_file) for n in ("ours", "other-host", "foreign", "nothing")])
    said = " ".join(problems)
    assert len(problems) == 2, problems
    assert "spark_serve_container_name = foreign:" in said and "image debian:12, exited" in said
    assert "lacks the label io.sparkops.unit=sparkops-serve" in said and "docker rm -f foreign" in said
    assert "spark_serve_container_name = other-host:" in said and "does not run it" in said
    # no unit file of ours on this host: a labelled container is still another's
    problems = foreign(host, [container("ours", host / "no-such.service")])
    assert len(problems) == 1 and "does not run it" in problems[0]


def test_without_docker_or_systemd_nothing_is_refused_and_check_mode_writes_nothing(host):
    """A fresh host: no engine, no systemd, nothing there yet."""
    fake_program(host / "bin", "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1\n")
    fake_program(host / "bin", "systemctl", "echo 'System has not been booted with systemd' >&2; exit 1\n")
    before = sorted(os.listdir(host))
    claims = [container("x", host / "x.service"), unit("memwatch_unit_name", "memwatch.service"),
              path_claim("memwatch_bin_path", host / "bin" / "memwatch")]
    assert foreign(host, claims, check=True) == []
    assert sorted(os.listdir(host)) == before


# --- the record sparkops.appliance.files keeps --------------------------------------------------

def test_files_records_what_it_writes_and_check_mode_records_nothing(tmp_path):
    record = tmp_path / "state" / "owned.json"
    entries = [{"path": str(tmp_path / "d"), "state": "directory", "mode": "0755"},
               {"path": str(tmp_path / "d" / "f"), "content": "x\n", "mode": "0644"},
               {"path": str(tmp_path / "shared"), "state": "directory", "mode": "0755", "owner": "", "group": ""}]
    args = {"files": entries, "record": str(record)}
    result = run_module(files_module, args, check=True)
    assert result["changed"] is True and not record.exists()
    result = run_module(files_module, args)
    assert result["changed"] is True
    assert json.loads(record.read_text())["paths"] == [str(tmp_path / "d"), str(tmp_path / "d" / "f")]
    stamp = record.stat().st_mtime_ns
    again = run_module(files_module, args)
    assert again["changed"] is False and record.stat().st_mtime_ns == stamp   # nothing new: not rewritten
    # a later call adds its paths, keeps the others
    run_module(files_module, {"files": [{"path": str(tmp_path / "d" / "g"), "content": "y\n", "mode": "0644"}],
                              "record": str(record)})
    assert json.loads(record.read_text())["paths"] == [str(tmp_path / "d"), str(tmp_path / "d" / "f"), str(tmp_path / "d" / "g")]
    assert [n for n in os.listdir(record.parent) if n.startswith(".")] == []   # no temp file left
    # and spark_facts takes them as the collection's
    assert _owned.path_owner(str(tmp_path / "d" / "g"), "file", _owned.read_record(str(record))) == ""
