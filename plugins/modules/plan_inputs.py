#!/usr/bin/python
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: plan_inputs
short_description: Read on a Spark what the memory plan measures, in one call
version_added: 0.1.0
description:
  - Reads the host values the memory plan (SPEC §3) is computed from, in one round trip, for the
    C(sparkops.appliance.memory_plan) role - MemTotal, whether the checkpoint directory exists, the
    bytes of its weights, the size of the PLE pack, and the model's C(config.json).
  - Each reading is asked for separately; what is not asked for is returned as C(null).
  - Changes nothing on the host.
extends_documentation_fragment:
  - sparkops.appliance.read_only
author:
  - sparkops contributors (@sparkops)
options:
  checkpoint_dir:
    description: The checkpoint directory. Empty means there is none to read.
    type: str
    default: ""
  measure_weights:
    description:
      - Return RV(weight_bytes), the bytes of the regular files under I(checkpoint_dir). Symlinks
        are followed (a Hugging Face snapshot links into C(blobs/)); entries whose name starts with
        a dot are skipped at any depth (the verify manifest, caches); so is I(ple_file).
    type: bool
    default: false
  read_config:
    description: Return RV(model_config), the parsed C(config.json) of I(checkpoint_dir).
    type: bool
    default: false
  ple_file:
    description: The PLE pack. Empty means there is none.
    type: str
    default: ""
  measure_ple:
    description: Return RV(ple_bytes), the size of I(ple_file) when it is a regular file.
    type: bool
    default: false
  read_meminfo:
    description: Return RV(mem_total_gib) from I(meminfo_path).
    type: bool
    default: false
  meminfo_path:
    description: File to read meminfo from. Tests may point it at a prepared file.
    type: path
    default: /proc/meminfo
notes:
  - Replaces five read-only tasks (slurp, stat, find, stat, slurp) so that a re-converge pays one
    connection here instead of five.
"""

EXAMPLES = r"""
- name: Read the host
  sparkops.appliance.plan_inputs:
    checkpoint_dir: /srv/sparkops/models/gemma
    measure_weights: true
    read_config: true
    ple_file: /srv/sparkops/models/gemma.ple
    measure_ple: true
  register: measured
"""

RETURN = r"""
checkpoint_isdir:
  description: Whether I(checkpoint_dir) is a directory (symlinks followed).
  returned: always
  type: bool
weight_bytes:
  description: Bytes of the checkpoint's weights (see I(measure_weights)); null when not asked or no directory.
  returned: always
  type: int
ple_bytes:
  description: Size of I(ple_file); null when not asked or not a regular file.
  returned: always
  type: int
model_config:
  description: The parsed C(config.json); null when not asked or not a regular file.
  returned: always
  type: dict
mem_total_gib:
  description: MemTotal in GiB (2^30 bytes, unrounded); null when not asked.
  returned: always
  type: float
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.appliance.plugins.module_utils._disk import tree_bytes
from ansible_collections.sparkops.appliance.plugins.module_utils._meminfo import meminfo_gib, parse_meminfo


def read(params):
    """The readings asked for in `params`; raises ValueError with a message for the user."""
    checkpoint_dir = params["checkpoint_dir"]
    ple_file = params["ple_file"]
    for name in ("checkpoint_dir", "ple_file"):
        if params[name] and not os.path.isabs(params[name]):
            raise ValueError("%s must be an absolute path, not %r" % (name, params[name]))
    result = {"checkpoint_isdir": bool(checkpoint_dir) and os.path.isdir(checkpoint_dir),
              "weight_bytes": None, "ple_bytes": None, "model_config": None, "mem_total_gib": None}
    if params["measure_weights"] and result["checkpoint_isdir"]:
        result["weight_bytes"] = tree_bytes(checkpoint_dir, exclude=[ple_file] if ple_file else [])
    if params["read_config"] and result["checkpoint_isdir"]:
        config = os.path.join(checkpoint_dir, "config.json")
        if os.path.isfile(config):
            with open(config, "rb") as handle:
                try:
                    result["model_config"] = json.loads(handle.read().decode("utf-8"))
                except ValueError as exc:
                    raise ValueError("%s is not JSON (%s): fix or re-fetch the checkpoint" % (config, exc))
            if not isinstance(result["model_config"], dict):
                raise ValueError("%s holds no JSON object: fix or re-fetch the checkpoint" % config)
    if params["measure_ple"] and ple_file and os.path.isfile(ple_file):
        result["ple_bytes"] = os.stat(ple_file).st_size
    if params["read_meminfo"]:
        try:
            with open(params["meminfo_path"]) as handle:
                result["mem_total_gib"] = meminfo_gib(parse_meminfo(handle.read()), "MemTotal")
        except (IOError, OSError, KeyError) as exc:
            raise ValueError("cannot read MemTotal from %s: %s" % (params["meminfo_path"], exc))
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            checkpoint_dir=dict(type="str", default=""),
            measure_weights=dict(type="bool", default=False),
            read_config=dict(type="bool", default=False),
            ple_file=dict(type="str", default=""),
            measure_ple=dict(type="bool", default=False),
            read_meminfo=dict(type="bool", default=False),
            meminfo_path=dict(type="path", default="/proc/meminfo"),
        ),
        supports_check_mode=True,
    )
    try:
        result = read(module.params)
    except (ValueError, OSError) as exc:
        module.fail_json(msg="plan_inputs: %s" % exc)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
