# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.status_table: the fleet's status readings (playbooks/status.yml) as one table."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: status_table
short_description: The fleet's status readings as the lines of one table
version_added: 0.1.0
description:
  - One line per host of the readings C(playbooks/status.yml) takes (C(playbooks/files/status_probe.py)), with
    host, kind, serving state and since when, restarts in 24 h, liveness, image and the previous one,
    planned GMU, planned and actual KV pool, MemAvailable and MemFree against memwatch's thresholds,
    memwatch's last event, the next recycle, and the verdict (C(ok) or the problems).
options:
  _input:
    description: The readings, one mapping per host.
    type: list
    elements: dict
    required: true
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: The fleet's status
  ansible.builtin.debug:
    msg: "{{ rows | sparkops.appliance.status_table }}"
"""

RETURN = r"""
_value:
  description: The table's lines, a header first.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

COLUMNS = ("host", "kind", "state", "since", "restarts 24h", "liveness", "image (previous)", "GMU",
           "KV plan/actual GiB", "avail/free GiB (memwatch)", "memwatch last", "next recycle", "verdict")


def _num(value, fmt="%.3f"):
    if value is None:
        return "-"
    try:
        return fmt % float(value)
    except (TypeError, ValueError):
        return str(value)


def _tag(image):
    return str(image).rsplit(":", 1)[-1] if image else "-"


def row_cells(row):
    """The table cells of one reading."""
    event = row.get("memwatch_last_event") or {}
    return (
        str(row.get("host", "-")) + (" " + str(row["model"]) if row.get("model") else ""), str(row.get("kind", "-")),
        str(row.get("state") or "-"), str(row.get("since") or "-"), _num(row.get("restarts_24h"), "%d"),
        str(row.get("liveness") or "-"),
        "%s (%s)" % (_tag(row.get("image")), _tag(row.get("image_previous"))),
        _num(row.get("plan_gmu")),
        "%s/%s" % (_num(row.get("plan_kv_gib")), _num(row.get("actual_kv_gib"))),
        "%s/%s (%s, %s/%s)" % (_num(row.get("mem_available_gib"), "%.1f"), _num(row.get("mem_free_gib"), "%.1f"),
                               _num(row.get("memwatch_available_lt_gib"), "%g"),
                               _num(row.get("memwatch_available_and_free_available_lt_gib"), "%g"),
                               _num(row.get("memwatch_available_and_free_free_lt_gib"), "%g")),
        ("%s %s %s" % (event.get("ts", ""), event.get("event", ""), event.get("rule") or event.get("result") or "")).strip()
        or "-",
        str(row.get("next_recycle") or "-"),
        "; ".join(row.get("problems") or []) or "ok",
    )


def status_table(rows):
    """The lines of the table: a header, then one line per reading."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise AnsibleFilterError("status_table: expected a list of readings (mappings), got %r" % (rows,))
    cells = [COLUMNS] + [row_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return ["  ".join(c[i].ljust(widths[i]) for i in range(len(COLUMNS))).rstrip() for c in cells]


class FilterModule(object):
    """sparkops.appliance.status_table"""

    def filters(self):
        return {'status_table': status_table}
