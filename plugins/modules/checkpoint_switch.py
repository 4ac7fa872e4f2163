#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
---
module: checkpoint_switch
short_description: Switch a staged checkpoint copy in, back out, or release the copy it replaced
version_added: "0.1.0"
description:
  - A checkpoint update is fetched and verified beside the copy being served, in I(staged); this
    module moves the copies by renaming directories on one file system (each rename is atomic; the
    served path is missing only between the two renames of a switch).
  - C(state=switched) puts the staged copy at I(path) and keeps the copy it replaces as
    I(previous). The staged copy must be verified (its fingerprint is the one its last full
    verification wrote, at I(revision) when given); an unfinished one is refused.
  - C(state=switched_back) undoes a switch, putting I(previous) back at I(path) and the newer copy
    back at I(staged) (a later switch moves it in again without fetching or hashing).
  - C(state=released) removes I(previous) (after the new copy passed its gate), renamed first to
    C(<previous>.removing) so that a half-removed copy is never switched back to.
  - A run interrupted between the two renames (I(path) missing, or the empty directory that
    C(docker run --volume) creates for a missing source, with I(staged) and I(previous) both
    there) is finished by C(switched) and undone by C(switched_back).
  - Each state is a no-op where there is nothing to do (nothing staged, nothing to switch back or
    release).
options:
  path:
    description: The checkpoint directory the server loads (checkpoint_dir).
    type: path
    required: true
  state:
    description: C(switched), C(switched_back) or C(released).
    type: str
    choices: [switched, switched_back, released]
    required: true
  staged:
    description: Where the new copy is staged. Default C(<path>.staged).
    type: path
  previous:
    description: Where the replaced copy is kept until it is released. Default C(<path>.previous).
    type: path
  revision:
    description: With C(state=switched), the revision the staged copy must be verified at.
    type: str
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details: The renames and the removal are reported, not done.
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
- name: Serve the staged revision (the server must restart to load it)
  sparkops.appliance.checkpoint_switch:
    path: /srv/sparkops/models/my-model
    state: switched
    revision: 4567cdef4567cdef4567cdef4567cdef4567cdef

- name: The gate failed - the previous copy back
  sparkops.appliance.checkpoint_switch:
    path: /srv/sparkops/models/my-model
    state: switched_back

- name: The gate passed - free the previous copy's disk
  sparkops.appliance.checkpoint_switch:
    path: /srv/sparkops/models/my-model
    state: released
"""

RETURN = r"""
actions:
  description: What was done (or, in check mode, would be), in order, e.g. C(rename /m -> /m.previous).
  returned: always
  type: list
  elements: str
before:
  description: What each of I(path), I(staged) and I(previous) was before (C(present), C(empty) or C(absent)).
  returned: always
  type: dict
after:
  description: The same after this run.
  returned: always
  type: dict
staged:
  description: Whether a staged copy waits at I(staged) after this run.
  returned: always
  type: bool
switched:
  description: >-
    Whether I(path) holds a copy switched in and not yet released (I(previous) is there): a server
    started before the switch still runs the previous copy and must restart to load this one.
  returned: always
  type: bool
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.appliance.plugins.module_utils._checkpoint import CheckpointError, intact

PRESENT = "present"
EMPTY = "empty"
ABSENT = "absent"


def what(path):
    """present, absent, or empty: a real directory holding nothing (what docker --volume makes of a
    missing source, or a staging directory nothing was put in yet), which counts as not there."""
    if not os.path.lexists(path):
        return ABSENT
    if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
        return EMPTY
    return PRESENT


def plan(state, path, staged, previous, revision):
    """The steps, as (verb, source, target) with verb rename or remove, for one state from the layout."""
    d, s, p = what(path), what(staged), what(previous)
    if state == "switched":
        if s != PRESENT:
            if d != PRESENT and p == PRESENT:
                raise CheckpointError(
                    "%s is missing and nothing is staged at %s; %s holds the copy served before the last switch: "
                    "put it back with tasks_from: switch_back (state=switched_back)" % (path, staged, previous))
            return []
        if not intact(staged, revision):
            raise CheckpointError(
                "the staged copy %s is not verified%s (a fetch into it did not finish, or a file changed since): "
                "nothing was switched. Run the checkpoint role (site.yml) to finish and verify it, then switch again"
                % (staged, " at revision %s (checkpoint_revision)" % revision if revision else ""))
        if d != PRESENT:  # finish an interrupted switch (or a first move into an empty place)
            return [("rename", staged, path)]
        if p == PRESENT:
            raise CheckpointError(
                "%s still holds the copy served before the last switch (not released), so %s cannot be kept "
                "there: run tasks_from: release (state=released) once the copy at %s has passed its gate, or "
                "tasks_from: switch_back" % (previous, path, path))
        return [("rename", path, previous), ("rename", staged, path)]
    if state == "switched_back":
        if p != PRESENT:
            if d != PRESENT and s == PRESENT:
                raise CheckpointError(
                    "%s is missing and there is no previous copy at %s to put back; the staged copy at %s can be "
                    "switched in with tasks_from: switch (state=switched)" % (path, previous, staged))
            return []
        if d != PRESENT:  # finish an interrupted switch back (or undo an interrupted switch)
            return [("rename", previous, path)]
        if s == PRESENT:
            raise CheckpointError(
                "%s holds a newer staged copy while %s holds the copy served before the last switch: switching "
                "back would need a third place. Remove the staged copy (or release the previous one) first"
                % (staged, previous))
        return [("rename", path, staged), ("rename", previous, path)]
    # released
    steps = []
    removing = previous + ".removing"
    if os.path.lexists(removing):
        steps.append(("remove", removing, None))
    if p != ABSENT:
        if d != PRESENT:
            raise CheckpointError(
                "%s is missing (a switch was interrupted between its two renames): finish it with tasks_from: "
                "switch or undo it with tasks_from: switch_back before releasing %s" % (path, previous))
        steps += [("rename", previous, removing), ("remove", removing, None)]
    return steps


def simulate(layout, steps):
    after = dict(layout)
    for verb, src, dst in steps:
        if verb == "rename":
            after[dst], after[src] = after[src], ABSENT
        elif src in after:
            after[src] = ABSENT
    return after


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run(module):
    p = module.params
    path = p["path"].rstrip("/") or "/"
    staged = p["staged"] or path + ".staged"
    previous = p["previous"] or path + ".previous"
    if len(set([path, staged, previous])) != 3:
        raise CheckpointError("path, staged and previous must be three different directories (got %s, %s, %s)"
                              % (path, staged, previous))
    names = {path: "path", staged: "staged", previous: "previous"}
    layout = dict((d, what(d)) for d in (path, staged, previous))
    steps = plan(p["state"], path, staged, previous, p["revision"])
    after = simulate(layout, steps)
    result = dict(
        changed=bool(steps),
        actions=["%s %s%s" % (verb, src, " -> " + dst if dst else "") for verb, src, dst in steps],
        before=dict((names[d], v) for d, v in layout.items()),
        after=dict((names[d], after.get(d, ABSENT)) for d in (path, staged, previous)),
        diff={"before": "".join("%s: %s\n" % (d, layout[d]) for d in (path, staged, previous)),
              "after": "".join("%s: %s\n" % (d, after.get(d, ABSENT)) for d in (path, staged, previous))},
    )
    result["staged"] = result["after"]["staged"] == PRESENT
    result["switched"] = result["after"]["previous"] == PRESENT and result["after"]["path"] == PRESENT
    if module.check_mode:
        return result
    for verb, src, dst in steps:
        if verb == "rename":
            # os.rename, not module.atomic_move: these are directories, and a rename within the
            # directory is the atomic step (a copy across file systems is refused, not done).
            os.rename(src, dst)
            fsync_dir(os.path.dirname(dst) or ".")
        else:
            shutil.rmtree(src)
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", required=True, choices=["switched", "switched_back", "released"]),
            staged=dict(type="path"),
            previous=dict(type="path"),
            revision=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except CheckpointError as e:
        module.fail_json(msg=str(e))
    except (IOError, OSError) as e:
        module.fail_json(msg="checkpoint switch (%s) of %s: %s" % (module.params["state"], module.params["path"], e))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
