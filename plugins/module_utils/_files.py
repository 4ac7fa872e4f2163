# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a small file whole through a temp file beside it and module.atomic_move; keep the record of
the paths the collection wrote. Private helper."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import tempfile

from ansible_collections.sparkops.appliance.plugins.module_utils._owned import read_record, record_text


def write_bytes(module, path, data, mode=0o644, before_move=None, keep_dest_attrs=True):
    """Write data to a temp file in path's directory, then module.atomic_move it over path.

    atomic_move renames within the directory (readers see the old or the new file, never half of
    one) and, with keep_dest_attrs, gives the new file an existing file's owner, mode and SELinux
    context; `mode` applies to a new file (None: the caller sets it after the rename). before_move(tmp),
    when given, runs on the complete temp file before the rename (set attributes, validate; a
    fail_json there leaves the old file and no temp file); attributes it sets survive the rename only
    with keep_dest_attrs=False.

    A file atomic_move creates gets 0666 less the umask after the rename: the rename runs under
    umask 077, so a new file is never readable by others, not even before its mode is set (a new
    0600 environment file was 0644 for that moment).
    """
    directory = os.path.dirname(path) or "."
    creating = not os.path.lexists(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if creating and mode is not None:
            os.chmod(tmp, mode)
        if before_move is not None:
            before_move(tmp)
        umask = os.umask(0o077) if creating else None
        try:
            module.atomic_move(tmp, path, keep_dest_attrs=keep_dest_attrs)
        finally:
            if umask is not None:
                os.umask(umask)
        if creating and mode is not None:
            os.chmod(path, mode)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(module, path, text, mode=0o644):
    """write_bytes of text, UTF-8."""
    write_bytes(module, path, text.encode("utf-8"), mode)


def drop_from_record(module, record, paths):
    """Take paths, and whatever the record lists under them, out of the ownership record (a path the
    collection removed is no longer its own). Nothing is written when the record lists none of them.
    Returns whether it was written."""
    known = read_record(record)
    gone = set(p for p in known for top in paths if p == top or p.startswith(top.rstrip("/") + "/"))
    if not gone:
        return False
    write_text(module, record, record_text(known - gone))
    return True


def add_to_record(module, record, paths):
    """Add paths to the ownership record at `record` (docs/runtime.md, "What the collection owns on
    a host"), written whole through write_bytes; its folder is made (0755) when missing. Nothing is
    written when the record lists every path already. Returns whether it was written."""
    known = read_record(record)
    if set(paths) <= known:
        return False
    directory = os.path.dirname(record)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    write_text(module, record, record_text(known | set(paths)))
    return True
