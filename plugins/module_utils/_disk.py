# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Free disk space of the filesystem that holds (or will hold) a path, and the bytes of a tree. Private helper."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat


def filesystem_space(path):
    """Return (free_bytes, total_bytes, measured_path) for the filesystem of `path`.

    A path that does not exist yet (a model directory before the first fetch) is measured at its
    nearest existing parent directory, which is where it will be created.
    """
    measured = os.path.abspath(path)
    while not os.path.isdir(measured):
        parent = os.path.dirname(measured)
        if parent == measured:
            break
        measured = parent
    st = os.statvfs(measured)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize, measured


def tree_bytes(directory, exclude=()):
    """Bytes of the regular files under `directory`, as the memory plan counts a checkpoint.

    Symlinks are followed (a Hugging Face snapshot links its files into ``blobs/``), each real
    directory is walked once (a link back up the tree is not a loop), entries whose name starts
    with a dot are skipped at any depth (the verify manifest, caches, temporary files), and so are
    the paths in `exclude` (compared by their real path: the PLE pack kept beside the weights).
    Broken links and entries that vanish while walking count nothing.
    """
    excluded = set(os.path.realpath(p) for p in exclude)
    seen = set()
    total = 0
    for root, dirs, files in os.walk(directory, followlinks=True):
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs[:] = [d for d in dirs if not d.startswith(".") and os.path.realpath(os.path.join(root, d)) not in excluded]
        for name in files:
            path = os.path.join(root, name)
            if name.startswith(".") or os.path.realpath(path) in excluded:
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total
