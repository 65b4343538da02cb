"""Audits at the sizes real deployments have: ERO on 1,000,000 members (the `long` tier;
the suite runs the same assertions on 100,000) under the default release controls (second
moments: 28 weight columns aggregated per row), through both services on loopback with
mutual TLS and the process executor, as `ppre audit --local` runs them. What it checks is
that nothing breaks at this size (streams, memory, the ledger, the report), not a time:
the timings are in bench/RESULTS.md. The keys are the tests' 1024-bit ones
(`PPRE_TEST_KEY_BITS`, tests/conftest.py): the row count is what is tested, not the key
size (the encodings, noise and finishing are those of 2048-bit keys; the 2048-bit run is
the benchmark's)."""
from __future__ import annotations

import math

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

#: the interval white's group (about 60% of the members) must fit at 1,000,000 members;
#: at n members the bound is this times sqrt(1,000,000 / n)
WIDTH_AT_1M = 0.01


@pytest.mark.parametrize("members", [
    pytest.param(1_000_000, marks=[pytest.mark.long, pytest.mark.cost(390)], id="1M"),
    pytest.param(100_000, marks=pytest.mark.cost(15), id="100k")])
def test_ero_at_production_size_completes_under_the_default_controls(members, tmp_path):
    from common.execution.parallel import ProcessExecutor, worker_count
    from ppre import audit_local
    from ppre.synth import SynthConfig, synthesize
    data = synthesize(SynthConfig(members=members, seed=2))
    executor = ProcessExecutor(worker_count())
    try:
        report = audit_local(data.ero, members=data.members, self_id=data.self_id, metric="ero",
                             privacy_ledger=tmp_path / "ledger.json", history=False, executor=executor,
                             timeout=7200.0)
    finally:
        executor.shutdown()
    assert report.n_matched == members
    assert report.release["controls"] is True and report.release["interval_from"].startswith("second moments")
    for g in report.groups:
        for v in (g.estimate, g.ci_low, g.ci_high):
            assert v is not None and 0.0 <= v <= 1.0 and math.isfinite(v)
    # at this size the large groups' intervals are narrow and informative (a width that
    # shrinks as 1/sqrt(members))
    white = report.group("white")
    assert white.informative and white.ci_high - white.ci_low < WIDTH_AT_1M * math.sqrt(1_000_000 / members)
    # the verdict agrees with its own table: the compared pair's difference is a reported one
    # (the verdict names the pair higher group first, the table in its own order)
    compared = report.verdict.compared
    assert compared is not None
    reported = {f"{d.a} - {d.b}": d.estimate for d in report.differences if d.estimate is not None}
    reported.update({f"{d.b} - {d.a}": -d.estimate for d in report.differences if d.estimate is not None})
    assert reported.get(compared["label"]) == pytest.approx(compared["estimate"], abs=1e-9), \
        (compared, report.differences)
