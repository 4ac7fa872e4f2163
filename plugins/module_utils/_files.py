# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a small file whole through a temp file beside it and module.atomic_move. Private helper."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import tempfile


def write_text(module, path, text, mode=0o644):
    """Write text to a temp file in path's directory, then module.atomic_move it over path.

    atomic_move renames within the directory (readers see the old or the new file, never half of
    one) and keeps an existing file's owner, mode and SELinux context; `mode` applies to a new file.
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if not os.path.exists(path):
            os.chmod(tmp, mode)
        module.atomic_move(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
