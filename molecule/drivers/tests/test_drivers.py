"""The drivers role on a lab Spark: real apt and dpkg against a local repository of stand-in packages
with NVIDIA's names and versions, and the lab Spark's own Docker engine (dockerd under systemd,
vfs, no iptables, no bridge). The tests run in file order: each starts from the state the previous
one left and says which."""
import json
import os
import subprocess

import testinfra.utils.ansible_runner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
SCENARIO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("all")

DAEMON_JSON = "/etc/docker/daemon.json"
TOOLKIT = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools", "libnvidia-container1")
DRIVER = "nvidia-driver-580-open"
# What prepare gave the engine: the keys the merge must keep.
LAB_SETTINGS = {"storage-driver": "vfs", "iptables": False, "bridge": "none", "log-level": "warn"}
NVIDIA = {"path": "nvidia-container-runtime", "args": []}


class Run(object):
    """One ansible-playbook run of converge.yml (the role), read from the JSON callback."""

    def __init__(self, *extra):
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
                   ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_PIPELINING="1")
        cmd = ["ansible-playbook", "-i", INVENTORY, os.path.join(SCENARIO, "converge.yml")] + list(extra)
        proc = subprocess.run(cmd, env=env, cwd=PROJECT, capture_output=True, text=True, timeout=600, check=False)
        self.rc = proc.returncode
        out = json.loads(proc.stdout)
        self.stats = list(out["stats"].values())[0]
        self.tasks = {}
        for task in out["plays"][0]["tasks"]:
            for result in task["hosts"].values():
                self.tasks[task["task"]["name"].split(" : ", 1)[-1]] = result
        self.messages = "\n".join(self._messages())

    def _messages(self):
        for result in self.tasks.values():
            for item in [result] + result.get("results", []):
                for key in ("msg", "diff"):
                    if item.get(key):
                        yield json.dumps(item[key]) if not isinstance(item[key], str) else item[key]

    def ran(self, name):
        result = self.tasks.get(name)
        return result is not None and not result.get("skipped")

    def __repr__(self):
        return "rc=%s stats=%s\n%s" % (self.rc, self.stats, self.messages[-3000:])


def versions(host):
    out = host.check_output("dpkg-query -W -f '${Package}=${Version}\\n' %s %s" % (DRIVER, " ".join(TOOLKIT)))
    return dict(line.split("=", 1) for line in out.splitlines())


def selections(host):
    """dpkg's selection of each pinned package: "hold" once the role held it."""
    out = host.check_output("dpkg --get-selections %s %s" % (DRIVER, " ".join(TOOLKIT)))
    return dict(line.split() for line in out.splitlines())


HELD = dict({DRIVER: "hold"}, **{name: "hold" for name in TOOLKIT})


def held_items(run, task="Hold the pinned packages where they are"):
    """The loop labels of a holds task that changed something: the packages it (would have) held or released."""
    return sorted(r["_ansible_item_label"] for r in run.tasks[task].get("results", []) if r.get("changed"))


def engine_start(host):
    """The engine process and its start time (clock ticks since boot): changes exactly when it restarts."""
    pid = host.check_output("systemctl show -p MainPID --value docker.service").strip()
    assert pid not in ("", "0"), "docker.service has no main process"
    stat = host.check_output("cat /proc/%s/stat" % pid)
    return pid, stat.rsplit(")", 1)[1].split()[19]


def daemon_json(host):
    return json.loads(host.file(DAEMON_JSON).content_string)


def spark_started_at():
    """When the lab Spark container itself started (a reboot would restart it)."""
    return subprocess.run(["docker", "inspect", "-f", "{{.State.StartedAt}}", "sparkops-molecule-drivers"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_converge_installed_the_pins_not_the_newest(host):
    assert versions(host) == dict({DRIVER: "580.65.06-0ubuntu1"}, **{name: "1.18.0-1" for name in TOOLKIT})
    # The repository offers newer ones: the pins, not apt's candidates, decided.
    assert "Candidate: 1.18.1-1" in host.check_output("apt-cache policy nvidia-container-toolkit")
    assert "Candidate: 580.95.05-0ubuntu1" in host.check_output("apt-cache policy %s" % DRIVER)


def test_converge_held_every_pinned_package(host):
    assert selections(host) == HELD


def test_apt_upgrade_leaves_the_held_pins_where_they_are(host):
    # The repository holds newer stand-ins of every pinned package (580.95.05, 1.18.1-1): apt's candidates.
    host.run_expect([0], "apt-get update -q")
    upgrade = host.run_expect([0], "DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q")
    assert "kept back" in upgrade.stdout and DRIVER in upgrade.stdout, upgrade.stdout
    assert versions(host) == dict({DRIVER: "580.65.06-0ubuntu1"}, **{name: "1.18.0-1" for name in TOOLKIT})
    assert selections(host) == HELD


def test_daemon_json_has_the_runtime_and_every_other_key(host):
    assert daemon_json(host) == dict(LAB_SETTINGS, runtimes={"nvidia": NVIDIA})
    runtimes = json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))
    assert runtimes["nvidia"]["path"] == "nvidia-container-runtime"


def test_second_run_reinstalled_nothing_and_kept_the_engine_running(host):
    # converge.yml recorded the engine and dpkg's log before each run: the last one is the idempotence
    # step's second run (which Molecule already checked reported no change).
    before = json.loads(host.file("/var/lib/sparkops-lab-before-converge.json").content_string)
    assert int(host.check_output("wc -c < /var/log/dpkg.log")) == before["dpkg_log_bytes"]
    assert list(engine_start(host)) == before["engine"]


def test_check_mode_shows_the_daemon_json_diff_and_changes_nothing(host):
    host.run_expect([0], "printf '%%s\\n' '%s' > %s" % (json.dumps(LAB_SETTINGS), DAEMON_JSON))
    before, engine, started = host.file(DAEMON_JSON).content_string, engine_start(host), spark_started_at()
    # With a driver change and the reboot allowed as well: the reboot task is reached, not run.
    run = Run("--check", "--diff", "-e", '{"drivers_driver_version": "580.95.05-0ubuntu1", "drivers_reboot_allowed": true}')
    assert run.rc == 0, run
    assert run.ran("Reboot for the new driver (drivers_reboot_allowed)"), run
    assert spark_started_at() == started
    assert versions(host)[DRIVER] == "580.65.06-0ubuntu1"
    # The release the move needs is reported, not made: the driver stays held.
    assert held_items(run, "Release the holds of the pinned packages about to move (or of all, with holds off)") == [DRIVER], run
    assert selections(host) == HELD
    diff = run.tasks["Register the NVIDIA runtime in daemon.json"]["diff"]
    assert json.loads(diff["after"]) == dict(LAB_SETTINGS, runtimes={"nvidia": NVIDIA})
    assert diff["before"] == before
    assert host.file(DAEMON_JSON).content_string == before
    assert engine_start(host) == engine


def test_a_daemon_json_change_restarts_the_engine_once(host):
    # From the previous test: daemon.json without the runtime.
    engine = engine_start(host)
    run = Run()
    assert run.rc == 0 and run.tasks["Register the NVIDIA runtime in daemon.json"]["changed"], run
    assert daemon_json(host) == dict(LAB_SETTINGS, runtimes={"nvidia": NVIDIA})
    assert engine_start(host) != engine
    assert "nvidia" in json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))


def test_a_broken_daemon_json_is_refused_and_left_untouched(host):
    broken = '{"storage-driver": "vfs", "runtimes": {'
    host.run_expect([0], "printf '%%s' '%s' > %s" % (broken, DAEMON_JSON))
    engine = engine_start(host)
    run = Run()
    assert run.rc != 0, run
    message = run.tasks["Register the NVIDIA runtime in daemon.json"]["msg"]
    assert "%s is not valid JSON" % DAEMON_JSON in message and "left untouched" in message
    assert host.file(DAEMON_JSON).content_string == broken
    assert engine_start(host) == engine
    host.run_expect([0], "printf '%%s\\n' '%s' > %s" % (json.dumps(dict(LAB_SETTINGS, runtimes={"nvidia": NVIDIA})), DAEMON_JSON))


def test_a_newer_toolkit_is_left_alone_unless_forced(host):
    # Moved past the pins by hand, through the holds (apt drops a hold it was allowed to change).
    host.run_expect([0], "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-change-held-packages %s"
                    % " ".join(n + "=1.18.1-1" for n in TOOLKIT))
    assert {name: selections(host)[name] for name in TOOLKIT} == {name: "install" for name in TOOLKIT}
    run = Run()
    assert run.rc == 0 and not run.tasks["Install the pinned container toolkit"].get("changed"), run
    assert "nvidia-container-toolkit 1.18.1-1 is installed, newer than the pin 1.18.0-1: left alone" in run.messages
    assert {name: versions(host)[name] for name in TOOLKIT} == {name: "1.18.1-1" for name in TOOLKIT}
    assert held_items(run) == sorted(name + " 1.18.1-1" for name in TOOLKIT), run     # held where they are
    assert selections(host) == HELD
    run = Run()
    assert run.rc == 0 and run.stats["changed"] == 0, run

    run = Run("-e", '{"drivers_force": true}')
    assert run.rc == 0 and run.tasks["Install the pinned container toolkit"]["changed"], run
    assert {name: versions(host)[name] for name in TOOLKIT} == {name: "1.18.0-1" for name in TOOLKIT}
    assert "reboot required" not in run.messages          # only the toolkit moved
    assert held_items(run) == sorted(name + " 1.18.0-1" for name in TOOLKIT), run
    assert selections(host) == HELD


def test_a_driver_change_reports_reboot_required_and_does_not_reboot(host):
    started = spark_started_at()
    run = Run("-e", '{"drivers_driver_version": "580.95.05-0ubuntu1"}')
    assert run.rc == 0, run
    assert versions(host)[DRIVER] == "580.95.05-0ubuntu1"
    assert "reboot required: the NVIDIA driver changed" in run.messages
    assert "580.65.06-0ubuntu1 -> 580.95.05-0ubuntu1" in run.messages
    assert not run.ran("Reboot for the new driver (drivers_reboot_allowed)")
    assert spark_started_at() == started
    # The pin moved through its hold: released, installed, held again (the run summary lists both).
    assert held_items(run, "Release the holds of the pinned packages about to move (or of all, with holds off)") == [DRIVER], run
    assert held_items(run) == [DRIVER + " 580.95.05-0ubuntu1"], run
    assert selections(host) == HELD
    # ... and a later apt upgrade leaves the new pin where it is, and the toolkit at its pin (1.18.1-1 is a candidate).
    host.run_expect([0], "DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q")
    assert versions(host) == dict({DRIVER: "580.95.05-0ubuntu1"}, **{name: "1.18.0-1" for name in TOOLKIT})


def test_with_holds_off_the_holds_are_released_and_come_back_when_on(host):
    run = Run("-e", '{"drivers_hold_packages": false}')
    assert run.rc == 0, run
    assert selections(host) == {name: "install" for name in HELD}
    run = Run("-e", '{"drivers_hold_packages": false}')
    assert run.rc == 0 and run.stats["changed"] == 0, run
    run = Run("-e", '{"drivers_driver_version": "580.95.05-0ubuntu1"}')
    assert run.rc == 0 and held_items(run) == sorted([DRIVER + " 580.95.05-0ubuntu1"] + [n + " 1.18.0-1" for n in TOOLKIT]), run
    assert selections(host) == HELD


def test_without_a_gpu_by_default_nothing_is_managed(host):
    # drivers_manage back to its default (spark_expect_gpu, false in the lab), as site.yml runs it in
    # the production scenario.
    engine = engine_start(host)
    run = Run("-e", '{"drivers_manage": "{{ spark_expect_gpu }}"}')
    assert run.rc == 0 and run.stats["changed"] == 0, run
    assert "GPU stack (driver, container toolkit, Docker's NVIDIA runtime) is not managed" in run.messages
    assert not run.ran("Read the installed versions of the pinned packages and the Docker engines")
    assert engine_start(host) == engine
