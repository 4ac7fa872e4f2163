# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reader and start-up checks of the packed PLE file (docs/ple-format.md), standard library only.

The checks run in every vLLM process that builds the model, before any weight is loaded; each
refusal is a PackMismatchError whose message names the file, the table and the fix.
"""

import hashlib
import json
import os
import re
import struct

MAGIC = b"SPARKPLE"
FORMAT_VERSION = 1
PREFIX = struct.Struct("<8sIIQ")  # magic, format version, flags, index length
HASH_SCHEME = "sha256-chunks"  # how tables[].digest is computed (docs/ple-format.md)
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_HEADER_BYTES = 100 * 1000 * 1000
DTYPE_SIZES = {"BF16": 2, "F16": 2, "F32": 4}  # the dtypes a lookup can serve as embeddings
# The table of the text model: `embed_tokens_per_layer.weight` anywhere but in a tower (audio,
# vision), whose tables are not the language model's.
TEXT_TABLE = re.compile(r"(^|\.)embed_tokens_per_layer\.weight$")
TOWER = re.compile(r"(^|\.)(audio_tower|vision_tower|embed_audio|embed_vision)\.")
FIX = "repack with the ple role (sparkops.appliance.ple) from this checkpoint"


class PackMismatchError(Exception):
    """The packed file cannot serve this model; the message says why and what to do."""


def read_index(path):
    """The pack's index (dict), after checking the prefix, the size and every table's place."""
    try:
        with open(path, "rb") as f:
            raw = f.read(PREFIX.size)
            if len(raw) < PREFIX.size:
                raise PackMismatchError("%s: %d bytes, too short for a packed PLE file; %s" % (path, len(raw), FIX))
            magic, version, _flags, index_len = PREFIX.unpack(raw)
            if magic != MAGIC:
                raise PackMismatchError("%s: not a packed PLE file (magic %r, expected %r); %s" % (path, magic, MAGIC, FIX))
            if version != FORMAT_VERSION:
                raise PackMismatchError("%s: format version %d, this runtime reads %d; %s" % (path, version, FORMAT_VERSION, FIX))
            if index_len > MAX_INDEX_BYTES:
                raise PackMismatchError("%s: index length %d is not plausible; %s" % (path, index_len, FIX))
            index = json.loads(f.read(index_len).decode("utf-8"))
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise PackMismatchError("SPARKOPS_PLE_FILE %s cannot be read (%s): mount the pack the ple role wrote" % (path, exc)) from exc
    except ValueError as exc:
        raise PackMismatchError("%s: the index is not JSON (%s); %s" % (path, exc, FIX)) from exc
    if index.get("format") != "sparkops-ple" or index.get("byte_order", "little") != "little":
        raise PackMismatchError("%s: index format %r, byte order %r; %s" % (path, index.get("format"), index.get("byte_order"), FIX))
    if index.get("hash_scheme") != HASH_SCHEME:
        # docs/ple-format.md: a reader refuses an older (whole-table sha256) or unknown scheme.
        raise PackMismatchError("%s: hash scheme %r: packed with the old whole-table sha256 (or an unknown scheme), "
                                "this runtime reads %s packs; %s" % (path, index.get("hash_scheme"), HASH_SCHEME, FIX))
    if index.get("file_bytes") != size:
        raise PackMismatchError("%s: %d bytes but its index says %r (a truncated or partial copy); %s"
                                % (path, size, index.get("file_bytes"), FIX))
    for t in index.get("tables", []):
        nbytes = _element_count(t["shape"]) * DTYPE_SIZES.get(t["dtype"], 0)
        if DTYPE_SIZES.get(t["dtype"]) and nbytes != t["nbytes"]:
            raise PackMismatchError("%s: table %s: %d bytes but shape %r x %s needs %d; %s"
                                    % (path, t["name"], t["nbytes"], t["shape"], t["dtype"], nbytes, FIX))
        if t["offset"] % index["alignment"] or t["offset"] + t["nbytes"] > size:
            raise PackMismatchError("%s: table %s at offset %d (+%d bytes) is misaligned or past the end; %s"
                                    % (path, t["name"], t["offset"], t["nbytes"], FIX))
    return index


def _element_count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def text_table(index, path):
    """The one table of the language model (a tower's tables are not looked up here)."""
    found = [t for t in index.get("tables", []) if TEXT_TABLE.search(t["name"]) and not TOWER.search(t["name"])]
    if len(found) != 1:
        names = [t["name"] for t in index.get("tables", [])]
        raise PackMismatchError("%s: expected exactly one language-model table named *embed_tokens_per_layer.weight, found %d "
                                "(tables: %s); %s" % (path, len(found), ", ".join(names) or "none", FIX))
    return found[0]


def check_table(table, path, rows, cols, model):
    """The table's dtype and shape against what the model config needs."""
    if table["dtype"] not in DTYPE_SIZES:
        raise PackMismatchError("%s: table %s has dtype %s; the PLE lookup serves %s tables only; %s"
                                % (path, table["name"], table["dtype"], "/".join(sorted(DTYPE_SIZES)), FIX))
    if list(table["shape"]) != [rows, cols]:
        raise PackMismatchError("%s: table %s has shape %s but %s needs [%d, %d] (vocab_size_per_layer_input x "
                                "num_hidden_layers * hidden_size_per_layer_input): the pack is of another model; %s"
                                % (path, table["name"], list(table["shape"]), model, rows, cols, FIX))


def read_shard_header(path):
    """(size, mtime_ns, data_start, {name: entry}) of one safetensors shard."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        raw = f.read(8)
        if len(raw) < 8:
            raise PackMismatchError("%s: not a safetensors shard (too short)" % path)
        (hlen,) = struct.unpack("<Q", raw)
        if hlen > MAX_HEADER_BYTES or 8 + hlen > st.st_size:
            raise PackMismatchError("%s: not a safetensors shard (header length %d)" % (path, hlen))
        header = json.loads(f.read(hlen).decode("utf-8"))
    header.pop("__metadata__", None)
    return st.st_size, st.st_mtime_ns, 8 + hlen, header


def fingerprint(index, checkpoint_dir, path):
    """The packer's fingerprint recomputed from the checkpoint's shard headers (no data read).

    Same document as plugins/modules/ple_pack.py: format version, alignment and, for each table
    in index order, name, dtype, shape, shard file name, shard size, shard mtime (ns) and the
    absolute byte range in the shard. A table whose source differs is named.
    """
    shards, rows = {}, []
    for t in index["tables"]:
        shard = os.path.join(checkpoint_dir, t["source_shard"])
        if shard not in shards:
            try:
                shards[shard] = read_shard_header(shard)
            except (OSError, ValueError) as exc:
                raise PackMismatchError("%s: table %s comes from %s, which cannot be read in the checkpoint %s (%s); %s"
                                        % (path, t["name"], t["source_shard"], checkpoint_dir, exc, FIX)) from exc
        size, mtime_ns, data_start, header = shards[shard]
        entry = header.get(t["name"])
        if entry is None:
            raise PackMismatchError("%s: table %s is not in the checkpoint's shard %s: the pack is of another checkpoint; %s"
                                    % (path, t["name"], t["source_shard"], FIX))
        begin, end = entry["data_offsets"]
        if entry["dtype"] != t["dtype"] or list(entry["shape"]) != list(t["shape"]) or end - begin != t["nbytes"]:
            raise PackMismatchError("%s: table %s is %s %s in the pack but %s %s in the checkpoint's %s; %s"
                                    % (path, t["name"], t["dtype"], list(t["shape"]), entry["dtype"], list(entry["shape"]),
                                       t["source_shard"], FIX))
        rows.append([t["name"], t["dtype"], list(t["shape"]), t["source_shard"], size, mtime_ns,
                     data_start + begin, data_start + end])
    doc = {"format_version": FORMAT_VERSION, "alignment": index["alignment"], "tables": rows}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def check_fingerprint(index, checkpoint_dir, path):
    """Refuse a pack made from another state of the checkpoint (stale: shard rewritten since)."""
    now = fingerprint(index, checkpoint_dir, path)
    if now != index.get("fingerprint"):
        names = ", ".join(t["name"] for t in index["tables"])
        raise PackMismatchError("%s: stale pack: its fingerprint %s... does not match the checkpoint %s (%s...); a shard holding "
                                "table %s changed (size or mtime) since it was packed; %s"
                                % (path, str(index.get("fingerprint"))[:12], checkpoint_dir, now[:12], names, FIX))


def open_checked(path, checkpoint_dir, rows, cols, model):
    """Every start-up check; returns (index, the language model's table entry)."""
    index = read_index(path)
    table = text_table(index, path)
    check_table(table, path, rows, cols, model)
    check_fingerprint(index, checkpoint_dir, path)
    return index, table
