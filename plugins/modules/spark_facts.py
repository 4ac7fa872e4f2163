#!/usr/bin/python
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: spark_facts
short_description: Facts about a DGX Spark that the memory plan and preflight need
version_added: 0.1.0
description:
  - Reads C(/proc/meminfo) (on a DGX Spark C(nvidia-smi) reports memory as N/A, so unified
    memory must be read from the kernel), the machine architecture, free disk under the model
    directory, whether C(nvidia-smi) lists a GPU, and whether a Docker engine answers.
  - Also reads what C(sparkops.appliance.host_tuning) would otherwise ask for in three calls of
    its own (the active swap lines of C(/etc/fstab), the C(sysctl.d) files that carry its marker,
    the files of the jemalloc package), so that a re-converge pays one connection for all of it.
  - With O(claims), tells for each unit, container, file and folder the collection would write or
    run on this host whether something that is not the collection's already has that name
    (C(spark_foreign) in RV(ansible_facts)), so that preflight refuses it before anything changes. See
    C(docs/runtime.md), "What the collection owns on a host".
  - Changes nothing on the host.
extends_documentation_fragment:
  - sparkops.appliance.read_only
author:
  - sparkops contributors (@sparkops)
options:
  meminfo_path:
    description: File to read meminfo from. Tests and the lab may point it at a prepared file.
    type: path
    default: /proc/meminfo
  disk_path:
    description:
      - Directory whose filesystem's free space is reported (the model directory). When it does
        not exist yet, its nearest existing parent is measured.
    type: path
    default: /
  check_gpu:
    description: Run C(nvidia-smi -L) and report the GPUs it lists.
    type: bool
    default: true
  nvidia_smi:
    description: The nvidia-smi program.
    type: str
    default: nvidia-smi
  driver_version_path:
    description:
      - The file that gives the loaded NVIDIA kernel module's version (C(580.95.05)); none loaded (no
        file) reports an empty version. Tests and the lab may point it at a prepared file.
    type: path
    default: /sys/module/nvidia/version
  kernel_release_path:
    description: The file that gives the running kernel's release (C(uname -r)). Tests may point it at a prepared file.
    type: path
    default: /proc/sys/kernel/osrelease
  check_docker:
    description: Ask the Docker engine for its version with the docker CLI.
    type: bool
    default: true
  docker_bin:
    description: The docker CLI program.
    type: str
    default: docker
  python_modules:
    description:
      - Python modules to try to import with the interpreter Ansible runs modules with (the
        Docker modules need C(requests)). A role that would install a missing one reads the
        answer instead of paying a round trip of its own.
    type: list
    elements: str
    default: [requests]
  packages:
    description:
      - Debian packages whose installed files to list (C(dpkg-query -L)); one that is not installed,
        or a host without C(dpkg-query), lists none. The host_tuning role reads the jemalloc
        package's list from here instead of running C(dpkg-query) itself.
    type: list
    elements: str
    default: [libjemalloc2]
  fstab_path:
    description: The fstab whose active swap lines are reported. Tests may point it at a prepared file.
    type: path
    default: /etc/fstab
  sysctl_dir:
    description: The directory searched for C(*.conf) files that carry I(sysctl_marker).
    type: path
    default: /etc/sysctl.d
  sysctl_marker:
    description:
      - A line that marks a sysctl.d file as written by the host_tuning role (its template's second
        line). A file counts when one of its lines starts with this text.
    type: str
    default: "# Unified-memory serving host (sparkops.appliance host_tuning)"
  claims:
    description:
      - The names the collection would take on this host, each with the variable it comes from
        (the preflight role builds them). Each is checked against what the host has; none is
        checked when the list is empty.
    type: list
    elements: dict
    default: []
    suboptions:
      var:
        description: The variable the name comes from (named in the refusal).
        type: str
        required: true
      value:
        description: Its value, as the refusal shows it.
        type: str
        required: true
      kind:
        description: What the name is.
        type: str
        required: true
        choices: [unit, container, file, directory]
      name:
        description: The unit's full name (C(memwatch.service)), the container's name, or the absolute path.
        type: str
        required: true
      label:
        description: For a container, the value of its C(io.sparkops.unit) label when the collection started it.
        type: str
        default: ""
      unit_file:
        description: For a container, the unit file that runs it (C(docker run --name NAME)) when the collection started it.
        type: str
        default: ""
      mode:
        description: For a folder, the mode the collection gives it (compared controller-side only).
        type: str
        default: ""
  owned_record:
    description:
      - The record of the paths the collection wrote (M(sparkops.appliance.files) keeps it). A path
        listed there is the collection's.
    type: path
    default: /var/lib/sparkops/owned.json
attributes:
  facts:
    description: Sets the C(spark_*) facts.
    support: full
notes:
  - All sizes in GiB are binary (2^30 bytes), as the memory plan uses them.
"""

EXAMPLES = r"""
- name: Gather Spark facts
  sparkops.appliance.spark_facts:
    disk_path: /srv/sparkops/models
    check_gpu: "{{ spark_expect_gpu }}"

- name: Show MemTotal
  ansible.builtin.debug:
    msg: "MemTotal is {{ ansible_facts.spark_mem_total_gib }} GiB"
"""

RETURN = r"""
ansible_facts:
  description: Facts set on the host.
  returned: always
  type: dict
  contains:
    spark_mem_total_gib:
      description: MemTotal in GiB (unrounded).
      type: float
      sample: 121.69
    spark_mem_available_gib:
      description: MemAvailable in GiB.
      type: float
    spark_swap_total_gib:
      description: SwapTotal in GiB.
      type: float
    spark_arch:
      description: Machine architecture (C(aarch64) on a Spark).
      type: str
      sample: aarch64
    spark_disk:
      description: Free and total space of the filesystem holding I(disk_path).
      type: dict
      sample: {path: /srv/sparkops/models, measured_path: /srv, free_gib: 812.4, total_gib: 915.8}
    spark_gpu:
      description: What nvidia-smi reported (C(checked) false when I(check_gpu=false)).
      type: dict
      sample: {checked: true, present: true, names: ["GPU 0: NVIDIA GB10 (UUID: GPU-...)"], error: ""}
    spark_driver_version:
      description:
        - The loaded NVIDIA driver's version, from O(driver_version_path); empty when no driver is loaded.
          Read without the GPU, for preflight's known-bad check.
      type: str
      sample: "580.95.05"
    spark_kernel_release:
      description: The running kernel's release, from O(kernel_release_path).
      type: str
      sample: "6.17.0-1032-nvidia"
    spark_docker:
      description:
        - Whether a Docker engine answered, its version, and the names of the container runtimes it
          lists (C(docker info); C(nvidia) once the NVIDIA Container Toolkit is registered).
      type: dict
      sample: {checked: true, reachable: true, server_version: "28.3.0", runtimes: [nvidia, runc], error: ""}
    spark_python:
      description:
        - The interpreter that runs modules, and for each of O(python_modules) whether it imports.
      type: dict
      sample: {executable: /usr/bin/python3, modules: {requests: true}}
    spark_package_files:
      description: For each of O(packages), the files C(dpkg-query -L) lists (empty when it is not installed).
      type: dict
      sample: {libjemalloc2: [/usr/lib/aarch64-linux-gnu/libjemalloc.so.2]}
    spark_fstab_swap:
      description:
        - The lines of O(fstab_path) that mount swap and are not commented out (empty when the file
          does not exist).
      type: list
      elements: str
      sample: ["/swap.img none swap sw 0 0"]
    spark_sysctl_marked:
      description: The C(*.conf) files of O(sysctl_dir) that carry O(sysctl_marker), sorted.
      type: list
      elements: str
      sample: [/etc/sysctl.d/90-sparkops.conf]
    spark_foreign:
      description:
        - One refusal per claim of O(claims) whose name something else already has on this host,
          naming the variable, the value, what has the name and the fix. Empty when all are free
          or the collection's.
        - Units are asked of systemd (C(systemctl show); where systemd does not answer, the file in
          C(/etc/systemd/system) is still checked), containers of the Docker engine (C(docker ps -a);
          skipped where no engine answers, as a host without Docker has no container to collide with).
      type: list
      elements: str
      sample: ["memwatch_unit_name = fstrim.service: the unit fstrim.service is someone else's: ..."]
"""

import glob
import json
import os
import platform
import re
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.appliance.plugins.module_utils._disk import filesystem_space
from ansible_collections.sparkops.appliance.plugins.module_utils._meminfo import (
    GIB,
    meminfo_gib,
    parse_meminfo,
)
from ansible_collections.sparkops.appliance.plugins.module_utils._owned import (
    LABEL,
    RECORD,
    container_owner,
    foreign_message,
    path_owner,
    read_record,
    unit_owner,
)


def _disk(path):
    free, total, measured = filesystem_space(path)
    return {"path": path, "measured_path": measured, "free_gib": free / GIB, "total_gib": total / GIB}


def _run_tool(module, program, args):
    """Run `program args`; return (stdout, "") or (None, why it could not tell)."""
    binary = module.get_bin_path(program)
    if binary is None:
        return None, "%s not found on PATH" % program
    rc, out, err = module.run_command([binary] + args)
    if rc != 0:
        return None, (err or out).strip() or "%s %s exited %d" % (program, " ".join(args), rc)
    return out, ""


def _gpu(module, check, program):
    result = {"checked": check, "present": False, "names": [], "error": ""}
    if not check:
        return result
    out, result["error"] = _run_tool(module, program, ["-L"])
    if out is None:
        return result
    result["names"] = [line.strip() for line in out.splitlines() if line.strip().startswith("GPU ")]
    result["present"] = bool(result["names"])
    if not result["present"]:
        result["error"] = "%s -L listed no GPU" % program
    return result


def _first_line(path):
    """The first line of a file, stripped; "" when it cannot be read."""
    text = _read_text(path)
    return text.strip().splitlines()[0].strip() if text and text.strip() else ""


def _docker(module, check, program):
    result = {"checked": check, "reachable": False, "server_version": "", "runtimes": [], "error": ""}
    if not check:
        return result
    out, result["error"] = _run_tool(module, program, ["version", "--format", "{{.Server.Version}}"])
    if out is None:
        return result
    result["reachable"] = True
    result["server_version"] = out.strip()
    out, result["error"] = _run_tool(module, program, ["info", "--format", "{{json .Runtimes}}"])
    if out is not None:
        try:
            runtimes = json.loads(out)
        except ValueError:
            runtimes = None
        if isinstance(runtimes, dict):
            result["runtimes"] = sorted(runtimes)
        else:
            result["error"] = "docker info listed no runtimes (it printed %r)" % out.strip()[:200]
    return result


def _python(names):
    modules = {}
    for name in names:
        # Any failure counts (not only ImportError): a module that imports it would fail the same way.
        try:
            __import__(name)
        except Exception:  # pylint: disable=broad-except
            modules[name] = False
        else:
            modules[name] = True
    return {"executable": sys.executable, "modules": modules}


# An fstab line that mounts swap and is not a comment: device, mount point, type "swap". The
# host_tuning role comments out exactly these (its replace task's regexp).
_SWAP_LINE = re.compile(r"^\s*[^#\s]\S*\s+\S+\s+swap\s")


def _package_files(module, names):
    binary = module.get_bin_path("dpkg-query")
    files = {}
    for name in names:
        files[name] = []
        if binary is not None:
            rc, out, _err = module.run_command([binary, "-L", name])
            if rc == 0:
                files[name] = [line for line in out.splitlines() if line.startswith("/")]
    return files


def _fstab_swap(path):
    try:
        with open(path) as handle:
            return [line.rstrip("\n") for line in handle if _SWAP_LINE.match(line)]
    except (IOError, OSError):
        return []


def _sysctl_marked(directory, marker):
    marked = []
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), "*.conf"))):
        try:
            with open(path, errors="replace") as handle:
                if any(line.startswith(marker) for line in handle):
                    marked.append(path)
        except (IOError, OSError):
            continue
    return marked


_UNIT_PROPERTIES = ("Id", "LoadState", "FragmentPath")


def _unit_props(module, names):
    """{unit: {property: value}} from one `systemctl show`; {} when systemd cannot be asked."""
    systemctl = module.get_bin_path("systemctl")
    # a template without an instance (name@.service) has no properties to show, and one such name
    # fails the whole call: those are left to their files
    names = [name for name in names if "@." not in name]
    if not names or systemctl is None:
        return {}
    rc, out, _err = module.run_command([systemctl, "show", "--property=" + ",".join(_UNIT_PROPERTIES), "--"] + names)
    if rc != 0:
        return {}
    blocks = [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
              for block in out.strip().split("\n\n")]
    return dict(zip(names, blocks)) if len(blocks) == len(names) else {}


def _containers(module, program):
    """{name: {image, state, label}} of every container on the engine; None when no engine answers."""
    out, _error = _run_tool(module, program, ["ps", "--all", "--no-trunc", "--format",
                                              '{{.Names}}\t{{.Image}}\t{{.State}}\t{{.Label "%s"}}' % LABEL])
    if out is None:
        return None
    listing = {}
    for line in out.splitlines():
        fields = line.split("\t")
        if len(fields) != 4:
            continue
        for name in fields[0].split(","):
            listing[name.strip().lstrip("/")] = {"image": fields[1], "state": fields[2], "label": fields[3]}
    return listing


def _read_text(path):
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def _foreign(module, claims, record_path, docker_bin):
    """The refusals for the claims whose names are someone else's on this host."""
    if not claims:
        return []
    record = read_record(record_path)
    units = [c["name"] for c in claims if c["kind"] == "unit"]
    props = _unit_props(module, units)
    listing = None
    if any(c["kind"] == "container" for c in claims):
        listing = _containers(module, docker_bin)
    problems = []
    for claim in claims:
        if claim["kind"] == "unit":
            owner = unit_owner(claim, props.get(claim["name"], {}), record)
        elif claim["kind"] == "container":
            if listing is None:
                continue
            container = listing.get(claim["name"])
            unit_text = _read_text(claim["unit_file"]) if container is not None and claim["unit_file"] else None
            owner = container_owner(claim, container, unit_text)
        else:
            owner = path_owner(claim["name"], claim["kind"], record)
        if owner:
            problems.append(foreign_message(claim, owner))
    return problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            meminfo_path=dict(type="path", default="/proc/meminfo"),
            disk_path=dict(type="path", default="/"),
            check_gpu=dict(type="bool", default=True),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            driver_version_path=dict(type="path", default="/sys/module/nvidia/version"),
            kernel_release_path=dict(type="path", default="/proc/sys/kernel/osrelease"),
            check_docker=dict(type="bool", default=True),
            docker_bin=dict(type="str", default="docker"),
            python_modules=dict(type="list", elements="str", default=["requests"]),
            packages=dict(type="list", elements="str", default=["libjemalloc2"]),
            fstab_path=dict(type="path", default="/etc/fstab"),
            sysctl_dir=dict(type="path", default="/etc/sysctl.d"),
            sysctl_marker=dict(type="str", default="# Unified-memory serving host (sparkops.appliance host_tuning)"),
            claims=dict(type="list", elements="dict", default=[], options=dict(
                var=dict(type="str", required=True),
                value=dict(type="str", required=True),
                kind=dict(type="str", required=True, choices=["unit", "container", "file", "directory"]),
                name=dict(type="str", required=True),
                label=dict(type="str", default=""),
                unit_file=dict(type="str", default=""),
                mode=dict(type="str", default=""),
            )),
            owned_record=dict(type="path", default=RECORD),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not p["sysctl_marker"].strip():
        module.fail_json(msg="sysctl_marker is empty: every sysctl.d file would count as host_tuning's. Give its marker line.")
    try:
        with open(p["meminfo_path"]) as handle:
            fields = parse_meminfo(handle.read())
        mem_total = meminfo_gib(fields, "MemTotal")
        mem_available = meminfo_gib(fields, "MemAvailable")
    except (IOError, OSError, ValueError, KeyError) as exc:
        module.fail_json(msg="cannot read memory from %s: %s" % (p["meminfo_path"], exc))
    facts = {
        "spark_mem_total_gib": mem_total,
        "spark_mem_available_gib": mem_available,
        "spark_swap_total_gib": fields.get("SwapTotal", 0) / GIB,
        "spark_arch": platform.machine(),
        "spark_disk": _disk(p["disk_path"]),
        "spark_gpu": _gpu(module, p["check_gpu"], p["nvidia_smi"]),
        "spark_driver_version": _first_line(p["driver_version_path"]),
        "spark_kernel_release": _first_line(p["kernel_release_path"]),
        "spark_docker": _docker(module, p["check_docker"], p["docker_bin"]),
        "spark_python": _python(p["python_modules"]),
        "spark_package_files": _package_files(module, p["packages"]),
        "spark_fstab_swap": _fstab_swap(p["fstab_path"]),
        "spark_sysctl_marked": _sysctl_marked(p["sysctl_dir"], p["sysctl_marker"]),
        "spark_foreign": _foreign(module, p["claims"], p["owned_record"], p["docker_bin"]),
    }
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
