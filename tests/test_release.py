"""The Tester's release controls (SPEC.md section 8; tester_service/release.py).

Each control is shown to act: the audit it should refuse is refused with a reason that
names the control, the cell it should withhold never reaches the Test-Client, the noise
is on every aggregate the Test-Client decrypts, and the budget stops the audit after
the last one it allows, across dataset names and restarts. The attacks these controls
defeat run through the real services in tests/attacks/.
"""
from __future__ import annotations

import dataclasses
import json
import math
import threading

import numpy as np
import pytest

from client_service.datasets import DatasetRegistry
from client_service.protocol import ClientSession
from common import encoding
from common.errors import InputError, ProtocolError
from common.races import RACES
from ppre.cli import main as ppre_main
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.release import (BudgetExhausted, PrivacyAccountant, ReleasePolicy, ReleaseRefused,
                                    gaussian_slots, rho_to_epsilon)
from tester_service.server import run_audit
from tests.helpers import TEST_BITS, make_inputs, run_sessions

SPEC = AuditSpec(metric="ero", client_dataset="d", bootstrap=20, seed=1)


def _audit(tester_df, client_df, release, *, spec=SPEC, tap=None, charge=None, loader=None):
    def load(name, metric):
        frame = client_df.copy()
        frame["member_id"] = frame["member_id"].astype(str)
        return frame

    tester = TesterSession(spec, tester_df, min_modulus_bits=TEST_BITS, release=release, charge=charge)
    client = ClientSession(loader or load, modulus_bits=TEST_BITS, allow_insecure=True)
    try:
        return run_sessions(tester, client, tap), tester, client
    finally:
        tester.close()
        client.close()


# ---------------------------------------------------------------- the policy and the accountant
def test_policy_refuses_impossible_settings_naming_the_parameter():
    with pytest.raises(InputError, match="min intersection"):
        ReleasePolicy(min_intersection=0)
    with pytest.raises(InputError, match="min effective size"):
        ReleasePolicy(min_effective_size=-1)
    with pytest.raises(InputError, match="noise rho"):
        ReleasePolicy(rho=-0.5)
    with pytest.raises(InputError, match="exceeds the whole budget"):
        ReleasePolicy(rho=3.0, budget=2.0)
    with pytest.raises(InputError, match="headroom"):
        ReleasePolicy(rho=1e-15, budget=1.0).sigmas(2)


def test_noise_multipliers_spend_exactly_the_audits_rho():
    """Each release of C components with multiplier σ costs C/σ² (zCDP, sensitivity √2
    per component, module docstring); the estimate, the groups and the noisy effective
    sizes together cost ρ, and so do the probabilistic count's estimate and sizes."""
    policy = ReleasePolicy(rho=0.7, budget=5)
    for c in (1, 2, 9):
        s0, sb = policy.sigmas(c)
        assert c / s0**2 + c / sb**2 + 1 / policy.threshold_sigma()**2 == pytest.approx(0.7)
        assert c / policy.single_sigma(c)**2 + 1 / policy.threshold_sigma()**2 == pytest.approx(0.7)
    assert ReleasePolicy.off().sigmas(2) == (0.0, 0.0)
    assert rho_to_epsilon(1.0, 1e-6) == pytest.approx(1 + 2 * math.sqrt(math.log(1e6)))


def test_gaussian_slots_have_the_asked_spread_and_stay_in_their_slots():
    draws = [gaussian_slots([1000.0, 0.0, 50.0], 64) for _ in range(4000)]
    slots = np.array([encoding.SlotLayout(64, 3).unpack(d) for d in draws], dtype=float)
    assert np.std(slots[:, 0]) == pytest.approx(1000, rel=0.06)
    assert np.all(slots[:, 1] == 0)
    assert np.std(slots[:, 2]) == pytest.approx(50, rel=0.06)
    assert abs(np.mean(slots[:, 0])) < 60


def test_accountant_refuses_the_audit_that_would_overspend_and_keeps_its_ledger(tmp_path):
    ledger = tmp_path / "ledger.json"
    acc = PrivacyAccountant(2.0, ledger)
    assert acc.charge("client-a", 1.0) == pytest.approx(1.0)
    assert acc.charge("client-a", 1.0) == pytest.approx(0.0)
    with pytest.raises(BudgetExhausted, match="client-a.*needs rho 1, 0 of 2 is left"):
        acc.charge("client-a", 1.0)
    assert acc.charge("client-b", 1.0) == pytest.approx(1.0)  # budgets are per identity
    # a restart (a new accountant over the same ledger) keeps what was spent
    again = PrivacyAccountant(2.0, ledger)
    assert again.spent("client-a") == pytest.approx(2.0)
    with pytest.raises(BudgetExhausted):
        again.check("client-a", 0.5)
    assert json.loads(ledger.read_text()) == {"client-a": 2.0, "client-b": 1.0}  # no member-level data
    ledger.write_text("[1, 2]")
    with pytest.raises(InputError, match="ledger"):
        PrivacyAccountant(2.0, ledger)


def test_concurrent_audits_of_one_identity_cannot_overspend():
    acc = PrivacyAccountant(10.0)
    spent, refused = [], []

    def spend():
        for _ in range(20):
            try:
                acc.charge("c", 0.5)
                spent.append(1)
            except BudgetExhausted:
                refused.append(1)

    threads = [threading.Thread(target=spend) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(spent) == 20 and len(refused) == 60
    assert acc.spent("c") == pytest.approx(10.0)


# ---------------------------------------------------------------- the intersection
def test_a_small_intersection_is_refused_and_names_the_control():
    tester, client = make_inputs(300, 300, 60, seed=2)
    with pytest.raises(ReleaseRefused, match=r"60 distinct members.*100 or more \(--min-intersection\)"):
        _audit(tester, client, ReleasePolicy())
    result, _, _ = _audit(tester, client, dataclasses.replace(ReleasePolicy(), min_intersection=60))
    assert result.n_matched == 60


def test_a_member_repeated_in_a_unique_id_dataset_is_a_protocol_error():
    """A Test-Client that repeats its target would multiply the target's weight past
    what the noise was calibrated for; the Tester counts rows per joined member."""
    tester, client = make_inputs(300, 300, 200, seed=3)
    target = client.iloc[[0] * 30]
    crafted = client.iloc[1:].copy()
    import pandas as pd
    crafted = pd.concat([crafted, target], ignore_index=True)

    def loader(name, metric):
        frame = crafted.copy()
        frame["member_id"] = frame["member_id"].astype(str)
        return frame

    with pytest.raises(ProtocolError, match="more than one row"):
        _audit(tester, client, ReleasePolicy.off(), loader=loader)


# ---------------------------------------------------------------- suppression
def test_cells_below_the_effective_size_are_withheld_not_released():
    """One-hot probabilities with 8 'aian' members: its cell's effective size is 8 < 30.
    Its ciphertexts are replaced before masking; without the control the Test-Client
    reads the group's rate."""
    tester, client = make_inputs(400, 400, 400, seed=4, one_hot=True)
    groups = list(RACES)
    aian = groups.index("aian")
    arg = tester[groups].to_numpy().argmax(axis=1)
    keep = np.flatnonzero(arg != aian).tolist() + np.flatnonzero(arg == aian)[:8].tolist()
    tester, client = tester.iloc[sorted(keep)], client.iloc[sorted(keep)]
    exact, _, _ = _audit(tester, client, ReleasePolicy.off())
    assert exact.group("aian").estimate is not None
    policy = dataclasses.replace(ReleasePolicy.off(), min_effective_size=30.0)
    seen = []
    result, _, _ = _audit(tester, client, policy, tap=lambda d, m: seen.append(m))
    assert result.group("aian").estimate is None and result.group("aian").ci_low is None
    assert result.release["suppressed"] == ["aian"]
    assert "aian" in result.verdict.excluded_groups
    header = next(m.aggregates_header for m in seen if m.WhichOneof("body") == "aggregates_header")
    assert list(header.suppressed_items) == [aian]
    for g in groups:
        if g != "aian":
            assert result.group(g).estimate == pytest.approx(exact.group(g).estimate, abs=1e-9)


def test_an_empty_denominator_is_undefined_with_and_without_noise():
    """Without noise the estimate's zero test finds the empty item; with noise, the
    noised denominator is within its noise of 0: undefined, never a ratio of noises."""
    tester, client = make_inputs(600, 600, 600, seed=6, one_hot=True)
    race = tester[list(RACES)].to_numpy().argmax(axis=1)
    client.loc[race == 0, "y_true"] = 1  # no negatives among 'white' members: FPR undefined
    off, _, _ = _audit(tester, client, ReleasePolicy.off())
    assert off.by_group[0].estimate is None
    noisy, _, _ = _audit(tester, client, ReleasePolicy(rho=1.0, budget=1.0, min_intersection=100,
                                                        min_effective_size=0.0))
    assert noisy.by_group[0].estimate is None
    assert noisy.by_group[1].estimate is not None


# ---------------------------------------------------------------- noise
def test_every_aggregate_the_test_client_decrypts_carries_noise():
    """The estimate as the Test-Client reads it differs from the exact one by noise of
    the stated size, independently in every audit; without noise (policy off) the two
    agree to 1e-9. The Test-Client's own view is checked: the decrypted (Num, Den) of the
    estimate are never the noiseless sums."""
    tester, client = make_inputs(2500, 2500, 2500, seed=9)
    exact, _, _ = _audit(tester, client, ReleasePolicy.off())
    policy = ReleasePolicy(rho=1.0, budget=100.0)
    diffs = []
    for _ in range(8):
        noisy, t, _ = _audit(tester, client, policy)
        diffs.append([n.estimate - e.estimate for n, e in zip(noisy.groups, exact.groups)])
    diffs = np.array(diffs)
    assert np.all(diffs != 0)
    # every audit draws its own noise: the same audit twice does not repeat it
    assert len({tuple(np.round(r, 12)) for r in diffs}) == len(diffs)
    # the size: σ₀·(1 + FPR²)^½ / Den, Den ≈ half of each group's 2500·share members
    assert noisy.interval == "random_groups" and noisy.bootstrap == 10
    assert noisy.release["rho"] == 1.0 and noisy.release["sigma_estimate"] == pytest.approx(
        math.sqrt(2 / 0.7))
    assert np.max(np.abs(diffs)) < 0.2
    off_again, _, _ = _audit(tester, client, ReleasePolicy.off())
    for a, b in zip(off_again.groups, exact.groups):
        assert a.estimate == pytest.approx(b.estimate, abs=1e-9)


def test_the_noise_is_inside_the_encryption_the_test_client_never_sees_exact_sums():
    """Decrypt what the Test-Client receives with its own key (in-process) and compare
    the estimate's slots with the exact weighted sums computed here in plaintext."""
    tester, client = make_inputs(1500, 1500, 1500, seed=11)
    seen = []
    captured = {}
    original = ClientSession._finish

    def spy(self):
        captured["key"] = self._paillier
        captured["aggregates"] = list(self._aggregates)
        return original(self)

    try:
        ClientSession._finish = spy
        _audit(tester, client, ReleasePolicy(rho=1.0, budget=10.0), tap=lambda d, m: seen.append(m))
    finally:
        ClientSession._finish = original
    header = next(m.aggregates_header for m in seen if m.WhichOneof("body") == "aggregates_header")
    assert header.plain_rows == header.replicates + 1 and header.zero_tests == 0
    key = captured["key"]
    layout = encoding.SlotLayout(header.slot_bits, header.item_slots)
    values = [layout.unpack(v) for v in key.decrypt_task(signed=True)(captured["aggregates"][:header.items])]
    merged = client.merge(tester, on="member_id")
    q = encoding.quantize_probabilities(merged[list(RACES)].to_numpy()).astype(object)
    f = ((merged.y_pred == 1) & (merged.y_true == 0)).to_numpy().astype(int)
    d = (merged.y_true == 0).to_numpy().astype(int)
    sd = header.noise_sd
    for j in range(len(RACES)):
        num = int(sum(q[i, j] * f[i] for i in range(len(f))))
        den = int(sum(q[i, j] * d[i] for i in range(len(d))))
        got_num, got_den = values[j][0], values[j][1]
        assert got_num != num and got_den != den  # never the noiseless sums
        # ... but within 8 sd of the noise the header states (the draws are cut there)
        assert abs(got_num - num) <= 8 * sd[j * header.item_slots] + 1
        assert abs(got_den - den) <= 8 * sd[j * header.item_slots + 1] + 1


def test_the_budget_refuses_the_third_audit_across_dataset_names(tmp_path):
    """Through the real services: two audits of 1.0 each under two dataset names spend
    the budget of 2.0; the third is refused before any work, with its reason."""
    tester, client = make_inputs(600, 600, 600, seed=12)
    client.to_csv(tmp_path / "outputs.csv", index=False)
    registry = DatasetRegistry(named={name: tmp_path / "outputs.csv" for name in ("first", "second", "third")})
    with local_services(lambda: tester, registry, modulus_bits=TEST_BITS, allow_insecure=True,
                        release=ReleasePolicy(rho=1.0, budget=2.0)) as svc:
        codes = []
        for name in ("first", "second", "third"):
            event = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset=name, bootstrap=10),
                              tls=svc.operator_tls)
            codes.append("result" if event.WhichOneof("event") == "result" else event.error.code)
        assert codes == ["result", "result", "privacy_budget_exhausted"]
        assert "privacy budget" in event.error.message and "--privacy-budget" in event.error.message


def test_cli_release_flags_and_the_loud_warning(tmp_path, capsys):
    tester, client = make_inputs(300, 300, 300, seed=13)
    tp, cp = tmp_path / "p.csv", tmp_path / "c.csv"
    tester.to_csv(tp, index=False)
    client.to_csv(cp, index=False)
    args = ["audit", "--local", "--json", "--metric", "ero", "--tester-probabilities", str(tp),
            "--client-data", str(cp), "--bootstrap", "10"]
    assert ppre_main(args + ["--no-release-controls"]) == 0
    out = capsys.readouterr()
    assert "WARNING: --no-release-controls" in out.err
    report = json.loads(out.out)
    assert report["release"]["controls"] is False
    ledger = tmp_path / "ledger.json"
    assert ppre_main(args + ["--privacy-ledger", str(ledger), "--noise-rho", "1", "--privacy-budget", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["release"]["rho"] == 1.0 and report["release"]["budget_left"] == 0.0
    assert ppre_main(args + ["--privacy-ledger", str(ledger), "--noise-rho", "1", "--privacy-budget", "1"]) != 0
    refused = json.loads(capsys.readouterr().out)
    assert refused["error"]["code"] == "privacy_budget_exhausted"
    assert ppre_main(args + ["--min-intersection", "1000"]) != 0
    assert "--min-intersection" in json.loads(capsys.readouterr().out)["error"]["message"]


def test_probabilistic_counts_are_noised_and_a_one_member_pool_is_suppressed():
    """The count metric ends at the Tester, in plaintext: the same controls apply. A pool
    holding one member would give away that member's probability vector as its expected
    counts; it is suppressed, and the others' counts carry noise."""
    import pandas as pd
    tester, client = make_inputs(400, 400, 400, seed=14)
    pools = pd.DataFrame({"member_id": client.member_id, "pool": ["big"] * 399 + ["one"]})
    spec = AuditSpec(metric="prob-count", client_dataset="d")
    exact, _, _ = _audit(tester, pools, ReleasePolicy.off(), spec=spec)
    noisy, _, _ = _audit(tester, pools, ReleasePolicy(rho=1.0, budget=5.0), spec=spec)
    one = [p for p in noisy.pools if p.pool == "one"]
    assert all(p.expected_count is None and p.prob_at_least is None for p in one)
    assert sorted(noisy.release["suppressed"]) == sorted(f"one/{g}" for g in RACES)
    assert all(p.expected_count is not None for p in exact.pools)
    big = {p.group: p.expected_count for p in noisy.pools if p.pool == "big"}
    big_exact = {p.group: p.expected_count for p in exact.pools if p.pool == "big"}
    assert all(big[g] != big_exact[g] and abs(big[g] - big_exact[g]) < 8 for g in RACES)
    assert "suppressed" in noisy.to_table()


def test_noisy_random_groups_become_pseudo_values_of_the_ratio_estimator():
    """Under release noise a group's own denominator may be tiny (or noised below 0); the
    interval uses the linearised pseudo-values R + G·(Num_g − R·Den_g)/ΣDen_g, which never
    divide by it, and whose spread is the random-groups standard error of a ratio."""
    from common.metrics.base import Cell, Item, Plan
    plan = Plan((Cell("group", "g", item=0, num_slot=0, den_slot=1),), (Item(0, 0),), 2)
    groups = [(3, 10), (5, 12), (0, -1), (4, 9)]  # one group's Den noised to -1
    num, den = sum(n for n, _ in groups), sum(d for _, d in groups)
    rows = [(num, den)] + groups
    plain = plan.cell_values(rows, lambda a, b: None, plain_rows=len(rows), noise_sd=())
    assert np.isnan(plain[3, 0])  # the group's own ratio: undefined
    pseudo = plan.cell_values(rows, lambda a, b: None, plain_rows=len(rows), noise_sd=(), pseudo_values=True)
    r = num / den
    assert pseudo[0, 0] == pytest.approx(r)
    assert np.all(np.isfinite(pseudo[1:, 0]))
    assert np.mean(pseudo[1:, 0]) == pytest.approx(r)  # the groups add up to the estimate
    expected = [r + 4 * (n - r * d) / den for n, d in groups]
    assert pseudo[1:, 0] == pytest.approx(expected)


def test_auc_exact_carries_noise_scaled_to_its_pairwise_sensitivity():
    """MQOS-AUC exact is not a sum over rows: one member moves every other row's A_j, so
    its noise grows with S_j (`MqosAuc.squares_sensitivity`) while its denominator
    T·(S − T) grows with S_j²; the overall AUC of 3,000 members is noisy, and close."""
    tester, client = make_inputs(3000, 3000, 3000, seed=21)
    rng = np.random.default_rng(2)
    client = client[["member_id", "y_true"]].copy()
    client["score"] = rng.random(len(client)) + 0.5 * client.y_true
    spec = AuditSpec(metric="mqos-auc", client_dataset="d", metric_option="exact", seed=1)
    exact, _, _ = _audit(tester, client, ReleasePolicy.off(), spec=spec)
    noisy, _, _ = _audit(tester, client, ReleasePolicy(rho=1.0, budget=1.0), spec=spec)
    a, b = exact.group("overall").estimate, noisy.group("overall").estimate
    assert a != b and abs(a - b) < 0.1
    assert noisy.interval == "random_groups" and noisy.release["rho"] == 1.0


def test_bad_release_flags_are_named(tmp_path, capsys):
    tester, client = make_inputs(150, 150, 150, seed=15)
    tp, cp = tmp_path / "p.csv", tmp_path / "c.csv"
    tester.to_csv(tp, index=False)
    client.to_csv(cp, index=False)
    base = ["audit", "--local", "--json", "--metric", "ero", "--tester-probabilities", str(tp), "--client-data", str(cp)]
    for flags, named in ((["--noise-rho", "-1"], "noise rho"), (["--min-effective-size", "-3"], "min effective size"),
                         (["--min-intersection", "0"], "min intersection"),
                         (["--noise-rho", "1", "--privacy-budget", "0.5"], "exceeds the whole budget")):
        assert ppre_main(base + flags) == 2
        captured = capsys.readouterr()
        assert named in captured.out + captured.err, (flags, captured)
    (tmp_path / "ledger.json").write_text("not json")
    assert ppre_main(base + ["--privacy-ledger", str(tmp_path / "ledger.json")]) == 2
    captured = capsys.readouterr()
    assert "ledger.json" in captured.out + captured.err
