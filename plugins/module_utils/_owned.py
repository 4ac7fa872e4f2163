# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the collection owns on a host, and the names it would take there. Private helper of the
sparkops.appliance.name_clashes filter (controller-side) and of sparkops.appliance.spark_facts
(host-side), and of sparkops.appliance.files, which keeps the ownership record.

A claim is one name the collection would write or run on a host, with the variable it comes from:

    {"var": "memwatch_unit_name", "value": "memwatch.service", "kind": "unit", "name": "memwatch.service"}
    {"var": "spark_serve_container_name", "value": "sparkops-vllm", "kind": "container",
     "name": "sparkops-vllm", "label": "sparkops-serve", "unit_file": "/etc/systemd/system/sparkops-serve.service"}
    {"var": "host_tuning_sysctl_file", "value": "/etc/sysctl.d/90-sparkops.conf", "kind": "file",
     "name": "/etc/sysctl.d/90-sparkops.conf"}
    {"var": "memwatch_state_dir", "value": "/var/lib/memwatch", "kind": "directory", "name": "/var/lib/memwatch", "mode": "0750"}

Ownership on the host (docs/runtime.md, "What the collection owns on a host"):
- a path is ours when the record (RECORD, written by sparkops.appliance.files on every real write)
  lists it; a file from before the record when its first bytes carry one of MARKS; a directory
  from before the record when a part of its path names sparkops or memwatch;
- a unit is ours when systemd loads it (or would) from /etc/systemd/system/<name> and that file
  is ours; masked, an alias, or loaded from anywhere else is not;
- a container is ours when it carries the label io.sparkops.unit=<unit> AND this host's unit file
  (ours) runs it by that name (--name): a labelled container that another host's unit runs (one
  engine shared by several hosts, as in the lab) is not.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re

RECORD = "/var/lib/sparkops/owned.json"
UNIT_DIR = "/etc/systemd/system"
LABEL = "io.sparkops.unit"

# Text only the collection's templates and programs write: a file that existed before the record
# is adopted when its first HEAD_BYTES hold one of these (tests/unit checks every template has one).
# memwatch's configuration and serve's plan-vs-actual report are JSON: a key only they have.
MARKS = ("sparkops", "memwatch", "Drained recycle of ", "# Environment of the vLLM container (",
         "# Environment of the Ray ", '"available_and_free_available_lt_gib"', '"docker_memory_gib"')
HEAD_BYTES = 16384
# A directory from before the record: one part of its path holds one of these.
DIR_MARKS = ("sparkops", "memwatch")

# Unit names that are the system's own (systemd, the distribution, Docker, NVIDIA's services):
# refused outright, whatever is on the host now (a unit of that name in /etc/systemd/system would
# shadow the one the system ships, or the one a later package installs).
RESERVED_UNIT_PREFIXES = (
    "systemd-", "dbus", "ssh", "docker", "containerd", "getty", "serial-getty", "console-getty",
    "container-getty", "autovt", "user@", "user-runtime-dir", "init.", "-.", "nvidia", "cron",
    "rsyslog", "polkit", "networking", "NetworkManager", "wpa_supplicant", "snapd", "apt-",
    "unattended-upgrades", "kmod", "udev", "emergency", "rescue", "reboot", "poweroff", "halt",
    "kexec", "shutdown", "initrd", "cloud-", "multi-user", "graphical", "basic.", "sysinit",
    "default.", "local-fs", "remote-fs", "network", "sockets.", "timers.", "paths.", "slices.",
    "system.", "machine.", "user.", "logrotate", "man-db", "fstrim", "e2scrub", "dpkg",
)

_UNIT_KINDS = ("unit",)
_PATH_KINDS = ("file", "directory")


def unit_file(name):
    """The path the collection writes unit `name` to."""
    return UNIT_DIR + "/" + name


def reserved_unit(name):
    """The reserved prefix `name` starts with, or ""."""
    for prefix in RESERVED_UNIT_PREFIXES:
        if name.startswith(prefix):
            return prefix
    return ""


def _show(value):
    return json.dumps(value) if not isinstance(value, str) else value


def _who(claim):
    return "%s = %s" % (claim["var"], _show(claim["value"]))


def name_clashes(claims):
    """Messages for two claims that take the same name (a unit, a container, a path), and for a
    unit name that is the system's own. Controller-side: reads nothing on a host."""
    problems = []
    seen = {}
    for claim in claims:
        kind = claim["kind"]
        name = claim["name"]
        if kind in _UNIT_KINDS:
            prefix = reserved_unit(name)
            if prefix:
                problems.append(
                    "%s: the unit %s has a name the system uses (%s*): a unit the collection writes there "
                    "would shadow or be shadowed by the host's own. Fix: choose a name of your own for %s."
                    % (_who(claim), name, prefix, claim["var"]))
        keys = [("container", name)] if kind == "container" else [("unit", name)] if kind in _UNIT_KINDS else []
        # every unit is also a file in /etc/systemd/system; paths compare without a trailing /
        if kind in _UNIT_KINDS:
            keys.append(("path", unit_file(name)))
        elif kind in _PATH_KINDS:
            keys.append(("path", name.rstrip("/") or "/"))
        for key in keys:
            other = seen.get(key)
            if other is None:
                seen[key] = claim
                continue
            if (other["var"] == claim["var"] and other["value"] == claim["value"] and other["name"] == claim["name"]
                    and other["kind"] == claim["kind"]):
                continue   # one value claiming one name twice (e.g. the same folder from two roles)
            if kind == "directory" and other["kind"] == "directory" and other.get("mode", "") == claim.get("mode", ""):
                continue   # a folder shared by two roles, with the same mode
            what = {"container": "the container", "unit": "the unit"}.get(key[0], "the path")
            same_var = other["var"] == claim["var"]
            fix = ("give %s its own value" % (claim["var"] if same_var else "%s or %s" % (other["var"], claim["var"]))
                   if not (same_var and claim["var"] == "spark_models") else "rename one of the two models")
            problems.append("%s and %s both take %s %s: one would overwrite or remove the other. Fix: %s."
                            % (_who(other), _who(claim), what, key[1], fix))
            break
    return problems


def read_record(path):
    """The set of paths the record lists; an empty set when there is none or it cannot be read."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (IOError, OSError, ValueError):
        return set()
    paths = data.get("paths") if isinstance(data, dict) else None
    return set(p for p in paths if isinstance(p, str)) if isinstance(paths, list) else set()


def record_text(paths):
    """The record's text for a set of paths."""
    return json.dumps({"written_by": "sparkops.appliance", "paths": sorted(paths)}, indent=1) + "\n"


def _head(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(HEAD_BYTES).decode("utf-8", "replace")
    except (IOError, OSError):
        return None


def path_owner(path, kind, record):
    """"" when the path is ours or free; else what it is, as words for a message."""
    if not os.path.lexists(path) or path in record:
        return ""
    if os.path.islink(path):
        return "a symbolic link to %s that the collection did not make" % os.readlink(path)
    if kind == "directory":
        if not os.path.isdir(path):
            return "a file, not a folder, that the collection did not write"
        if any(mark in part for part in path.split("/") for mark in DIR_MARKS):
            return ""
        return "an existing folder that the collection did not create"
    if os.path.isdir(path):
        return "a folder, not a file"
    head = _head(path)
    if head is not None and any(mark in head for mark in MARKS):
        return ""
    return "a file that the collection did not write (no sparkops mark, not in its record %s)" % RECORD


def unit_owner(claim, props, record):
    """"" when the unit is ours or free; else what owns it. props: its `systemctl show` properties
    (Id, LoadState, FragmentPath), {} when systemd could not be asked."""
    name = claim["name"]
    path = unit_file(name)
    load = props.get("LoadState", "")
    fragment = props.get("FragmentPath", "")
    if load == "masked":
        return "systemd has it masked (%s is a link to /dev/null)" % (fragment or path)
    if props.get("Id") and props["Id"] != name:
        return "systemd knows it as an alias of %s" % props["Id"]
    if fragment and fragment != path:
        return "systemd loads it from %s, a unit file the collection did not write" % fragment
    owner = path_owner(path, "file", record)
    return ("its file %s is %s" % (path, owner)) if owner else ""


def container_owner(claim, container, unit_text):
    """"" when the container is ours or there is none; else what it is. container: {"image",
    "state", "label"} as the engine lists it, None when there is none; unit_text: the text of
    claim's unit file, None when it does not exist."""
    if container is None:
        return ""
    runs_it = unit_text is not None and re.search(
        r"--name[= ]['\"]?%s['\"]?(\s|$)" % re.escape(claim["name"]), unit_text, re.M) is not None
    if container.get("label") == claim["label"] and runs_it:
        return ""
    if container.get("label") == claim["label"]:
        why = ("it carries the label %s=%s, but this host's %s does not run it (another host's, on a "
               "Docker engine they share?)" % (LABEL, claim["label"], claim["unit_file"]))
    else:
        why = "it lacks the label %s=%s" % (LABEL, claim["label"])
    return ("a container (image %s, %s) that the collection did not start here: %s"
            % (container.get("image") or "?", container.get("state") or "?", why))


def foreign_message(claim, owner):
    """The refusal for one claim and what owns its name."""
    kind = claim["kind"]
    if kind == "container":
        fix = ("choose another %s, or, if it is a leftover, remove that container by hand (docker rm -f %s)"
               % (claim["var"], claim["name"]))
        what = "the container %s" % claim["name"]
        effect = "its unit removes a container of that name before each start (docker rm -f)"
    elif kind in _UNIT_KINDS:
        fix = ("choose another %s, or, if it is a leftover of ours, remove %s by hand and run systemctl daemon-reload"
               % (claim["var"], unit_file(claim["name"])))
        what = "the unit %s" % claim["name"]
        effect = "the collection would write %s over it" % unit_file(claim["name"])
    else:
        fix = ("choose another %s, or, if it is a leftover of ours, remove %s by hand"
               % (claim["var"], claim["name"]))
        what = "the %s %s" % ("folder" if kind == "directory" else "file", claim["name"])
        effect = "the collection would %s it" % ("take over" if kind == "directory" else "replace")
    return ("%s: %s is someone else's: %s; %s. Fix: %s."
            % (_who(claim), what, owner, effect, fix))
