# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
name: spark_summary
type: aggregate
short_description: Print, per host, what a run changed
version_added: 0.1.0
description:
  - At the end of a playbook run, prints for every host the tasks that changed something on it
    (in order, with the loop item where there is one), the tasks that failed, and a final line
    C(nothing changed) for hosts the run left as they were. Meant to sit beside the default
    stdout callback (enable it with C(callbacks_enabled)).
  - Stays silent when the stdout callback writes machine-readable output (C(json), C(jsonl)),
    so that output remains one parseable document.
author:
  - sparkops contributors (@sparkops)
requirements:
  - enabled in configuration (callbacks_enabled)
"""

from collections import OrderedDict

from ansible import constants as C
from ansible.plugins.callback import CallbackBase

MACHINE_READABLE = ('json', 'jsonl')


class CallbackModule(CallbackBase):
    """Collect changed and failed task names per host and print them at the end."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sparkops.appliance.spark_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super(CallbackModule, self).__init__()
        self._hosts = OrderedDict()

    def _record(self, result, kind):
        host = result._host.get_name()
        entry = self._hosts.setdefault(host, {"changed": [], "failed": []})
        label = result._task.get_name()
        item = result._result.get("_ansible_item_label", result._result.get("item"))
        if item is not None and kind == "changed":
            label = "%s (%s)" % (label, item)
        if label not in entry[kind]:
            entry[kind].append(label)

    def _touch(self, result):
        self._hosts.setdefault(result._host.get_name(), {"changed": [], "failed": []})

    def v2_runner_on_ok(self, result):
        if result._result.get("changed", False) and not result._result.get("results"):
            self._record(result, "changed")
        else:
            self._touch(result)

    def v2_runner_item_on_ok(self, result):
        if result._result.get("changed", False):
            self._record(result, "changed")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if not ignore_errors:
            self._record(result, "failed")

    def v2_runner_on_unreachable(self, result):
        self._record(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._touch(result)

    def v2_playbook_on_stats(self, stats):
        stdout_callback = str(C.DEFAULT_STDOUT_CALLBACK or '').rsplit('.', 1)[-1]
        if not self._hosts or stdout_callback in MACHINE_READABLE:
            return
        self._display.banner("WHAT WAS DONE, PER HOST")
        for host, entry in sorted(self._hosts.items()):
            if entry["failed"]:
                state = "FAILED"
            elif entry["changed"]:
                state = "%d change(s)" % len(entry["changed"])
            else:
                state = "nothing changed"
            self._display.display("%s: %s" % (host, state))
            for label in entry["changed"]:
                self._display.display("  changed: %s" % label)
            for label in entry["failed"]:
                self._display.display("  failed:  %s" % label)
