"""Audits at the sizes real deployments have: ERO on 1,000,000 members under the default
release controls (second moments: 28 weight columns aggregated per row), through both
services on loopback with mutual TLS and the process executor, as `ppre audit --local`
runs them. What it checks is that nothing breaks at this size (streams, memory, the
ledger, the report), not a time: the timings are in bench/RESULTS.md. The keys are the
tests' 1024-bit ones (`tests.helpers.TEST_BITS`, `allow_insecure`): the row count is what
is tested, not the key size (the encodings, noise and finishing are those of 2048-bit
keys; the 2048-bit run is the benchmark's)."""
from __future__ import annotations

import math
from functools import partial

import pytest

from tests.helpers import TEST_BITS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.mark.cost(390)
def test_ero_at_one_million_members_completes_under_the_default_controls(tmp_path, monkeypatch):
    import ppre.local
    from common.execution.parallel import ProcessExecutor, worker_count
    from ppre import audit_local
    from ppre.synth import SynthConfig, synthesize
    monkeypatch.setattr(ppre.local, "local_services",
                        partial(ppre.local.local_services, modulus_bits=TEST_BITS, allow_insecure=True))
    data = synthesize(SynthConfig(members=1_000_000, seed=2))
    executor = ProcessExecutor(worker_count())
    try:
        report = audit_local(data.ero, members=data.members, self_id=data.self_id, metric="ero",
                             privacy_ledger=tmp_path / "ledger.json", history=False, executor=executor,
                             timeout=7200.0)
    finally:
        executor.shutdown()
    assert report.n_matched == 1_000_000
    assert report.release["controls"] is True and report.release["interval_from"].startswith("second moments")
    for g in report.groups:
        for v in (g.estimate, g.ci_low, g.ci_high):
            assert v is not None and 0.0 <= v <= 1.0 and math.isfinite(v)
    # at this size the large groups' intervals are narrow and informative
    white = report.group("white")
    assert white.informative and white.ci_high - white.ci_low < 0.01
    # the verdict agrees with its own table: the compared pair's difference is a reported one
    compared = report.verdict.compared
    assert compared is not None
    assert any(d.estimate is not None and abs(d.estimate - compared["estimate"]) < 1e-9
               for d in report.differences)
