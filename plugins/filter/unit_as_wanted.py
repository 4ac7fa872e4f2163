# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.unit_as_wanted: is a systemd unit already as ansible.builtin.systemd_service would leave it."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r"""
name: unit_as_wanted
short_description: Whether a systemd unit is already enabled and started (or not) as wanted
version_added: 0.1.0
author:
  - sparkops contributors (@sparkops)
description:
  - "Input: the C(units) that M(sparkops.appliance.files) returns (one C(systemctl show) per call)."
  - "Output: C(true) only when the unit is loaded, needs no daemon reload, and its state already
    is what M(ansible.builtin.systemd_service) would leave with O(enabled) and O(state): a role
    skips that call then (a re-converge that changes nothing saves the round trip). Anything else,
    a unit missing from the input or a state it cannot tell, gives C(false): the module runs and decides."
  - "O(state): C(started) wants C(ActiveState) C(active) or C(activating) (what the module counts as
    running), C(stopped) wants neither; C(restarted) and C(reloaded) always act, so they give C(false).
    O(enabled): C(true) wants C(UnitFileState=enabled), C(false) wants C(disabled)."
options:
  _input:
    description: The C(units) result of M(sparkops.appliance.files).
    type: dict
    required: true
  unit:
    description: The unit's full name, as given to M(sparkops.appliance.files) (e.g. C(memwatch.service)).
    type: str
    required: true
  enabled:
    description: The wanted enablement; omitted (C(null)) when the caller leaves it as it is.
    type: bool
  state:
    description: The wanted state (C(started), C(stopped), C(restarted), C(reloaded)); omitted when the caller leaves it.
    type: str
"""

EXAMPLES = r"""
when: not (written.units | sparkops.appliance.unit_as_wanted('memwatch.service', enabled=true, state='started'))
"""

RETURN = r"""
_value:
  description: Whether the unit is already as wanted.
  type: bool
"""

RUNNING = ("active", "activating")


def unit_as_wanted(units, unit, enabled=None, state=None):
    """True when systemd_service(name=unit, enabled=enabled, state=state) would change nothing."""
    props = (units or {}).get(unit)
    if not isinstance(props, dict):
        return False
    if props.get("LoadState") != "loaded" or props.get("NeedDaemonReload") != "no":
        return False
    if enabled is not None and props.get("UnitFileState") != ("enabled" if enabled else "disabled"):
        return False
    if state is None:
        return True
    running = props.get("ActiveState") in RUNNING
    if state == "started":
        return running
    if state == "stopped":
        return not running and props.get("ActiveState") is not None
    return False


class FilterModule(object):
    def filters(self):
        return {"unit_as_wanted": unit_as_wanted}
