#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ple_pack
short_description: Pack the per-layer embedding (PLE) tables of a checkpoint into one mmap-able file
description:
  - Reads the safetensors shards of a checkpoint directory (header only; tensor bytes are
    copied by the kernel or through small buffers, never a whole tensor in memory), selects
    the per-layer embedding tables by name pattern and writes them into ONE packed file -
    magic, format version, a JSON index (name, dtype, shape, offset, nbytes and a chunked sha256
      digest per table)
    and each table's raw little-endian bytes at an offset aligned to O(alignment).
  - The format is documented in C(docs/ple-format.md) of the collection.
  - The file is written to a temporary file in the destination directory and renamed at the
    end, so a killed pack never leaves a partial file at O(dest); temporary files left by an
    earlier killed pack are removed.
  - Idempotent without re-reading the data. The index carries a fingerprint of the selected
    source tensors (names, dtypes, shapes, byte ranges, shard sizes and mtimes) and of the
    layout; an existing pack with the same fingerprint is left alone (with O(verify), only
    when its tables still match their source shards and its index, see O(verify)).
  - Returns the figures the memory plan needs, C(ple_bytes), C(ple_gib) and the checkpoint's
    C(weight_bytes), also in check mode.
  - Bad input fails with a message naming the file and the problem, before anything is
    written at O(dest) - not safetensors, truncated shard, header length past the end of the
    file, overlapping or out-of-range offsets, a tensor name in two shards, an unsupported
    dtype, no table matching O(name_patterns) (the message lists the closest names), not
    enough free disk.
version_added: "0.1.0"
author:
  - sparkops contributors (@sparkops)
options:
  checkpoint_dir:
    description:
      - Directory of the local checkpoint; every C(*.safetensors) file directly in it is a shard.
    type: path
    required: true
  dest:
    description:
      - Path of the packed PLE file. Its directory must exist.
    type: path
    required: true
  name_patterns:
    description:
      - Python regular expressions; a tensor whose name matches any of them (C(re.search)) is
        a PLE table. The default selects Gemma-3n-style per-layer embeddings
        (C(model.language_model.embed_tokens_per_layer.weight)).
    type: list
    elements: str
    default: ['embed_tokens_per_layer']
  alignment:
    description:
      - Byte alignment of every table's offset in the packed file. A power of two from 4096
        (the page size) to 1 GiB; use 2097152 (2 MiB) for huge-page-friendly mappings.
    type: int
    default: 4096
  verify:
    description:
      - After writing, re-read every table from the packed file and compare its digest with the
        one computed from the source while copying.
      - When the pack is already up to date by its fingerprint, re-read every table twice - from
        its source shard and from the pack - and compare both digests with the index. A source
        table whose bytes changed without a change of the shard's size or mtime (a shard
        rewritten in place, its mtime restored) makes the module repack from the checkpoint
        as it is now, with a warning naming the table and the shard (RV(source_changed)); a
        packed table that no longer matches its index (RV(verify_failed)) makes it rewrite
        the pack too. Both are reported as changed (in check mode, as would change).
      - Without O(verify) only the fingerprint is compared, which reads no table data.
    type: bool
    default: false
  mode:
    description:
      - Permissions of the packed file, as an octal string.
    type: str
    default: '0644'
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: The diff lists the file mode, format, alignment, fingerprint and the tables' layout (not their digests).
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
notes:
  - Hashing every table (for the index) is part of the pack. A table's digest is the sha256 of
    the sha256 of its 16 MiB chunks (C(hash_scheme) C(sha256-chunks)), so the chunks are hashed
    on all cores (up to 8 threads) while the kernel copies; a pack written by an older version
    (one whole-table sha256) is re-packed.
"""

EXAMPLES = r"""
- name: Pack the PLE tables of the served checkpoint
  sparkops.appliance.ple_pack:
    checkpoint_dir: /srv/sparkops/models/gemma-3n-E4B-it
    dest: /srv/sparkops/models/gemma-3n-E4B-it.ple
  register: __ple

- name: Pack with 2 MiB alignment and a check of the written bytes
  sparkops.appliance.ple_pack:
    checkpoint_dir: /srv/sparkops/models/my-model
    dest: /srv/sparkops/models/my-model.ple
    name_patterns: ['per_layer_embed', 'embed_tokens_per_layer']
    alignment: 2097152
    verify: true
"""

RETURN = r"""
dest:
  description: Path of the packed file.
  returned: always
  type: str
ple_bytes:
  description: Sum of the PLE tables' sizes in bytes (the data the runtime mmaps).
  returned: success
  type: int
  sample: 24341692416
ple_gib:
  description: RV(ple_bytes) in GiB (2^30 bytes), rounded to 6 decimals; the memory plan's PLE_GIB.
  returned: success
  type: float
  sample: 22.67
weight_bytes:
  description:
    - Bytes of the checkpoint directory (regular files, symlinks followed, hidden entries and
      the pack itself excluded); the memory plan's WEIGHT_BYTES.
  returned: success
  type: int
weight_gib:
  description: RV(weight_bytes) in GiB, rounded to 6 decimals.
  returned: success
  type: float
file_bytes:
  description: Size of the packed file (index, padding and tables).
  returned: success
  type: int
alignment:
  description: Alignment of the table offsets.
  returned: success
  type: int
fingerprint:
  description: Fingerprint of the source tensors and layout stored in the index.
  returned: success
  type: str
tables:
  description:
    - The index entries. C(digest) is null in check mode when the pack would be (re)written.
  returned: success
  type: list
  elements: dict
  sample:
    - name: model.language_model.embed_tokens_per_layer.weight
      dtype: BF16
      shape: [262144, 8960]
      offset: 4096
      nbytes: 4697620480
      digest: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      source_shard: model-00001-of-00004.safetensors
shards:
  description: Shard file names read, in order.
  returned: success
  type: list
  elements: str
verified:
  description: Whether the tables' bytes were re-hashed and matched in this run.
  returned: success
  type: bool
copy_method:
  description: How bytes were copied (copy_file_range, sendfile or readwrite); null when nothing was written.
  returned: success
  type: str
verify_failed:
  description: Tables of the existing pack whose digest did not match its index (with O(verify)).
  returned: success
  type: list
  elements: str
source_changed:
  description:
    - With O(verify), the tables whose bytes in the source shard differ from the packed ones
      although the shard's size and mtime did not change; the pack is rebuilt from the source.
  returned: success
  type: list
  elements: dict
  sample:
    - table: model.language_model.embed_tokens_per_layer.weight
      shard: model-00001-of-00004.safetensors
removed_temp_files:
  description: Temporary files of earlier killed packs that were removed.
  returned: success
  type: list
  elements: str
"""

import difflib
import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import struct
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.appliance.plugins.module_utils._disk import filesystem_space, tree_bytes
from ansible_collections.sparkops.appliance.plugins.module_utils._ple_hash import (
    HASH_CHUNK_BYTES,
    HASH_SCHEME,
    ChunkHasher,
    chunk_bounds,
)
from ansible_collections.sparkops.appliance.plugins.module_utils._safetensors import (
    RangeCopier,
    SafetensorsError,
    read_shards,
)

MAGIC = b"SPARKPLE"
FORMAT_VERSION = 1
PREFIX = struct.Struct("<8sIIQ")  # magic, format version, flags (0), index length
MAX_INDEX_BYTES = 64 * 1024 * 1024
DEFAULT_PATTERNS = ["embed_tokens_per_layer"]
TEMP_SUFFIX = ".ple-tmp"
_DIGEST_PLACEHOLDER = "0" * 64
GIB = float(1 << 30)


class PackError(Exception):
    """A bad input or a failed write; the message is meant for the user."""


def _align_up(value, alignment):
    return (value + alignment - 1) // alignment * alignment


def find_shards(checkpoint_dir):
    if not os.path.isdir(checkpoint_dir):
        raise PackError("checkpoint_dir %s is not a directory" % checkpoint_dir)
    shards = sorted(glob.glob(os.path.join(glob.escape(checkpoint_dir), "*.safetensors")))
    shards = [s for s in shards if os.path.isfile(s)]
    if not shards:
        raise PackError("checkpoint_dir %s holds no *.safetensors shard" % checkpoint_dir)
    return shards


def select_tables(headers, by_name, patterns):
    """The tensors whose names match any pattern, in shard order then byte order."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise PackError("name_patterns: %r is not a valid regular expression (%s)" % (pattern, exc))
    order = {h.path: i for i, h in enumerate(headers)}
    selected = [t for t in by_name.values() if any(c.search(t.name) for c in compiled)]
    if not selected:
        names = sorted(by_name)
        close = _closest_names(patterns, names)
        hint = ", ".join(repr(n) for n in close[:8]) or "(none similar; %d tensors, e.g. %s)" % (
            len(names), ", ".join(repr(n) for n in names[:3]))
        raise PackError("no tensor matches name_patterns %r; closest names: %s"
                        % (list(patterns), hint))
    for info in selected:
        if not info.supported:
            raise PackError("%s: tensor %r has unsupported dtype %r (supported: byte-addressable "
                            "safetensors dtypes such as BF16, F16, F32, F8_E4M3, I8, U8)"
                            % (info.shard, info.name, info.dtype))
    selected.sort(key=lambda t: (order[t.shard], t.begin))
    return selected


def _closest_names(patterns, names, limit=8):
    """Tensor names most like the patterns: compared whole and by dotted component."""
    scored = []
    for name in names:
        parts = [name] + name.split(".")
        score = max(difflib.SequenceMatcher(None, pattern, part).ratio()
                    for pattern in patterns for part in parts)
        scored.append((-score, name))
    scored.sort()
    return [name for score, name in scored[:limit] if -score >= 0.4]


def fingerprint(headers, tables, alignment):
    shard_stat = {h.path: (h.size, h.mtime_ns) for h in headers}
    doc = {
        "format_version": FORMAT_VERSION,
        "alignment": alignment,
        "tables": [
            [t.name, t.dtype, t.shape, os.path.basename(t.shard), shard_stat[t.shard][0],
             shard_stat[t.shard][1], t.begin, t.end]
            for t in tables
        ],
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def _serialize(index):
    return json.dumps(index, sort_keys=True, separators=(",", ":")).encode("utf-8")


def plan_layout(tables, alignment, fp):
    """The index (digests still placeholders) and its serialized length.

    Offsets are absolute; the first table starts at the first multiple of alignment after the
    prefix and the index. The digest placeholders have the final length, so filling them in
    keeps the index the same size.
    """
    data_start = alignment
    while True:
        entries = []
        offset = data_start
        end = data_start
        for t in tables:
            entries.append({
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "offset": offset,
                "nbytes": t.nbytes,
                "digest": _DIGEST_PLACEHOLDER,
                "source_shard": os.path.basename(t.shard),
            })
            end = offset + t.nbytes
            offset = _align_up(end, alignment)
        index = {
            "format": "sparkops-ple",
            "format_version": FORMAT_VERSION,
            "byte_order": "little",
            "alignment": alignment,
            "fingerprint": fp,
            "hash_scheme": HASH_SCHEME,
            "hash_chunk_bytes": HASH_CHUNK_BYTES,
            "ple_bytes": sum(t.nbytes for t in tables),
            "file_bytes": end,
            "tables": entries,
        }
        need = PREFIX.size + len(_serialize(index))
        if need <= data_start:
            return index
        data_start = _align_up(need, alignment)


def read_pack_index(path):
    """(index, None) for a valid pack at path; (None, reason) otherwise; (None, None) if absent."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, "cannot open: %s" % exc.strerror
    try:
        size = os.fstat(fd).st_size
        prefix = os.pread(fd, PREFIX.size, 0)
        if len(prefix) < PREFIX.size:
            return None, "too short for a PLE pack"
        magic, version, _flags, index_len = PREFIX.unpack(prefix)
        if magic != MAGIC:
            return None, "bad magic (not a PLE pack)"
        if version != FORMAT_VERSION:
            return None, "format version %d (this module writes %d)" % (version, FORMAT_VERSION)
        if index_len > MAX_INDEX_BYTES or PREFIX.size + index_len > size:
            return None, "index length %d runs past the end of the file" % index_len
        raw = os.pread(fd, index_len, PREFIX.size)
    finally:
        os.close(fd)
    try:
        index = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, "index is not valid JSON (%s)" % exc
    if not isinstance(index, dict) or not isinstance(index.get("tables"), list):
        return None, "index has no table list"
    if index.get("file_bytes") != size:
        return None, "file is %d bytes, the index says %s" % (size, index.get("file_bytes"))
    return index, None


def describe(index, mode=None):
    """Text of an index (and file mode) for the diff: everything but the digests."""
    if index is None:
        return ""
    lines = ["mode: %04o" % mode] if mode is not None else []
    lines += [
        "format: %s v%s" % (index.get("format"), index.get("format_version")),
        "alignment: %s" % index.get("alignment"),
        "fingerprint: %s" % index.get("fingerprint"),
        "hash: %s" % _hash_text(index),
        "file_bytes: %s" % index.get("file_bytes"),
        "ple_bytes: %s" % index.get("ple_bytes"),
        "tables:",
    ]
    for t in index.get("tables", []):
        lines.append("  - %s %s %s offset=%s nbytes=%s from %s" % (
            t.get("name"), t.get("dtype"), t.get("shape"), t.get("offset"), t.get("nbytes"),
            t.get("source_shard")))
    return "\n".join(lines) + "\n"


def _hash_text(index):
    if "hash_scheme" not in index:
        return "whole-table sha256 (an older pack: its digests cannot be checked, it is re-packed)"
    return "%s, %s-byte chunks" % (index.get("hash_scheme"), index.get("hash_chunk_bytes"))


def _same_layout(a, b):
    keys = ("name", "dtype", "shape", "offset", "nbytes", "source_shard")
    if a is None or b is None:
        return False
    index_keys = ("fingerprint", "alignment", "file_bytes", "ple_bytes", "hash_scheme", "hash_chunk_bytes")
    if any(a.get(k) != b.get(k) for k in index_keys):
        return False
    ta, tb = a.get("tables", []), b.get("tables", [])
    return len(ta) == len(tb) and all(
        all(x.get(k) == y.get(k) for k in keys) for x, y in zip(ta, tb))


def verify_pack(path, index):
    """Names of the tables whose bytes in the pack do not match the index's digest."""
    with ChunkHasher(chunk_bytes=index["hash_chunk_bytes"]) as hasher:
        handles = [hasher.add(path, t["offset"], t["offset"] + t["nbytes"]) for t in index["tables"]]
        return [t["name"] for t, h in zip(index["tables"], handles) if hasher.digest(h) != t.get("digest")]


def verify_against_sources(path, index, tables):
    """Re-read every table from its source shard and from the pack; compare both with the index.

    tables are the selected source tensors, in index order (the fingerprint matched, so the
    layouts agree). Every range is hashed by the index's chunk scheme, its chunks on a pool of
    threads with one buffer each. Returns (source_changed, pack_bad): the source tables whose
    bytes are no longer those packed ({"table", "shard"}), and the names of the tables whose
    packed bytes do not match the index.
    """
    entries = index["tables"]
    with ChunkHasher(chunk_bytes=index["hash_chunk_bytes"]) as hasher:
        jobs = [(t, entry, hasher.add(t.shard, t.begin, t.end),
                 hasher.add(path, entry["offset"], entry["offset"] + entry["nbytes"]))
                for t, entry in zip(tables, entries)]
        source_changed = []
        pack_bad = []
        for t, entry, source_hash, pack_hash in jobs:
            if hasher.digest(source_hash) != entry.get("digest"):
                source_changed.append({"table": t.name, "shard": os.path.basename(t.shard)})
            if hasher.digest(pack_hash) != entry.get("digest"):
                pack_bad.append(entry["name"])
        return source_changed, pack_bad


def _temp_glob(dest):
    directory, base = os.path.split(dest)
    return os.path.join(glob.escape(directory), "." + glob.escape(base) + ".*" + TEMP_SUFFIX)


def stale_temp_files(dest):
    """Temporary files of earlier packs of dest whose writer is gone (no lock held)."""
    stale = []
    for path in sorted(glob.glob(_temp_glob(dest))):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live pack holds it
        finally:
            os.close(fd)
        stale.append(path)
    return stale


def _remove(paths):
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _check_space(directory, needed):
    free = filesystem_space(directory)[0]
    if free < needed:
        raise PackError("not enough free disk in %s: the PLE pack needs %d bytes (%.2f GiB), %d "
                        "bytes (%.2f GiB) are free" % (directory, needed, needed / GIB, free, free / GIB))


def write_pack(dest, tables, index, headers, verify=False, mode=0o644, check_space=True, move=None):
    """Write the pack to a locked temp file next to dest, then move it over dest.

    Returns (index with digests filled in, copy method, verified). On any failure the temp file
    is removed and PackError raised; dest is untouched.
    """
    directory = os.path.dirname(dest) or "."
    total = index["file_bytes"]
    if check_space:
        _check_space(directory, total)
    fd, tmp = tempfile.mkstemp(prefix=".%s.%d." % (os.path.basename(dest), os.getpid()),
                               suffix=TEMP_SUFFIX, dir=directory)
    copier = RangeCopier()
    src_fds = {}
    hasher = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            os.posix_fallocate(fd, 0, total)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(fd, total)
        # Each chunk is copied by the kernel, then hashed from the source by the pool while the
        # next chunks are copied: the bytes are read from the disk once (the hash finds them in
        # the page cache) and the chunks of one large table are hashed on all cores.
        hasher = ChunkHasher(chunk_bytes=index["hash_chunk_bytes"])
        handles = []
        for t, entry in zip(tables, index["tables"]):
            src = src_fds.get(t.shard)
            if src is None:
                src = src_fds[t.shard] = os.open(t.shard, os.O_RDONLY)
            handle = []
            for begin, end in chunk_bounds(t.begin, t.end, hasher.chunk_bytes):
                copier.copy(src, begin, fd, entry["offset"] + begin - t.begin, end - begin)
                hasher.add_chunk(handle, t.shard, begin, end)
            handles.append(handle)
        final = dict(index)
        final["tables"] = [dict(e, digest=hasher.digest(h)) for e, h in zip(index["tables"], handles)]
        hasher.close()
        hasher = None
        for h in headers:  # the source must not have changed under us
            st = os.stat(h.path)
            if (st.st_size, st.st_mtime_ns) != (h.size, h.mtime_ns):
                raise PackError("%s changed while it was being packed; run again" % h.path)
        blob = _serialize(final)
        if PREFIX.size + len(blob) != PREFIX.size + len(_serialize(index)):
            raise PackError("internal error: the index changed size when its digests were filled in")
        os.pwrite(fd, PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(blob)) + blob, 0)
        verified = False
        if verify:
            bad = verify_pack(tmp, final)
            if bad:
                raise PackError("verify: the bytes written for %s do not match the source; the "
                                "disk or the source is unreliable" % ", ".join(bad))
            verified = True
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.close(fd)
        fd = None
        (move or os.replace)(tmp, dest)
        try:
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
        return final, copier.method, verified
    except BaseException as exc:
        if hasher is not None:
            hasher.stop()
            hasher.close()
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise PackError("disk full while writing the PLE pack in %s (%d bytes needed): %s; "
                            "nothing was left at %s" % (directory, total, exc.strerror, dest))
        if isinstance(exc, OSError):
            raise PackError("writing the PLE pack %s failed: %s" % (dest, exc))
        if isinstance(exc, SafetensorsError):
            raise PackError(str(exc))
        raise
    finally:
        for src in src_fds.values():
            os.close(src)


def pack(checkpoint_dir, dest, name_patterns=None, alignment=4096, verify=False, mode=0o644,
         check_mode=False, check_space=True, move=None):
    """Plan, compare with the existing pack and (unless check_mode) write. Returns a result dict."""
    if alignment < 4096 or alignment > (1 << 30) or alignment & (alignment - 1):
        raise PackError("alignment %r must be a power of two from 4096 to 1073741824 (e.g. 4096 "
                        "or 2097152)" % (alignment,))
    patterns = list(name_patterns) if name_patterns else list(DEFAULT_PATTERNS)
    directory = os.path.dirname(dest) or "."
    if not os.path.isdir(directory) and not check_mode:  # check mode: an earlier task would create it
        raise PackError("the directory of dest (%s) does not exist; create it first" % directory)
    if os.path.isdir(dest):
        raise PackError("dest %s is a directory; give the path of the packed file" % dest)
    try:
        headers, by_name = read_shards(find_shards(checkpoint_dir))
    except SafetensorsError as exc:
        raise PackError(str(exc))
    tables = select_tables(headers, by_name, patterns)
    fp = fingerprint(headers, tables, alignment)
    planned = plan_layout(tables, alignment, fp)
    before, invalid = read_pack_index(dest)
    up_to_date = invalid is None and _same_layout(before, planned)

    result = {
        "dest": dest,
        "alignment": alignment,
        "fingerprint": fp,
        "shards": [os.path.basename(h.path) for h in headers],
        "ple_bytes": planned["ple_bytes"],
        "ple_gib": round(planned["ple_bytes"] / GIB, 6),
        "file_bytes": planned["file_bytes"],
        "verified": False,
        "copy_method": None,
        "removed_temp_files": [],
    }
    wb = tree_bytes(checkpoint_dir, exclude=[dest])  # the temporary pack is hidden: skipped too
    result["weight_bytes"] = wb
    result["weight_gib"] = round(wb / GIB, 6)

    verify_failed = []
    source_changed = []
    if up_to_date and verify:
        try:
            source_changed, verify_failed = verify_against_sources(dest, before, tables)
        except SafetensorsError as exc:
            raise PackError("verify: %s" % exc)
        up_to_date = not (verify_failed or source_changed)
        result["verified"] = up_to_date
    result["verify_failed"] = verify_failed
    result["source_changed"] = source_changed

    current_mode = os.stat(dest).st_mode & 0o7777 if before is not None else None
    before_text = describe(before, current_mode) if invalid is None else "# %s: %s\n" % (dest, invalid)
    for changed in source_changed:
        before_text += "# source changed since packed (same shard size and mtime): %s in %s\n" % (
            changed["table"], changed["shard"])
    if verify_failed:
        before_text += "# digest mismatch in: %s\n" % ", ".join(verify_failed)
    stale = [] if check_mode else stale_temp_files(dest)

    if up_to_date:
        mode_changed = current_mode != mode
        if mode_changed and not check_mode:
            os.chmod(dest, mode)
        result.update(changed=bool(stale) or mode_changed, tables=before["tables"],
                      diff={"before": before_text, "after": describe(before, mode)})
    else:
        final = planned
        if not check_mode:
            _remove(stale)
            final, result["copy_method"], result["verified"] = write_pack(
                dest, tables, planned, headers, verify=verify, mode=mode,
                check_space=check_space, move=move)
        tables_out = [dict(e, digest=None) if check_mode else e for e in final["tables"]]
        result.update(changed=True, tables=tables_out,
                      diff={"before": before_text, "after": describe(planned, mode)})
    _remove(stale)
    result["removed_temp_files"] = stale
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            checkpoint_dir=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            name_patterns=dict(type="list", elements="str", default=list(DEFAULT_PATTERNS)),
            alignment=dict(type="int", default=4096),
            verify=dict(type="bool", default=False),
            mode=dict(type="str", default="0644"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        mode = int(p["mode"], 8)
        if mode < 0 or mode > 0o7777:
            raise ValueError(p["mode"])
    except ValueError:
        module.fail_json(msg="mode %r is not an octal file mode such as '0644'" % p["mode"])
    if not p["name_patterns"]:
        module.fail_json(msg="name_patterns is empty; give at least one pattern, e.g. "
                             "['embed_tokens_per_layer']")

    def move(src, dst):
        module.atomic_move(src, dst)
        os.chmod(dst, mode)

    try:
        result = pack(p["checkpoint_dir"], p["dest"], name_patterns=p["name_patterns"],
                      alignment=p["alignment"], verify=p["verify"], mode=mode,
                      check_mode=module.check_mode, move=move)
    except PackError as exc:
        module.fail_json(msg=str(exc), dest=p["dest"])
    for changed in result["source_changed"]:
        module.warn("verify: table %s in %s/%s no longer matches the pack, although the shard's size "
                    "and mtime did not change (rewritten in place); %s the pack from the checkpoint as "
                    "it is now" % (changed["table"], p["checkpoint_dir"], changed["shard"],
                                   "would rebuild" if module.check_mode else "rebuilt"))
    if result["verify_failed"]:
        module.warn("verify: the packed bytes of %s did not match the pack's index; %s the pack"
                    % (", ".join(result["verify_failed"]), "would rewrite" if module.check_mode else "rewrote"))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
