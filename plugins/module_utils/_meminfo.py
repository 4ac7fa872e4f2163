# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse /proc/meminfo. Private helper of sparkops.appliance."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

GIB = 2 ** 30


def parse_meminfo(text, with_counts=True):
    """Return {field: bytes} for each line of a /proc/meminfo text.

    Lines look like ``MemTotal:       127601232 kB``; values in kB are kibibytes. Fields without a
    unit (HugePages_Total) are returned as plain counts, or left out with ``with_counts=False``.
    Lines that do not parse raise ValueError naming the line, since a silently missing MemTotal
    would make a wrong memory plan.
    """
    fields = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts or len(parts) > 2:
            raise ValueError("meminfo line %d does not parse: %r" % (number, line))
        try:
            value = int(parts[0])
        except ValueError:
            raise ValueError("meminfo line %d has a non-integer value: %r" % (number, line))
        if len(parts) == 2:
            if parts[1] != "kB":
                raise ValueError("meminfo line %d has an unknown unit: %r" % (number, line))
            value *= 1024
        elif not with_counts:
            continue
        fields[name.strip()] = value
    return fields


def meminfo_gib(fields, name):
    """The field `name` of parsed meminfo in GiB (2^30 bytes), or raise KeyError naming it."""
    if name not in fields:
        raise KeyError("/proc/meminfo has no %s line" % name)
    return fields[name] / GIB
