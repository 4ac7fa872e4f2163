# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: docker_daemon_json
short_description: Merge settings into Docker's daemon.json, keeping every other key
description:
  - Reads the Docker engine's configuration file (C(/etc/docker/daemon.json)), merges O(settings)
    into it and writes it back only when the merged configuration differs from what is there.
  - "Objects are merged key by key at every depth (so C(runtimes: {nvidia: ...}) adds one runtime
    and keeps the others); any other value given in O(settings) replaces the one in the file.
    Keys that O(settings) does not name are kept as they are."
  - The file is compared as JSON, not as text, so a file that already holds the settings is not
    rewritten (its formatting is kept). A rewrite goes to a temporary file in the same directory
    that is then renamed over the original, so the engine never reads a half-written file.
  - A file that is not valid JSON, or whose top level is not an object, is refused with a message
    naming the file and the parse error, and is left untouched (the engine refuses to start with
    it as well).
  - The module does not restart the engine; notify a handler when it reports a change.
version_added: 0.1.0
author:
  - sparkops contributors (@sparkops)
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: full
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
options:
  path:
    description: The engine's configuration file.
    type: path
    default: /etc/docker/daemon.json
  settings:
    description: The settings to merge in (a JSON object).
    type: dict
    required: true
  mode:
    description: Permissions of a file this module creates (an existing file keeps its own).
    type: raw
    default: "0644"
"""

EXAMPLES = r"""
- name: Register the NVIDIA runtime with Docker
  sparkops.appliance.docker_daemon_json:
    settings:
      runtimes:
        nvidia:
          path: nvidia-container-runtime
          args: []
  notify: Restart Docker
"""

RETURN = r"""
config:
  description: The configuration after the merge (what the file holds, or would hold in check mode).
  returned: success
  type: dict
  sample: {"log-driver": "journald", "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
created:
  description: Whether the file did not exist before.
  returned: success
  type: bool
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native
from ansible_collections.sparkops.appliance.plugins.module_utils._files import write_text


class DaemonJsonError(Exception):
    """The existing file cannot be merged into (not JSON, or not an object)."""


def parse_config(text, path):
    """The file's text as a dict; empty or whitespace-only text counts as {}."""
    if not text.strip():
        return {}
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise DaemonJsonError(
            "%s is not valid JSON (%s); the Docker engine refuses to start with it as well. "
            "The file was left untouched: fix or remove it, then run again." % (path, exc))
    if not isinstance(config, dict):
        raise DaemonJsonError(
            "%s holds a JSON %s, not an object of settings; the Docker engine refuses it as well. "
            "The file was left untouched: fix or remove it, then run again." % (path, type(config).__name__))
    return config


def merge(current, settings):
    """A new dict: settings merged into current (objects key by key, anything else replaced)."""
    merged = dict(current)
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render(config):
    return json.dumps(config, indent=4) + "\n"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/docker/daemon.json"),
            settings=dict(type="dict", required=True),
            mode=dict(type="raw", default="0644"),
        ),
        supports_check_mode=True,
    )
    path = module.params["path"]
    mode = module.params["mode"]
    try:
        mode = int(mode, 8) if isinstance(mode, str) else int(mode)
    except ValueError:
        module.fail_json(msg="mode is %r; give an octal mode such as '0644'." % (module.params["mode"],))

    created = not os.path.exists(path)
    before_text = ""
    if not created:
        try:
            with open(path) as handle:
                before_text = handle.read()
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot read %s: %s" % (path, to_native(exc)))
    try:
        current = parse_config(before_text, path)
    except DaemonJsonError as exc:
        module.fail_json(msg=str(exc), path=path)

    merged = merge(current, module.params["settings"])
    changed = created or merged != current
    result = dict(changed=changed, config=merged, created=created, path=path)
    if changed:
        after_text = render(merged)
        result["diff"] = dict(before=before_text, after=after_text,
                              before_header=path if not created else "/dev/null", after_header=path)
        if not module.check_mode:
            if not os.path.isdir(os.path.dirname(path)):
                module.fail_json(msg="%s: the directory %s does not exist (is the Docker engine installed?)"
                                 % (path, os.path.dirname(path)))
            try:
                write_text(module, path, after_text, mode)
            except (IOError, OSError) as exc:
                module.fail_json(msg="cannot write %s: %s" % (path, to_native(exc)))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
