# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Free disk space of the filesystem that holds (or will hold) a path. Private helper."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os


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
