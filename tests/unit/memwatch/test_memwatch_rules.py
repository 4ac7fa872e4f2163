"""The rules of SPEC §7 and the one-action-per-incident state machine, through replay.

Samples are (MemAvailable GiB, MemFree GiB). Defaults: A = avail < 6; B = avail < 10 AND free < 2;
5 consecutive samples fire; re-arm after 5 consecutive samples where neither rule holds.
"""
import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mwhelpers import trace

OK = (60, 30)            # healthy
CACHE_HEAVY = (60, 0.5)  # page cache: MemFree low, MemAvailable high -> not danger
A_ONLY = (5, 3)          # A holds, B does not (free >= 2)
B_ONLY = (8, 1)          # B holds, A does not (avail >= 6)
BOTH = (4, 1)            # both hold


def fire(mw, samples, **cfg):
    conf = mw.validate_config(cfg)
    return [(f.sample, f.rule) for f in mw.replay(io.StringIO(trace(samples)), conf)]


def test_fires_on_exactly_the_fifth_consecutive_sample_of_rule_a(mw):
    assert fire(mw, [OK] * 3 + [A_ONLY] * 4) == []
    assert fire(mw, [OK] * 3 + [A_ONLY] * 5) == [(8, "available")]
    # holding on: still one firing (one action per incident)
    assert fire(mw, [OK] * 3 + [A_ONLY] * 40) == [(8, "available")]


def test_fires_on_exactly_the_fifth_consecutive_sample_of_rule_b(mw):
    assert fire(mw, [B_ONLY] * 4) == []
    assert fire(mw, [OK, B_ONLY] + [B_ONLY] * 4) == [(6, "available_and_free")]


def test_both_rules_reaching_together_make_one_firing_reported_as_a(mw):
    assert fire(mw, [BOTH] * 12) == [(5, "available")]
    conf = mw.validate_config({})
    (firing,) = list(mw.replay(io.StringIO(trace([BOTH] * 5)), conf))
    assert firing.as_dict(details=True)["rules"] == ["available", "available_and_free"]


def test_page_cache_heavy_profile_never_fires(mw):
    # MemFree far below 2 GiB for an hour of samples, MemAvailable high: page cache, not danger.
    assert fire(mw, [CACHE_HEAVY] * 3600) == []
    # ... also when MemAvailable sits between A's and B's thresholds but MemFree is not short.
    assert fire(mw, [(7, 2.5)] * 100 + [(9.99, 2)] * 100) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(10, 120), st.floats(0, 1.99)), max_size=60))
def test_no_sample_with_available_at_or_above_10_gib_can_fire(mw, samples):
    assert fire(mw, samples) == []


def test_alternating_a_and_b_hits_do_not_share_a_counter(mw):
    # A and B alternate: 40 samples on which SOME rule holds, but neither holds twice in a row.
    assert fire(mw, [A_ONLY, B_ONLY] * 20) == []
    # Pairs: each rule holds at most 2 consecutive samples.
    assert fire(mw, [A_ONLY, A_ONLY, B_ONLY, B_ONLY] * 10) == []
    # B holding 4 then A holding 4: neither reaches 5.
    assert fire(mw, [B_ONLY] * 4 + [A_ONLY] * 4) == []
    # BOTH counts for both rules: B x3, BOTH x2 -> B has 5 (fires), A only 2.
    assert fire(mw, [B_ONLY] * 3 + [BOTH] * 2) == [(5, "available_and_free")]


def test_a_sample_where_the_rule_stops_holding_resets_its_counter(mw):
    assert fire(mw, [A_ONLY] * 4 + [OK] + [A_ONLY] * 4) == []
    assert fire(mw, [A_ONLY] * 4 + [OK] + [A_ONLY] * 5) == [(10, "available")]
    # B resets when MemFree recovers even though MemAvailable stays under 10 GiB
    assert fire(mw, [B_ONLY] * 4 + [(8, 2.0)] + [B_ONLY] * 4) == []


def test_thresholds_are_strict(mw):
    assert fire(mw, [(6, 3)] * 10) == []          # exactly 6 GiB available: A does not hold
    assert fire(mw, [(10, 1)] * 10) == []         # exactly 10 GiB available: B does not hold
    assert fire(mw, [(8, 2)] * 10) == []          # exactly 2 GiB free: B does not hold


def test_after_firing_rearms_only_after_recovery_samples_clear(mw):
    incident = [A_ONLY] * 5
    # Recovery interrupted after 4 clear samples: still disarmed, the next incident is not acted on.
    assert fire(mw, incident + [OK] * 4 + [A_ONLY] * 10) == [(5, "available")]
    # 5 clear samples re-arm; a new incident then needs 5 fresh holding samples.
    samples = incident + [OK] * 5 + [A_ONLY] * 4
    assert fire(mw, samples) == [(5, "available")]
    assert fire(mw, samples + [A_ONLY]) == [(5, "available"), (15, "available")]
    # Holding samples during the disarmed period count for nothing afterwards.
    assert fire(mw, [A_ONLY] * 30 + [OK] * 5 + [B_ONLY] * 5) == [(5, "available"), (40, "available_and_free")]


def test_recovery_and_firing_counts_are_configurable(mw):
    samples = [A_ONLY] * 3 + [OK] * 2 + [A_ONLY] * 3
    assert fire(mw, samples, consecutive_samples=3, recovery_samples=2) == [(3, "available"), (8, "available")]
    assert fire(mw, samples, consecutive_samples=3, recovery_samples=3) == [(3, "available")]
    assert fire(mw, [(20, 1)] * 6, available_and_free_available_lt_gib=24) == [(5, "available_and_free")]
    assert fire(mw, [(7, 3)] * 6, available_lt_gib=8) == [(5, "available")]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([OK, CACHE_HEAVY, A_ONLY, B_ONLY, BOTH]), max_size=80))
def test_firing_invariants(mw, samples):
    """Every firing ends a run of >= 5 samples of one rule; two firings are separated by a clear
    run of >= 5 samples; a 5-run of a rule after such a clear run (or at the start) fires."""
    holds_a = [s in (A_ONLY, BOTH) for s in samples]
    holds_b = [s in (B_ONLY, BOTH) for s in samples]
    firings = fire(mw, samples)
    for number, rule in firings:
        held = holds_a if rule == "available" else holds_b
        assert all(held[number - 5:number]), (number, rule)
    for (first, _r1), (second, _r2) in zip(firings, firings[1:]):
        between = [not (a or b) for a, b in zip(holds_a[first:second], holds_b[first:second])]
        runs = "".join("c" if c else "h" for c in between)
        assert "ccccc" in runs, (first, second)
    # Liveness: the first 5-run of either rule fires at its 5th sample.
    for i in range(4, len(samples)):
        if all(holds_a[i - 4:i + 1]) or all(holds_b[i - 4:i + 1]):
            assert firings and firings[0][0] == i + 1
            break
    else:
        assert firings == []


def test_replay_cli_without_config_file_prints_one_json_object_per_firing(mw, run_memwatch, tmp_path):
    body = "---\n" + trace([OK] * 2 + [A_ONLY] * 5 + [OK] * 5 + [B_ONLY] * 5) + "---\n\n---\n"
    path = tmp_path / "incident.trace"
    path.write_text(body)
    proc = run_memwatch("replay", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [json.loads(line) for line in lines] == [
        {"sample": 7, "rule": "available"}, {"sample": 17, "rule": "available_and_free"}]


def test_replay_cli_applies_a_config_file(run_memwatch, tmp_path):
    path = tmp_path / "t.trace"
    path.write_text(trace([(7, 3)] * 5))
    cfg = tmp_path / "memwatch.json"
    cfg.write_text(json.dumps({"available_lt_gib": 8}))
    assert run_memwatch("replay", str(path)).stdout == ""
    proc = run_memwatch("replay", "--config", str(cfg), str(path))
    assert proc.stdout == '{"sample": 5, "rule": "available"}\n'


def test_replay_rejects_a_snapshot_without_memavailable(run_memwatch, tmp_path):
    path = tmp_path / "bad.trace"
    path.write_text(trace([OK, OK]) + "---\nMemTotal: 1 kB\nMemFree: 1 kB\n")
    proc = run_memwatch("replay", str(path))
    assert proc.returncode == 2
    assert "trace sample 3 has no MemAvailable" in proc.stderr


def test_record_writes_a_trace_that_replays(mw, run_memwatch, tmp_path):
    from mwhelpers import meminfo
    src = tmp_path / "meminfo"
    src.write_text(meminfo(*A_ONLY))
    out = tmp_path / "rec.trace"
    proc = run_memwatch("record", "--meminfo", str(src), "--interval", "0.01", "--samples", "5", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.count("\n---\n") == 4
    assert [mw.parse_meminfo(t)["MemAvailable"] for t in mw.iter_trace(io.StringIO(text))] == [5 * 1024 * 1024] * 5
    assert json.loads(run_memwatch("replay", str(out)).stdout) == {"sample": 5, "rule": "available"}
    # appending to an existing trace keeps it valid
    run_memwatch("record", "--meminfo", str(src), "--interval", "0.01", "--samples", "2", "-o", str(out))
    assert len(list(mw.iter_trace(io.StringIO(out.read_text())))) == 7


def test_the_real_proc_meminfo_parses(mw):
    mem = mw.read_meminfo("/proc/meminfo")
    assert mem["MemTotal"] > mem["MemAvailable"] > 0
    assert "MemFree" in mem and "Cached" in mem
