#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
---
module: checkpoint_verify
short_description: Verify a model checkpoint directory against a manifest of sizes and sha256 sums
version_added: "0.1.0"
description:
  - Checks every file listed in the manifest of a checkpoint directory for its size and sha256,
    hashing the files in parallel threads (one per file, up to the CPU count).
  - Fails naming each file that is missing, has the wrong size or the wrong sha256, with the
    expected and actual values.
  - After a successful full verification it writes a fingerprint (sizes, mtimes and the manifest
    digest). A later run that finds the same fingerprint does not hash again unless I(reverify)
    is set.
  - With I(create), a directory that has no manifest yet (for example a fresh Hugging Face
    snapshot) gets one built from its files.
  - With I(expected) (what the source says the checkpoint holds, for example the Hugging Face
    Hub's own sha256 of each LFS file and the size of every file), a manifest is built only from
    the listed files and only when every one matches; otherwise the module fails naming each file
    with the expected and actual values, and writes nothing. An existing manifest is compared
    with I(expected) too.
options:
  path:
    description: The checkpoint directory.
    type: path
    required: true
  manifest:
    description: The manifest file. Default C(<path>/.sparkops-manifest.json).
    type: path
  fingerprint:
    description: The fingerprint file. Default C(<path>/.sparkops-fingerprint.json).
    type: path
  create:
    description: Build and write the manifest from the directory's files when it does not exist.
    type: bool
    default: false
  revision:
    description:
      - The revision the checkpoint must be at. Written into a manifest this module creates; when
        set, a manifest naming another revision fails the verification.
      - An existing manifest that names no revision is accepted at this one, and the full verification
        records it in the manifest (I(revision_recorded)); the quick check only reads.
    type: str
  expected:
    description:
      - The files the source lists, each C(path) (relative POSIX), C(size) (bytes) and C(sha256)
        (64 hex digits, or null where the source gives only the size). Files of the directory
        that are not listed are not accepted into a manifest built here (they are reported as
        I(extra_files)).
    type: list
    elements: dict
  reverify:
    description: Hash every file even when the fingerprint says the directory is unchanged.
    type: bool
    default: false
  quick:
    description:
      - Only compare the fingerprint (no hashing, no writes, never fails on a mismatch). Returns
        C(verified=true) when the fingerprint matches. Used to skip fetching a complete checkpoint.
    type: bool
    default: false
  workers:
    description: Hashing threads. C(0) picks min(number of files, usable CPUs).
    type: int
    default: 0
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details: Verification (read-only) runs in check mode too; the manifest and fingerprint are not written.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: full
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Verify the checkpoint (hashes only when the fingerprint changed)
  sparkops.appliance.checkpoint_verify:
    path: /srv/sparkops/models/my-model

- name: Write the manifest of a fresh snapshot, then verify against it
  sparkops.appliance.checkpoint_verify:
    path: /srv/sparkops/models/my-model
    create: true
    revision: 0123456789abcdef0123456789abcdef01234567

- name: Accept a fresh snapshot only if it matches the source's own sizes and sha256
  sparkops.appliance.checkpoint_verify:
    path: /srv/sparkops/models/my-model
    create: true
    expected:
      - {path: config.json, size: 1234, sha256: null}
      - {path: model.safetensors, size: 4000000000, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}

- name: Force a full re-hash
  sparkops.appliance.checkpoint_verify:
    path: /srv/sparkops/models/my-model
    reverify: true
"""

RETURN = r"""
verified:
  description: Whether the directory matches its manifest.
  returned: always
  type: bool
hashed:
  description: Whether the files were hashed in this run (false when the fingerprint matched).
  returned: always
  type: bool
manifest_created:
  description: Whether the manifest was built in this run.
  returned: always
  type: bool
files:
  description: Number of files in the manifest.
  returned: always
  type: int
total_bytes:
  description: Sum of the manifest's file sizes (the checkpoint's weight bytes).
  returned: always
  type: int
extra_files:
  description: Files in the directory that the manifest does not list (reported, not removed).
  returned: always
  type: list
  elements: str
seconds:
  description: Time spent hashing.
  returned: always
  type: float
bytes_per_second:
  description: Hashing throughput of this run (0 when nothing was hashed).
  returned: always
  type: float
workers:
  description: Hashing threads used.
  returned: always
  type: int
revision:
  description: The revision the directory's manifest names (null when it names none or there is no manifest).
  returned: always
  type: str
revision_recorded:
  description: Whether the verification wrote I(revision) into a manifest that named none.
  returned: when the copy was verified
  type: bool
manifest_found:
  description: Whether the directory holds a manifest (a copy accepted once, complete or since changed).
  returned: always
  type: bool
problems:
  description: The mismatches found (path, what, expected, actual); the module fails when not empty.
  returned: on failure
  type: list
  elements: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.appliance.plugins.module_utils._checkpoint import (
    CheckpointError, FINGERPRINT_NAME, MANIFEST_NAME, auto_workers, build_checked_manifest, build_manifest,
    compare_with_expected, describe_problems, dump_fingerprint, dump_manifest, fingerprint, list_files, manifest_digest,
    parse_manifest, read_text, total_bytes, validate_expected, verify_tree)
from ansible_collections.sparkops.appliance.plugins.module_utils._files import write_text


def run(module):
    p = module.params
    root = p["path"]
    manifest_path = p["manifest"] or os.path.join(root, MANIFEST_NAME)
    fp_path = p["fingerprint"] or os.path.join(root, FINGERPRINT_NAME)
    result = dict(changed=False, verified=False, hashed=False, manifest_created=False, files=0,
                  total_bytes=0, extra_files=[], seconds=0.0, bytes_per_second=0.0, workers=0, revision=None,
                  manifest_found=False)
    if not os.path.isdir(root):
        if p["quick"]:
            return result
        raise CheckpointError("checkpoint directory %s does not exist" % root)

    manifest_text = read_text(manifest_path)
    manifest_before = manifest_text or ""
    fp_before = read_text(fp_path) or ""
    started = time.monotonic()
    hashed_bytes = [0]

    def count(n):
        hashed_bytes[0] += n

    expected = validate_expected(p["expected"]) if p["expected"] is not None else None
    if manifest_text is None:
        if p["quick"]:
            return result
        if not p["create"]:
            raise CheckpointError("no manifest at %s (set create to build one from the files)" % manifest_path)
        if expected is None:
            manifest = build_manifest(root, p["workers"], p["revision"], on_bytes=count)
        else:
            manifest, problems = build_checked_manifest(root, expected, p["workers"], p["revision"], on_bytes=count)
            if problems:
                result["problems"] = [dict(path=r, what=w, expected=e, actual=a) for r, w, e, a in problems]
                module.fail_json(msg="checkpoint %s does not match what its source lists (sizes, and the sha256 "
                                     "of every file the source hashes): %s. Nothing was accepted into the manifest. "
                                     "Remove the bad file(s) and run again to fetch them anew." % (
                                         root, describe_problems(root, problems)), **result)
        manifest_text = dump_manifest(manifest)
        result["manifest_created"] = True
        result["hashed"] = True
        problems = []
    else:
        manifest = parse_manifest(manifest_text, manifest_path)
        result["manifest_found"] = True
        result["revision"] = manifest.get("revision")
        if p["revision"] and manifest.get("revision") and manifest["revision"] != p["revision"]:
            if p["quick"]:
                return result
            raise CheckpointError("%s is for revision %s, not the requested %s" % (
                manifest_path, manifest["revision"], p["revision"]))
        problems = None
        if expected is not None and not p["quick"]:
            mismatch = compare_with_expected(manifest, expected)
            if mismatch:
                raise CheckpointError("%s disagrees with what the checkpoint's source lists: %s. Remove the "
                                      "manifest and the bad file(s) and run again." % (
                                          manifest_path, describe_problems(root, mismatch)))

    result["files"] = len(manifest["files"])
    result["total_bytes"] = total_bytes(manifest)
    result["workers"] = auto_workers(len(manifest["files"]), p["workers"])
    listed = set(e["path"] for e in manifest["files"])
    result["extra_files"] = [r for r in list_files(root) if r not in listed]

    fp_now = fingerprint(root, manifest)
    fp_text = dump_fingerprint(fp_now) if fp_now is not None else ""
    unchanged = bool(fp_before) and fp_before == fp_text and not result["manifest_created"]

    if p["quick"]:
        result["verified"] = unchanged
        return result

    if problems is None:
        if unchanged and not p["reverify"]:
            problems = []
        else:
            problems = verify_tree(root, manifest, p["workers"], on_bytes=count)
            result["hashed"] = True
    result["seconds"] = round(time.monotonic() - started, 3)
    if result["hashed"] and result["seconds"] > 0:
        result["bytes_per_second"] = round(hashed_bytes[0] / result["seconds"], 1)

    if problems:
        result["problems"] = [dict(path=r, what=w, expected=e, actual=a) for r, w, e, a in problems]
        module.fail_json(msg="checkpoint %s does not match %s: %s. Remove the bad file(s) and run "
                             "again to fetch them anew." % (root, manifest_path, describe_problems(root, problems)),
                         **result)

    result["verified"] = True
    # mtimes of a fresh fingerprint (taken after hashing: nothing may have changed meanwhile)
    fp_after = fingerprint(root, manifest)
    if fp_after != fp_now:
        module.fail_json(msg="files under %s changed while they were verified; run again" % root, **result)
    # A manifest that names no revision (a source that publishes none, a copy fetched before
    # checkpoint_revision was pinned) records the one this copy is accepted at, so that a later run can
    # tell a new revision from it (the role stages a copy whose revision it cannot tell).
    stamped = bool(p["revision"]) and not manifest.get("revision") and not result["manifest_created"]
    if stamped:
        manifest["revision"] = p["revision"]
        manifest_text = dump_manifest(manifest)
        fp_text = dump_fingerprint(dict(fp_after, manifest_sha256=manifest_digest(manifest)))  # the files as just read
        result["revision"] = p["revision"]
    result["revision_recorded"] = stamped
    result["changed"] = fp_text != fp_before or result["manifest_created"] or stamped
    result["diff"] = {
        "before": {"manifest": manifest_before, "fingerprint": fp_before},
        "after": {"manifest": manifest_text, "fingerprint": fp_text},
    }
    if result["changed"] and not module.check_mode:
        if result["manifest_created"] or stamped:
            write_text(module, manifest_path, manifest_text)
        write_text(module, fp_path, fp_text)
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            manifest=dict(type="path"),
            fingerprint=dict(type="path"),
            create=dict(type="bool", default=False),
            expected=dict(type="list", elements="dict"),
            revision=dict(type="str"),
            reverify=dict(type="bool", default=False),
            quick=dict(type="bool", default=False),
            workers=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except CheckpointError as e:
        module.fail_json(msg=str(e))
    except (IOError, OSError) as e:
        module.fail_json(msg="checkpoint %s: %s" % (module.params["path"], e))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
