"""unit_as_wanted: true only where ansible.builtin.systemd_service would change nothing."""
import pytest

from ansible_collections.sparkops.appliance.plugins.filter.unit_as_wanted import unit_as_wanted


def props(active="active", file_state="enabled", load="loaded", reload="no"):
    return {"u.service": {"LoadState": load, "ActiveState": active, "UnitFileState": file_state,
                          "NeedDaemonReload": reload}}


@pytest.mark.parametrize("units, enabled, state, expected", [
    (props(), True, "started", True),
    (props(active="activating"), True, "started", True),     # systemd_service counts it as running
    (props(active="inactive"), True, "started", False),      # stopped (memwatch's stop): start it
    (props(active="failed"), True, "started", False),
    (props(active="deactivating"), True, "started", False),
    (props(file_state="disabled"), True, "started", False),  # not enabled at boot
    (props(file_state="static"), True, "started", False),    # the module decides
    (props(file_state="disabled", active="inactive"), False, "stopped", True),
    (props(file_state="disabled"), False, "stopped", False),
    (props(), None, None, True),
    (props(), True, "restarted", False),                      # always acts
    (props(), True, "reloaded", False),
    (props(load="not-found", active="inactive", file_state=""), True, "started", False),
    (props(reload="yes"), True, "started", False),           # the file changed under systemd
    ({}, True, "started", False),                             # systemd could not be asked
    (None, True, "started", False),
    ({"other.service": props()["u.service"]}, True, "started", False),
])
def test_as_wanted(units, enabled, state, expected):
    assert unit_as_wanted(units, "u.service", enabled=enabled, state=state) is expected
