# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: files
short_description: Put several directories and small text files in place in one module call
description:
  - Brings a list of directories and text files to the given state in one call on the host. Each
    directory exists with its owner, group and mode; each file holds exactly O(files[].content)
    with its owner, group and mode. Entries are handled in the order given (list a directory
    before the files in it).
  - A role that writes a dozen small files (units, scripts, configuration) pays one connection
    round trip for all of them instead of one or two per file, which is what a re-converge that
    changes nothing mostly spends its time on. Render templates on the controller with
    C(lookup('ansible.builtin.template', ...)) and static files with C(lookup('ansible.builtin.file', ...)).
  - A file that differs is written to a temporary file in its own directory, given its owner,
    group and mode, checked with O(files[].validate) when set, and renamed over the old one
    (C(module.atomic_move)). A reader sees the old or the new file, never half of one; a file
    that fails validation leaves the old one in place and fails the task naming the file.
  - Nothing is written in check mode; the result tells what would change.
  - Outside check mode, every file and folder of O(files) (but a folder whose owner or group is left
    as it is, which is shared) is added to the ownership record O(record), so that preflight
    knows them as the collection's on the next run (C(docs/runtime.md), "What the collection owns
    on a host"). The record is bookkeeping, not a change; writing it does not make the task changed.
version_added: 0.1.0
author:
  - sparkops contributors (@sparkops)
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: full
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
options:
  files:
    description: The directories and files, in order.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path of the directory or file.
        type: path
        required: true
      state:
        description:
          - C(directory), C(file), or C(absent) (a file, link or whole folder the collection made, removed,
            and dropped from the ownership record).
        type: str
        choices: [directory, file, absent]
        default: file
      content:
        description: The whole text of the file (UTF-8). Required for O(files[].state=file).
        type: str
      mode:
        description: Permissions, as an octal string such as C("0644"). Required but for O(files[].state=absent).
        type: str
      owner:
        description: Owner name; C("") leaves an existing path's owner as it is.
        type: str
        default: root
      group:
        description: Group name; C("") leaves an existing path's group as it is.
        type: str
        default: root
      validate:
        description:
          - A command run on the new file before it replaces the old one; C(%s) stands for the
            temporary file's path. A non-zero exit fails the task and leaves the old file.
        type: str
  read:
    description:
      - Small text files to read back in the same call, before any entry of O(files) is handled,
        into RV(contents) (also in check mode). A role that needs a file's current text, such as
        the state it wrote on the last run, saves the round trip of a separate
        M(ansible.builtin.slurp).
    type: list
    elements: path
    default: []
  units:
    description:
      - systemd units whose state to report in RV(units), read only (also in check mode), with one
        C(systemctl show) after the files are handled. A role that writes a unit here and then
        enables and starts it skips its M(ansible.builtin.systemd_service) call when nothing
        changed and the unit is already as wanted (filter C(sparkops.appliance.unit_as_wanted)), so
        a re-converge that changes nothing saves that round trip.
      - A host without a running systemd reports no units (RV(units) is empty), so the role runs
        its M(ansible.builtin.systemd_service) call as it would without this option.
    type: list
    elements: str
    default: []
  record:
    description:
      - The ownership record (JSON, the paths the collection wrote), written whole through a
        temporary file and a rename, only when it lacks one of this call's paths. C("") keeps no record.
    type: path
    default: /var/lib/sparkops/owned.json
"""

EXAMPLES = r"""
- name: Write the unit and its helper (one call)
  sparkops.appliance.files:
    files:
      - path: /usr/local/libexec/sparkops
        state: directory
        mode: "0755"
      - path: /usr/local/libexec/sparkops/helper
        content: "{{ lookup('ansible.builtin.file', 'helper') }}"
        mode: "0755"
      - path: /etc/systemd/system/example.service
        content: "{{ lookup('ansible.builtin.template', 'example.service.j2') }}"
        mode: "0644"
        validate: systemd-analyze verify %s
  register: written
  notify: Restart example
"""

RETURN = r"""
changed_paths:
  description: The paths that were (or, in check mode, would be) created or changed, in order.
  returned: always
  type: list
  elements: str
  sample: [/etc/systemd/system/example.service]
contents:
  description: The text of each path of O(read) (UTF-8), as it was before this call; null for a path that does not exist.
  returned: always
  type: dict
  sample: {"/var/lib/example/state.json": "{\"current\": \"abc\"}\n", "/run/example/memo": null}
units:
  description:
    - The state of each unit of O(units) as systemd reports it (its properties C(LoadState),
      C(ActiveState), C(UnitFileState) and C(NeedDaemonReload)); empty when systemd cannot be
      asked. A unit systemd does not know has C(LoadState=not-found).
  returned: always
  type: dict
  sample: {"memwatch.service": {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled", "NeedDaemonReload": "no"}}
"""

import errno
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native

from ansible_collections.sparkops.appliance.plugins.module_utils._files import add_to_record, drop_from_record, write_bytes
from ansible_collections.sparkops.appliance.plugins.module_utils._owned import RECORD


def _read(path, missing_only=False):
    """The bytes of path; None when it cannot be read (with missing_only: only when it does not
    exist, any other error is raised)."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (IOError, OSError) as exc:
        if missing_only and exc.errno != errno.ENOENT:
            raise
        return None


def _attributes(module, entry, path):
    return module.load_file_common_arguments({"path": path, "mode": entry["mode"], "owner": entry["owner"] or None,
                                              "group": entry["group"] or None})


def _directory(module, entry, diffs):
    path = entry["path"]
    changed = False
    if not os.path.isdir(path):
        if os.path.lexists(path):
            module.fail_json(msg="%s: not a directory (files[].state=directory); remove or move it first" % path)
        changed = True
        diffs.append({"before_header": path, "after_header": path, "before": "absent\n", "after": "directory\n"})
        if module.check_mode:
            return True
        os.makedirs(path)
    diff = {"before_header": path, "after_header": path}
    changed = module.set_fs_attributes_if_different(_attributes(module, entry, path), changed, diff=diff) or changed
    if diff.get("before") or diff.get("after"):
        diffs.append(diff)
    return changed


def _file(module, entry, diffs):
    path = entry["path"]
    if os.path.isdir(path):
        module.fail_json(msg="%s: is a directory, not a file; remove or move it first" % path)
    wanted = to_bytes(entry["content"], errors="surrogate_or_strict")
    current = _read(path)
    if current == wanted:
        diff = {"before_header": path, "after_header": path}
        changed = module.set_fs_attributes_if_different(_attributes(module, entry, path), False, diff=diff)
        if changed:
            diffs.append(diff)
        return changed
    diffs.append({"before_header": path, "after_header": path,
                  "before": "" if current is None else to_native(current, errors="surrogate_or_replace"),
                  "after": to_native(wanted, errors="surrogate_or_replace")})
    if module.check_mode:
        return True
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        module.fail_json(msg="%s: its directory %s does not exist (list it before the file, state=directory)" % (path, directory))

    def before_move(tmp):
        # the temp file gets the entry's owner, group and mode, which the rename keeps
        # (keep_dest_attrs=False): a replaced 0600 file is never readable by others, not even briefly
        module.set_fs_attributes_if_different(_attributes(module, entry, tmp), True)
        if entry["validate"]:
            rc, out, err = module.run_command(entry["validate"] % tmp)
            if rc != 0:
                module.fail_json(msg="%s: the new content fails validation (%s), the old file is kept: %s"
                                 % (path, entry["validate"], (err or out).strip()[-2000:]), rc=rc)

    write_bytes(module, path, wanted, mode=None, before_move=before_move, keep_dest_attrs=False)
    # a file atomic_move creates is left 0600 (write_bytes): set the entry's mode again.
    module.set_fs_attributes_if_different(_attributes(module, entry, path), True)
    return True


def _absent(module, entry, diffs):
    path = entry["path"]
    if not os.path.lexists(path):
        return False
    folder = os.path.isdir(path) and not os.path.islink(path)
    diffs.append({"before_header": path, "after_header": path, "before": "directory\n" if folder else "file\n",
                  "after": "absent\n"})
    if module.check_mode:
        return True
    try:
        if folder:
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except (IOError, OSError) as exc:
        module.fail_json(msg="%s: cannot remove it: %s" % (path, to_native(exc)))
    return True


UNIT_PROPERTIES = ("Id", "LoadState", "ActiveState", "UnitFileState", "NeedDaemonReload")


def unit_states(module, units):
    """{unit: {property: value}} from one `systemctl show`; {} when systemd cannot be asked."""
    systemctl = module.get_bin_path("systemctl")
    if not units or not systemctl:
        return {}
    rc, out, _err = module.run_command([systemctl, "show", "--property=" + ",".join(UNIT_PROPERTIES), "--"] + list(units))
    if rc != 0:
        return {}
    # One block per unit, in the order asked, separated by an empty line.
    blocks = [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
              for block in out.strip().split("\n\n")]
    if len(blocks) != len(units):
        return {}
    return dict((unit, dict((k, v) for k, v in block.items() if k != "Id")) for unit, block in zip(units, blocks))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            files=dict(type="list", elements="dict", required=True, options=dict(
                path=dict(type="path", required=True),
                state=dict(type="str", choices=["directory", "file", "absent"], default="file"),
                content=dict(type="str"),
                mode=dict(type="str"),
                owner=dict(type="str", default="root"),
                group=dict(type="str", default="root"),
                validate=dict(type="str"),
            )),
            read=dict(type="list", elements="path", default=[]),
            units=dict(type="list", elements="str", default=[]),
            record=dict(type="path", default=RECORD),
        ),
        supports_check_mode=True,
    )
    # Every entry's inputs are checked before any path is touched.
    for entry in module.params["files"]:
        if not os.path.isabs(entry["path"]):
            module.fail_json(msg="files[].path must be absolute: %s" % entry["path"])
        if entry["state"] != "absent" and not entry["mode"]:
            module.fail_json(msg="%s: files[].mode is required for a %s" % (entry["path"], entry["state"]))
        if entry["state"] == "file" and entry["content"] is None:
            module.fail_json(msg="%s: files[].content is required for a file (state=file)" % entry["path"])
        if entry["validate"] and "%s" not in entry["validate"]:
            module.fail_json(msg="%s: files[].validate must contain %%s (the new file's path): %s" % (entry["path"], entry["validate"]))
    contents = {}
    for path in module.params["read"]:
        try:
            data = _read(path, missing_only=True)
        except (IOError, OSError) as exc:
            module.fail_json(msg="read: cannot read %s: %s" % (path, to_native(exc)))
        contents[path] = None if data is None else to_native(data, errors="surrogate_or_strict")
    changed_paths = []
    diffs = []
    for entry in module.params["files"]:
        handler = {"directory": _directory, "absent": _absent}.get(entry["state"], _file)
        if handler(module, entry, diffs):
            changed_paths.append(entry["path"])
    if module.params["record"] and not module.check_mode:
        owned = [entry["path"] for entry in module.params["files"]
                 if entry["state"] == "file" or (entry["state"] == "directory" and entry["owner"] and entry["group"])]
        gone = [entry["path"] for entry in module.params["files"] if entry["state"] == "absent"]
        try:
            add_to_record(module, module.params["record"], owned)
            if gone:
                drop_from_record(module, module.params["record"], gone)
        except (IOError, OSError) as exc:
            module.warn("cannot write the ownership record %s: %s" % (module.params["record"], to_native(exc)))
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths, diff=diffs, contents=contents,
                     units=unit_states(module, module.params["units"]))


if __name__ == "__main__":
    main()
