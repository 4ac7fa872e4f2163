#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
---
module: checkpoint_fetch
short_description: Fetch a model checkpoint from an HTTP(S) base URL or a local/NFS path, resumably
version_added: "0.1.0"
description:
  - Reads the source's manifest (relative path, size, sha256 of every file), checks the free disk
    space first, then transfers each missing file into C(<file>.part) and renames it into place
    only when its size and sha256 match the manifest.
  - An interrupted transfer resumes from the C(.part) file (HTTP C(Range) requests; a seek for a
    path source); the bytes already held are hashed from the local disk, not transferred again.
    Connection drops are retried I(retries) times within one run.
  - A path source without a manifest gets one built from its files (the source is not modified);
    the manifest is written into I(dest) either way.
  - Progress (bytes done / total) is written to I(progress_file) while the transfer runs, so a
    play that starts this module with C(async) can show it.
  - A file already present is kept only when it is known to hold the manifest's sha256, that is when I(dest)'s
    last verification (its manifest and the fingerprint of M(sparkops.appliance.checkpoint_verify))
    vouches for it, or it has the manifest's size and is hashed here and found equal. A file of the
    right size with other bytes is fetched anew, never kept for its size alone. The full sha256
    verification of the directory stays the job of M(sparkops.appliance.checkpoint_verify).
  - With I(reuse_from) (the copy being served, when I(dest) is a staging directory beside it), a file
    whose size and sha256 in I(reuse_from)'s manifest equal the new manifest's, and whose bytes there
    are vouched for by its last verification or hashed and found equal, is hard-linked into I(dest)
    (copied where the file system refuses a link) instead of being transferred. Nothing under
    I(reuse_from) is written.
  - With I(state=space) only the free-space check runs, for I(expected_bytes).
  - With I(state=prepare) (for a transfer done by another tool, huggingface_hub or rsync) nothing is
    transferred; the files of I(dest) that are not those I(expected) lists (longer, or of the listed
    size and another sha256) are removed, a manifest of another revision or content is removed with
    its fingerprint, and the files I(reuse_from) holds are linked in as above.
options:
  src:
    description:
      - An C(http://) or C(https://) base URL, or an absolute path on the host (local or NFS).
      - Required unless I(state=space).
    type: str
  dest:
    description: The checkpoint directory to fill.
    type: path
    required: true
  manifest:
    description:
      - Where the source's manifest is (URL or path on the host). Default
        C(<src>/.sparkops-manifest.json). A path source without one gets one built.
    type: str
  state:
    description:
      - C(present) fetches; C(space) only checks the free disk space for I(expected_bytes); C(prepare)
        readies I(dest) for another tool's transfer of I(expected).
    type: str
    choices: [present, space, prepare]
    default: present
  reuse_from:
    description:
      - A verified checkpoint directory (the one being served) whose files of the same size and
        sha256 are hard-linked into I(dest) instead of transferred. Must not be I(dest). Read only.
    type: path
  expected:
    description:
      - For I(state=prepare), the files the transfer will bring, each C(path), C(size) and C(sha256)
        (64 hex digits, or null where the source gives only the size; such a file is left to the
        transfer tool).
    type: list
    elements: dict
  revision:
    description: For I(state=prepare), the revision coming; a manifest in I(dest) naming another is removed.
    type: str
  expected_bytes:
    description: Size of the checkpoint, for I(state=space).
    type: int
  reserve_gib:
    description: GiB that must stay free after the checkpoint (PLE pack and margin).
    type: float
    default: 0
  space_hint:
    description: Appended to the message when the free-space check fails (name the variables to change).
    type: str
    default: ""
  headers:
    description:
      - HTTP headers (for example an Authorization header). Not logged.
      - Sent only to the origin (scheme, host, port) of the URL asked for; a redirect elsewhere
        drops them all, with Authorization, Proxy-Authorization and Cookie, for the rest of the chain.
    type: dict
    default: {}
  allow_http:
    description:
      - Accept a plain C(http://) source or manifest URL, and redirects to C(http://). Without it only
        C(https://) is fetched, as without TLS the bytes and any credential can be read and changed on the way.
    type: bool
    default: false
  validate_certs:
    description: Verify the HTTPS server's certificate.
    type: bool
    default: true
  timeout:
    description: Seconds to wait on a connection or read.
    type: int
    default: 60
  retries:
    description: How many times a dropped transfer is resumed within this run.
    type: int
    default: 3
  retry_delay:
    description: Seconds between two resume attempts.
    type: float
    default: 2
  progress_file:
    description: JSON file updated about once a second with C(done), C(total), C(file) and C(text).
    type: path
  workers:
    description: Threads hashing the files that must be checked before they are kept or linked. C(0) picks min(files, CPUs).
    type: int
    default: 0
  mode:
    description: Permissions of the created directory.
    type: raw
    default: "0755"
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details: The manifest is read and the disk space checked; nothing is written.
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
- name: Fetch from an HTTP server that publishes a manifest
  sparkops.appliance.checkpoint_fetch:
    src: https://models.example.internal/my-model/0123abcd
    dest: /srv/sparkops/models/my-model
    reserve_gib: 40
    progress_file: /run/sparkops-checkpoint.progress

- name: Copy from an NFS mount (a manifest is built if the share has none)
  sparkops.appliance.checkpoint_fetch:
    src: /mnt/models/my-model
    dest: /srv/sparkops/models/my-model

- name: Stage a new revision beside the served copy, linking the files that did not change
  sparkops.appliance.checkpoint_fetch:
    src: https://models.example.internal/my-model/4567cdef
    dest: /srv/sparkops/models/my-model.staged
    reuse_from: /srv/sparkops/models/my-model

- name: Only check that 80 GiB plus 40 GiB reserve fit
  sparkops.appliance.checkpoint_fetch:
    dest: /srv/sparkops/models/my-model
    state: space
    expected_bytes: 85899345920
    reserve_gib: 40
"""

RETURN = r"""
reused:
  description: Files hard-linked (or copied) from I(reuse_from) instead of transferred (would be, in check mode).
  returned: always
  type: list
  elements: str
reused_bytes:
  description: Bytes of the files in I(reused).
  returned: always
  type: int
linked:
  description: How many of I(reused) were hard-linked (the rest were copied).
  returned: always
  type: int
stale:
  description: Files of I(dest) longer than listed, or of the listed size with another sha256; removed (and, with I(state=present), fetched anew).
  returned: always
  type: list
  elements: str
manifest_removed:
  description: With I(state=prepare), whether a manifest of another revision or content was removed from I(dest).
  returned: always
  type: bool
files:
  description: Number of files in the manifest.
  returned: always
  type: int
total_bytes:
  description: Size of the checkpoint according to the manifest.
  returned: always
  type: int
missing:
  description: Files that were (or, in check mode, would be) transferred.
  returned: always
  type: list
  elements: str
transferred_bytes:
  description: Bytes read from the source in this run (excludes what .part files already held).
  returned: always
  type: int
resumed_bytes:
  description: Bytes that .part files already held and that were not transferred again.
  returned: always
  type: int
free_bytes:
  description: Free bytes on the destination's file system before the transfer.
  returned: always
  type: int
manifest_built:
  description: Whether the manifest was built from a path source that had none.
  returned: always
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.appliance.plugins.module_utils._checkpoint import (
    FINGERPRINT_NAME, GIB, MANIFEST_NAME, PART_SUFFIX, CheckpointError, FileSource, HttpSource, Progress,
    build_manifest, compare_with_expected, dump_manifest, fetch_file, fmt_bytes, free_space_check, link_or_copy,
    parse_manifest, plan_dest, read_manifest_at, read_text, safe_join, total_bytes, validate_expected)
from ansible_collections.sparkops.appliance.plugins.module_utils._files import write_text


def _listing(entries):
    return "".join("%s %d\n" % (rel, size) for rel, size in entries)


def _space(module, dest, need, present_note=""):
    p = module.params
    reserve = int(p["reserve_gib"] * GIB)
    ok, free, probe = free_space_check(dest, need, reserve)
    if not ok:
        raise CheckpointError(
            "not enough free disk for the checkpoint in %s: %s free on the file system of %s, need %s "
            "(checkpoint still to fetch %s%s + reserve %.2f GiB for the PLE pack and margin). %s" % (
                dest, fmt_bytes(free), probe, fmt_bytes(need + reserve), fmt_bytes(need), present_note,
                p["reserve_gib"], p["space_hint"]))
    return free


def _same_device(dest, other):
    """Whether dest (or its nearest existing ancestor) is on other's file system (a hard link works)."""
    probe = dest
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return os.stat(probe).st_dev == os.stat(other).st_dev


def run(module):
    p = module.params
    dest = p["dest"]
    result = dict(changed=False, files=0, total_bytes=0, missing=[], transferred_bytes=0,
                  resumed_bytes=0, free_bytes=0, manifest_built=False, reused=[], reused_bytes=0, linked=0,
                  stale=[], manifest_removed=False)
    if p["reuse_from"] and os.path.realpath(p["reuse_from"]) == os.path.realpath(dest):
        raise CheckpointError("reuse_from (%s) is dest itself: give the served copy beside the staging directory" % p["reuse_from"])
    if p["state"] == "prepare":
        return prepare(module, result)
    if p["state"] == "space":
        if p["expected_bytes"] is None:
            raise CheckpointError("state=space needs expected_bytes")
        present = 0
        # bytes already in dest count as present (a re-run over a partial checkpoint)
        for dirpath, _dirs, names in os.walk(dest):
            for n in names:
                try:
                    present += os.path.getsize(os.path.join(dirpath, n))
                except OSError:
                    pass
        need = max(p["expected_bytes"] - present, 0)
        result["total_bytes"] = p["expected_bytes"]
        result["free_bytes"] = _space(module, dest, need, ", %s already there" % fmt_bytes(present))
        return result

    src = p["src"]
    if not src:
        raise CheckpointError("src is required with state=present")
    is_http = src.startswith("http://") or src.startswith("https://")
    if is_http:
        source = HttpSource(src, p["headers"], p["timeout"], p["validate_certs"], p["allow_http"])
    elif os.path.isabs(src):
        if not os.path.isdir(src):
            raise CheckpointError("source directory %s does not exist (is the share mounted?)" % src)
        source = FileSource(src)
    else:
        raise CheckpointError("src %r is neither an http(s):// URL nor an absolute path" % src)

    mloc = p["manifest"] or (source.url(MANIFEST_NAME) if is_http else os.path.join(src, MANIFEST_NAME))
    if mloc.startswith("http://") or mloc.startswith("https://"):
        loader = source if is_http else HttpSource(mloc, p["headers"], p["timeout"], p["validate_certs"], p["allow_http"])
        try:
            text = loader.read_text(mloc)
        except Exception as e:  # any fetch failure becomes a message naming the URL
            raise CheckpointError("cannot read the manifest %s: %s" % (mloc, e))
        manifest = parse_manifest(text, mloc)
    else:
        text = read_text(mloc)
        if text is not None:
            manifest = parse_manifest(text, mloc)
        elif is_http or p["manifest"]:
            raise CheckpointError("manifest %s does not exist" % mloc)
        else:
            manifest = build_manifest(src, revision=None)
            result["manifest_built"] = True
    manifest_text = dump_manifest(manifest)
    dest_manifest = os.path.join(dest, MANIFEST_NAME)
    old_manifest_text = read_text(dest_manifest) or ""

    result["files"] = len(manifest["files"])
    result["total_bytes"] = total_bytes(manifest)
    good, stale, reuse = plan_dest(dest, manifest["files"], p["reuse_from"], p["workers"])
    held = set(e["path"] for e in good) | set(e["path"] for e in reuse)
    result["stale"] = stale
    result["reused"] = [e["path"] for e in reuse]
    result["reused_bytes"] = sum(e["size"] for e in reuse)
    before, missing, need, resumable = [], [], 0, 0
    for e in manifest["files"]:
        path = safe_join(dest, e["path"])
        if os.path.isfile(path):
            before.append((e["path"], os.path.getsize(path)))
        if e["path"] in held:
            continue
        missing.append(e)
        part = path + PART_SUFFIX
        have = os.path.getsize(part) if os.path.isfile(part) else 0
        have = have if have <= e["size"] else 0
        resumable += have
        need += e["size"] - have
    if reuse and not _same_device(dest, p["reuse_from"]):
        need += result["reused_bytes"]  # no hard link across file systems: these are copied
    result["missing"] = [e["path"] for e in missing]
    result["free_bytes"] = _space(module, dest, need, ", %s resumable from .part files" % fmt_bytes(resumable)
                                  if resumable else "")
    result["changed"] = bool(missing) or bool(reuse) or manifest_text != old_manifest_text
    result["diff"] = {
        "before": {"files": _listing(before), "manifest": old_manifest_text},
        "after": {"files": _listing((e["path"], e["size"]) for e in manifest["files"]), "manifest": manifest_text},
    }
    if module.check_mode or not result["changed"]:
        return result

    if not os.path.isdir(dest):
        os.makedirs(dest)
        module.set_mode_if_different(dest, p["mode"], False)
    progress = Progress(p["progress_file"], result["total_bytes"])
    progress.done = result["total_bytes"] - sum(e["size"] for e in missing)
    progress.write(force=True)
    try:
        for e in reuse:
            if link_or_copy(safe_join(p["reuse_from"], e["path"]), safe_join(dest, e["path"])) == "link":
                result["linked"] += 1
        for e in missing:
            path = safe_join(dest, e["path"])
            if os.path.isfile(path):  # another size, or this size with other bytes: fetch it anew
                os.unlink(path)
            got = fetch_file(source, e["path"], dest, e["size"], e["sha256"], progress, p["retries"], p["retry_delay"])
            result["transferred_bytes"] += got
            result["resumed_bytes"] += e["size"] - got
    except BaseException:
        progress.finish("failed")
        raise
    if manifest_text != old_manifest_text:
        write_text(module, dest_manifest, manifest_text)
    progress.file = None
    progress.finish("done")
    return result


def prepare(module, result):
    """state=prepare: remove what dest holds that is not the listed files', a manifest of another
    revision or content with its fingerprint, and link in what reuse_from holds of them."""
    p = module.params
    dest = p["dest"]
    if p["expected"] is None:
        raise CheckpointError("state=prepare needs expected (the files the transfer will bring)")
    expected = validate_expected(p["expected"])
    result["files"] = len(expected)
    result["total_bytes"] = sum(e["size"] for e in expected)
    _good, stale, reuse = plan_dest(dest, expected, p["reuse_from"], p["workers"])
    result["stale"] = stale
    result["reused"] = [e["path"] for e in reuse]
    result["reused_bytes"] = sum(e["size"] for e in reuse)
    try:
        old = read_manifest_at(dest) if os.path.isdir(dest) else None
    except CheckpointError:
        old = {"revision": None, "files": [], "malformed": True}
    if old is not None:
        other_revision = bool(p["revision"]) and old.get("revision") not in (None, p["revision"])
        result["manifest_removed"] = bool(old.get("malformed") or other_revision or compare_with_expected(old, expected))
    result["changed"] = bool(stale or reuse or result["manifest_removed"])
    result["diff"] = {"before": {"stale": "".join(r + "\n" for r in stale),
                                 "manifest": "present\n" if result["manifest_removed"] else ""},
                      "after": {"stale": "", "manifest": ""}}
    if module.check_mode or not result["changed"]:
        return result
    if not os.path.isdir(dest):
        os.makedirs(dest)
        module.set_mode_if_different(dest, p["mode"], False)
    if result["manifest_removed"]:
        for name in (FINGERPRINT_NAME, MANIFEST_NAME):
            if os.path.lexists(os.path.join(dest, name)):
                os.unlink(os.path.join(dest, name))
    for rel in stale:
        os.unlink(safe_join(dest, rel))
    for e in reuse:
        if link_or_copy(safe_join(p["reuse_from"], e["path"]), safe_join(dest, e["path"])) == "link":
            result["linked"] += 1
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="str"),
            dest=dict(type="path", required=True),
            manifest=dict(type="str"),
            state=dict(type="str", default="present", choices=["present", "space", "prepare"]),
            reuse_from=dict(type="path"),
            expected=dict(type="list", elements="dict"),
            revision=dict(type="str"),
            workers=dict(type="int", default=0),
            expected_bytes=dict(type="int"),
            reserve_gib=dict(type="float", default=0),
            space_hint=dict(type="str", default=""),
            headers=dict(type="dict", default={}, no_log=True),
            allow_http=dict(type="bool", default=False),
            validate_certs=dict(type="bool", default=True),
            timeout=dict(type="int", default=60),
            retries=dict(type="int", default=3),
            retry_delay=dict(type="float", default=2),
            progress_file=dict(type="path"),
            mode=dict(type="raw", default="0755"),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except CheckpointError as e:
        module.fail_json(msg=str(e))
    except (IOError, OSError) as e:
        module.fail_json(msg="checkpoint fetch into %s: %s" % (module.params["dest"], e))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
