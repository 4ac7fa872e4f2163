import pytest

from ansible_collections.sparkops.appliance.plugins.module_utils._meminfo import (
    GIB,
    meminfo_gib,
    parse_meminfo,
)

# MemTotal of a DGX Spark as Linux reports it (SPEC §1: ~121.69 GiB).
SPARK = """MemTotal:       127601232 kB
MemFree:         3012404 kB
MemAvailable:   98765432 kB
Cached:         61234567 kB
HugePages_Total:       0
"""


def test_parses_kib_fields_to_bytes_and_counts_as_counts():
    fields = parse_meminfo(SPARK)
    assert fields["MemTotal"] == 127601232 * 1024
    assert fields["HugePages_Total"] == 0
    assert round(meminfo_gib(fields, "MemTotal"), 2) == 121.69
    assert meminfo_gib(fields, "MemFree") == 3012404 * 1024 / GIB


@pytest.mark.parametrize("text, needle", [
    ("MemTotal 123 kB\n", "line 1 does not parse"),
    ("MemTotal: lots kB\n", "non-integer"),
    ("MemTotal: 12 MB\n", "unknown unit"),
    ("MemTotal:\n", "does not parse"),
])
def test_rejects_malformed_lines(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_meminfo(text)


def test_missing_field_is_named():
    with pytest.raises(KeyError, match="MemAvailable"):
        meminfo_gib(parse_meminfo("MemTotal: 1 kB\n"), "MemAvailable")
