"""The Tester's release controls (design §8; tester_service/release.py).

Each control is shown to act: the audit it should refuse is refused with a reason that
names the control, the cell it should withhold never reaches the Test-Client, the noise
is on every aggregate the Test-Client decrypts, and the budget stops the audit after
the last one it allows, across dataset names and restarts. The attacks these controls
defeat run through the real services in tests/attacks/.

Read from what the Test-Client decrypts (its key pair held by the test): every released
slot and every random group's row carries its own noise; suppression is decided on the
noised size (a probabilistic count's pools too), and an audit whose every cell is
suppressed still ends; the budget is charged before anything leaves, on every path, and
concurrent charges never overspend; the minimum intersection counts distinct members;
each slot of a masked item gets its own mask noise; groups suppressed by the controls
leave the correction's solve.
"""
from __future__ import annotations

import dataclasses
import json
import math
import threading
import time

import numpy as np
import pandas as pd
import pytest

from client_service.datasets import DatasetRegistry
from client_service.protocol import ClientSession
from common.crypto import encoding
from common.errors import InputError, ProtocolError
from common.races import RACES
from ppre.cli import main as ppre_main
from ppre.local import local_services
from ppre.report.text import render_text
from proto import ppre_pb2 as pb
from tester_service import protocol as tester_protocol
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.release import (INTERSECTION_REFUSAL, MOMENT_SHARE, THRESHOLD_SHARE, BudgetExhausted,
                                    IntersectionRefused, PrivacyAccountant, ReleasePolicy, ReleaseRefused,
                                    gaussian_slots, rho_to_epsilon)
from tester_service.server import run_audit
from tests.held_key import client_key, fast_crypto, session_pair  # noqa: F401  (the fixtures)
from tests.helpers import TEST_BITS, make_inputs, run_sessions
from tests.metric_data import random_ranked_lists

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
    with pytest.raises(ReleaseRefused) as refused:
        _audit(tester, client, ReleasePolicy())
    assert str(refused.value) == INTERSECTION_REFUSAL and "60" not in str(refused.value)  # no count
    # the minimum is checked on a noised count (sd 5 members at the defaults, §8.2): 60 members
    # clear a minimum of 40 but for a draw 4 sd below (3e-5), where a minimum of 60 is a coin toss
    result, _, _ = _audit(tester, client, dataclasses.replace(ReleasePolicy(), min_intersection=40))
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
    # ERO's interval: parametric draws from the released aggregates and second moments
    # (common.stats.moments), B of them, with the estimate's share 1 − MOMENT_SHARE − THRESHOLD_SHARE
    assert noisy.interval == "percentile" and noisy.bootstrap == SPEC.bootstrap
    assert noisy.release["interval_from"].startswith("second moments")
    assert noisy.release["rho"] == 1.0 and noisy.release["sigma_estimate"] == pytest.approx(
        math.sqrt(2 / (1 - MOMENT_SHARE - THRESHOLD_SHARE)))
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
    # one row of aggregates: the estimate and the second moments (common.stats.moments), no groups
    assert header.interval == "parametric" and header.plain_rows == 1 and header.zero_tests == 0
    assert len(captured["aggregates"]) == header.items
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
    # the second moments Σ w_ab·f and Σ w_ab·d on the pair weights, after the groups and
    # overall: noised too, with their own (larger) sd
    from common.stats.correction import pair_weights
    pw = pair_weights(encoding.quantize_probabilities(merged[list(RACES)].to_numpy()))
    first = len(RACES) + 1
    for p, w in enumerate(pw):
        item = first + p
        exact = [int(sum(int(w[i]) * int(v[i]) for i in range(len(f)))) for v in (f, d)]
        for s in range(2):
            noise = sd[item * header.item_slots + s]
            assert noise > sd[s] and values[item][s] != exact[s]
            assert abs(values[item][s] - exact[s]) <= 8 * noise + 1


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
    """Under the controls the count metric is aggregated under encryption and released
    to the result recipient as noised counts. A pool holding one member would give away
    that member's probability vector as its expected counts: its noised counts are below
    the minimum effective size, so they are withheld, and the others' counts carry noise."""
    import pandas as pd
    tester, client = make_inputs(400, 400, 400, seed=14)
    pools = pd.DataFrame({"member_id": client.member_id, "pool": ["big"] * 399 + ["one"]})
    spec = AuditSpec(metric="prob-count", client_dataset="d")
    exact, _, _ = _audit(tester, pools, ReleasePolicy.off(), spec=spec)
    noisy, _, _ = _audit(tester, pools, ReleasePolicy(rho=1.0, budget=5.0), spec=spec)
    one = [p for p in noisy.pools if p.pool == "one"]
    assert one and all(p.expected_count is None and p.prob_at_least is None for p in one)
    assert all(p.expected_count is not None for p in exact.pools)
    big = {p.group: p.expected_count for p in noisy.pools if p.pool == "big"}
    big_exact = {p.group: p.expected_count for p in exact.pools if p.pool == "big"}
    assert all(big[g] != big_exact[g] and abs(big[g] - big_exact[g]) < 8 for g in RACES)
    assert "suppressed" in render_text(noisy)


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


def test_auc_exact_carries_noise_sized_from_its_released_form_not_the_group_sizes():
    """MQOS-AUC exact releases V = (U − T·N/2)/S and D = T·N/S per cell (module
    docstring): their noise scales are the constants ½ and 1 member at the slots' fixed
    point, the same for every cell whatever its size, and the estimates stay close to the
    noiseless ones (3,000 members: D is hundreds of members, the noise a few)."""
    tester, client = make_inputs(3000, 3000, 3000, seed=21)
    rng = np.random.default_rng(2)
    client = client[["member_id", "y_true"]].copy()
    client["score"] = rng.random(len(client)) + 0.5 * client.y_true
    spec = AuditSpec(metric="mqos-auc", client_dataset="d", metric_option="exact", seed=1)
    exact, _, _ = _audit(tester, client, ReleasePolicy.off(), spec=spec)
    noisy, t_session, _ = _audit(tester, client, ReleasePolicy(rho=1.0, budget=1.0), spec=spec)
    a, b = exact.group("overall").estimate, noisy.group("overall").estimate
    assert a != b and abs(a - b) < 0.01
    assert noisy.interval == "percentile" and noisy.release["rho"] == 1.0
    assert noisy.release["interval_from"].startswith("second moments")
    cells = len(RACES) + 1
    sd = np.array(t_session._released.noise_sd).reshape(2, -1, 2)[0, :cells]  # the estimate's cells, (V, D)
    assert np.all(sd[:, 0] == sd[0, 0]) and np.all(sd[:, 1] == sd[0, 1])  # no cell's size in it
    assert sd[0, 0] == pytest.approx(sd[0, 1] / 2, rel=1e-6)
    for g in noisy.groups:
        assert g.estimate is None or 0.0 <= g.estimate <= 1.0


def test_bad_release_flags_are_named(tmp_path, capsys):
    tester, client = make_inputs(150, 150, 150, seed=15)
    tp, cp = tmp_path / "p.csv", tmp_path / "c.csv"
    tester.to_csv(tp, index=False)
    client.to_csv(cp, index=False)
    base = ["audit", "--local", "--json", "--metric", "ero", "--tester-probabilities", str(tp), "--client-data", str(cp)]
    for flags, named in ((["--noise-rho", "-1"], "'--noise-rho'"),
                         (["--min-effective-size", "-3"], "'--min-effective-size'"),
                         (["--min-intersection", "0"], "'--min-intersection'"),
                         (["--noise-rho", "1", "--privacy-budget", "0.5"], "exceeds the whole budget")):
        assert ppre_main(base + flags) == 2
        captured = capsys.readouterr()
        assert named in captured.out + captured.err, (flags, captured)
    (tmp_path / "ledger.json").write_text("not json")
    assert ppre_main(base + ["--privacy-ledger", str(tmp_path / "ledger.json")]) == 2
    captured = capsys.readouterr()
    assert "ledger.json" in captured.out + captured.err


def _auc_sensitivity_cases(rng):
    """Small exhaustive and adversarial cases for the exact MQOS-AUC released form: every
    label pattern of 6 rows (scores with ties), probability vectors on the simplex's
    vertices, at its centre and at random, two random groups."""
    n, k = 6, 3
    rank = np.array([0, 1, 1, 2, 3, 3])
    units = np.array([0, 1, 0, 1, 0, 1])
    vertices = list(np.eye(k)) + [np.full(k, 1.0 / k), np.array([0.5, 0.5, 0.0])]
    for pattern in range(1 << n):
        y = np.array([(pattern >> i) & 1 for i in range(n)])
        if pattern % 3 == 0:  # the extremes: every member on a vertex
            p = np.array([vertices[(pattern + i) % k] for i in range(n)])
        else:
            p = rng.dirichlet(np.full(k, 0.3), n)
        t = pattern % n
        for replacement in vertices + [rng.dirichlet(np.ones(k))]:
            p2 = p.copy()
            p2[t] = replacement
            yield y, rank, units, p, p2


def test_auc_exact_released_slots_never_move_beyond_the_noise_scale():
    """The exact MQOS-AUC's released form (module docstring, "Sensitivity"): replacing one
    member's probability vector moves every released slot V (D) of the estimate and of
    every random group by at most ½ (1) member per unit of |Δp_j|, and each release's
    slots by an L2 norm of at most √2 times the scale the noise is sized for
    (`squares_sensitivity`); the worst case found comes close to the bound (it is tight)."""
    from common.metrics.mqos_auc import EXACT, released_form
    rng = np.random.default_rng(5)
    state = {"facts": {"n": 6}}
    scales = EXACT.squares_sensitivity(state, 1)
    unit = 2.0 ** (33 + 2 * 3 + 64)  # 2^(33+K), K = 2·bits(6) + 64
    worst = [0.0, 0.0]
    for y, rank, units, p, p2 in _auc_sensitivity_cases(rng):
        q, q2 = (encoding.quantize_probabilities(x) for x in (p, p2))
        a, b = released_form(q, y, rank, units), released_form(q2, y, rank, units)
        dp = np.abs(q2 - q).max(axis=0) / 2.0 ** 32
        dp = np.append(dp, 0.0)  # the overall cell does not depend on anyone's race
        for rep in range(len(a)):
            moves = np.array([[abs(b[rep][j][c] - a[rep][j][c]) for c in (0, 1)] for j in range(len(dp))],
                             dtype=float)
            for c in (0, 1):
                assert np.all(moves[:, c] <= scales[c] * dp + unit * 2.0 ** -30), (y, rep, c, moves[:, c] / unit)
                assert math.sqrt(float(np.sum(moves[:, c] ** 2))) <= math.sqrt(2) * scales[c]
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = np.where(dp > 1e-6, moves[:, c] / unit / np.maximum(dp, 1e-300), 0.0)
                worst[c] = max(worst[c], float(ratio.max()))
    assert 0.3 < worst[0] <= 0.5 + 1e-6 and 0.6 < worst[1] <= 1.0 + 1e-6, worst


def test_auc_exact_encrypted_combine_releases_the_plaintext_form():
    """`ExactAuc.combine` under encryption (the masked squaring round trip included)
    yields the slots `released_form` computes in plaintext, for the estimate and every
    random group; the noise hook sees each V and D before they are packed."""
    from common.crypto import paillier
    from common.metrics.base import Layout
    from common.metrics.mqos_auc import EXACT, released_form
    from common.metrics.scoring import dense_score_rank
    rng = np.random.default_rng(8)
    n, k, g = 40, 3, 4
    p = rng.dirichlet(np.ones(k), n)
    q = encoding.quantize_probabilities(p)
    y = rng.integers(0, 2, n)
    rank = dense_score_rank(rng.integers(0, 10, n).astype(float))
    units = np.arange(n) % g
    key = paillier.generate_keypair(TEST_BITS, allow_insecure=True)
    pub = key.public

    def encrypt(values):
        return paillier.encrypt_chunk(pub.n, pub.h, [v % pub.n for v in values])

    def decrypt(ciphertexts):  # signed, as the Test-Client decodes
        return [m - key.p if m > key.p // 2 else m for m in key.decrypt_mod_p(ciphertexts)]
    facts = EXACT.tester_facts((q,), rank, units)
    weights = EXACT.weights((q,), rank, units, ["a", "b", "c"], "exact", {})
    agg = {u: [encrypt([sum((w if isinstance(w, int) else int(w[i])) * int(y[i]) for i in np.flatnonzero(units == u))])
               for w in weights] for u in range(g)}
    layout = Layout(slot_bits=EXACT.item_bits(n, g, ()) + 8, slots=1, n_components=1)
    state, requests = EXACT.square_requests(agg, g, pub, facts, layout)
    squares = encrypt([v * v for v in decrypt(requests)])
    seen = []

    def noise(ciphertext, component, replicate):
        seen.append((replicate, component))
        return ciphertext
    items = EXACT.combine(state, squares, pub, layout, noise)
    expected = released_form(q, y, rank, units)
    shift = layout.slot_bits
    for idx, value in enumerate(decrypt(items)):
        v = (value + (1 << (shift - 1))) % (1 << shift) - (1 << (shift - 1))
        d = (value - v) >> shift
        assert (v, d) == expected[idx // (k + 1)][idx % (k + 1)]
    assert len(seen) == 2 * len(items) and {c for _, c in seen} == {0, 1}


def test_auc_sampled_slots_never_move_beyond_the_declared_pair_cap():
    """MQOS-AUC sampled: the noise is sized from the declared `pairs_per_member` cap (the
    Test-Client's pairs never exceed it); replacing one member's probability vector moves
    every group's numerator and denominator, over all pairs and in every random-group
    unit, by at most the scale `slot_sensitivity` gives per unit of |Δp_j| (an L2 norm of
    at most √2 times it over the groups); a Tester count above the cap is refused."""
    import pandas as pd
    from common.metrics.base import Item, Layout
    from common.metrics.mqos_auc import SAMPLED
    from common.metrics.scoring import pair_graph_size
    rng = np.random.default_rng(9)
    n, k, cap = 30, 3, 3
    frame = pd.DataFrame({"member_id": [f"m{i}" for i in range(n)], "y_true": np.arange(n) % 2,
                          "score": rng.integers(0, 5, n).astype(float)})
    params = SAMPLED.parse_params({"pairs": "500", "pairs_per_member": str(cap)})
    rows = SAMPLED.client_rows(frame, "d.csv", "sampled", params, rng)
    edges, kept = pair_graph_size(n // 2, n // 2, 500, cap)  # every slot used: the cap binds
    assert edges == cap * n // 2 and rows.info["pairs_kept"] == kept and rows.info["pairs_dropped"] == 500 - kept
    index = {m: i for i, m in enumerate(frame.member_id)}
    a, b = (np.array([index[m] for m in ids]) for ids in rows.ids)
    assert np.bincount(np.concatenate([a, b])).max() <= cap  # dummy rows count too
    comps = SAMPLED.components("sampled", params, rows.info)
    scale = SAMPLED.slot_sensitivity(Item(0, 0), Layout(64, 2, 2), comps, cap)
    values = np.rint(rows.values * 2).astype(np.int64)  # the fixed-point values (scale 2^1)

    def slots(q):
        w = [q[a, j].astype(object) * q[b, j].astype(object) for j in range(k)]
        units = [rows.units == u for u in range(SAMPLED.random_groups + 1)]
        return np.array([[[int(np.sum(w[j][u] * values[u, c])) for c in (0, 1)] for j in range(k)]
                         for u in [np.ones(len(a), dtype=bool)] + units], dtype=object)
    p = rng.dirichlet(np.ones(k), n)
    for t in range(n):
        for replacement in list(np.eye(k)) + [rng.dirichlet(np.ones(k))]:
            p2 = p.copy()
            p2[t] = replacement
            q, q2 = (encoding.quantize_probabilities(x) for x in (p, p2))
            moved = np.abs((slots(q2) - slots(q)).astype(float))
            dp = np.abs(q2[t] - q[t]) / 2.0 ** 32
            for c in (0, 1):
                assert np.all(moved[0, :, c] <= scale[c] * dp + 1), (t, c)
                assert np.sqrt(np.sum(moved[1:, :, c] ** 2)) <= math.sqrt(2) * scale[c]
    with pytest.raises(ProtocolError, match="pairs_per_member"):
        SAMPLED.slot_sensitivity(Item(0, 0), Layout(64, 2, 2), comps, cap + 1)


# ---------------------------------------------------------------- what the Test-Client decrypts
GROUPS = list(RACES)
#: noise on, every audit allowed, no intersection or size control in the way
NOISY = ReleasePolicy(min_intersection=1, min_effective_size=0.0, rho=1.0, budget=math.inf, max_refusals=None)


def _run(spec, tester_df, client_df, release, *, charge=None, seen=None):
    """Both sessions to the end; `seen` collects (direction, message)."""
    tap = (lambda d, m: seen.append((d, m))) if seen is not None else None
    return _audit(tester_df, client_df, release, spec=spec, tap=tap, charge=charge)


def _header(seen) -> pb.AggregatesHeader:
    return next(m.aggregates_header for d, m in seen if m.WhichOneof("body") == "aggregates_header")


def _decrypted_rows(seen, key) -> list[list[list[int]]]:
    """What the Test-Client decrypts: per released row, per item, its slots (signed)."""
    header = _header(seen)
    width = key.public.ciphertext_bytes
    packed = b"".join(m.chunk.ciphertexts for d, m in seen
                      if m.WhichOneof("body") == "chunk" and m.chunk.table == pb.AGGREGATES)
    cts = [int.from_bytes(packed[i:i + width], "big") for i in range(0, len(packed), width)]
    cts = cts[:len(cts) - header.zero_tests]
    layout = encoding.SlotLayout(header.slot_bits, header.item_slots)
    values = [layout.unpack(v) for v in key.decrypt_task(signed=True)(cts)]
    return [values[r:r + header.items] for r in range(0, len(values), header.items)]


def _pot_frame(tester_df, rng) -> pd.DataFrame:
    ids = list(tester_df.member_id)
    return pd.DataFrame({"member_id": ids, "score": rng.random(len(ids)).round(3),
                         "outcome": rng.integers(0, 2, len(ids))})


def _auc_frame(tester_df, rng) -> pd.DataFrame:
    ids = list(tester_df.member_id)
    y = rng.integers(0, 2, len(ids))
    return pd.DataFrame({"member_id": ids, "y_true": y, "score": (rng.random(len(ids)) + 0.5 * y).round(3)})


def _reproducible_test_client(m) -> None:
    """The Test-Client's own draws (MQOS-AUC sampled's pairs, its buckets, its orders:
    `client_service.protocol`'s `secrets`) from one fixed seed, fresh for each run, so
    that two runs differ only by what the Tester adds (its encryption's randomness aside)."""
    import random
    import types

    from client_service import protocol as client_protocol
    draws = random.Random(7)
    m.setattr(client_protocol, "secrets", types.SimpleNamespace(randbits=draws.getrandbits, token_bytes=draws.randbytes))


def _noisy_and_exact(monkeypatch, client_key, name: str, option: str):
    """One audit under noise and the same audit with the draws set to 0 (same seed, same
    groups, the same suppression, the Test-Client's own draws the same:
    `_reproducible_test_client`): (header, rows decrypted under noise, rows without)."""
    tester_df, _ = make_inputs(200, 200, 200, seed=31)
    rng = np.random.default_rng(31)
    client_df = _pot_frame(tester_df, rng) if name == "pot" else _auc_frame(tester_df, rng)
    spec = AuditSpec(metric=name, metric_option=option, client_dataset="d", bootstrap=10, seed=4,
                     result_recipient="client")
    monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma: 0.0)
    noisy_seen: list = []
    with monkeypatch.context() as m:
        _reproducible_test_client(m)
        _run(spec, tester_df, client_df, NOISY, seen=noisy_seen)
    real_slots = tester_protocol.gaussian_slots
    exact_seen: list = []
    with monkeypatch.context() as m:
        _reproducible_test_client(m)
        m.setattr(tester_protocol, "gaussian_slots", lambda scales, bits: 0)
        _run(spec, tester_df, client_df, NOISY, seen=exact_seen)
    assert tester_protocol.gaussian_slots is real_slots
    return _header(noisy_seen), _decrypted_rows(noisy_seen, client_key), _decrypted_rows(exact_seen, client_key)


@pytest.mark.usefixtures("fast_crypto")
def test_auc_exact_releases_every_slot_with_its_own_noise(monkeypatch, client_key):
    """MQOS-AUC exact under noise releases one row: each cell's (V, D) at σ₀ and each pair
    of groups' (S1, S0) at σ_m, no random groups. Every slot the Test-Client decrypts
    differs from the noiseless audit's, the header's noise sd is σ₀ times the form's
    bounds (½ and 1 member) on the cells and σ_m times a pair weight's 2^32 on the pair
    items (whose S1 and S0, without noise, are sums of non-negative weights)."""
    from common.metrics.mqos_auc import normaliser_bits
    header, noisy, exact = _noisy_and_exact(monkeypatch, client_key, "mqos-auc", "exact")
    assert header.interval == "parametric" and header.plain_rows == 1 and len(noisy) == len(exact) == 1
    cells, n_pairs = len(GROUPS) + 1, len(GROUPS) * (len(GROUPS) + 1) // 2
    assert header.items == cells + n_pairs
    sigma0, sigma_m = NOISY.moment_sigmas(2, pair_components=1)
    sd = np.array(header.noise_sd).reshape(2, header.items, header.item_slots)
    unit = 2.0 ** (33 + normaliser_bits(200))
    assert sd[0, :cells, 0] == pytest.approx(sigma0 * unit / 2, rel=1e-6)
    assert sd[0, :cells, 1] == pytest.approx(sigma0 * unit, rel=1e-6)
    assert sd[0, cells:] == pytest.approx(sigma_m * 2.0 ** 32, rel=1e-12) and not sd[1].any()
    for i in range(header.items):
        if i in header.suppressed_items:
            continue
        for s in range(header.item_slots):
            assert noisy[0][i][s] != exact[0][i][s], (i, s)
    assert all(min(exact[0][cells + p]) >= 0 for p in range(n_pairs))


@pytest.mark.usefixtures("fast_crypto")
def test_every_random_group_row_carries_its_own_noise(monkeypatch, client_key):
    """Under noise MQOS-AUC sampled's interval comes from disjoint random groups, released
    next to the estimate. Every group row the Test-Client decrypts differs from the
    noiseless one (the same audit with the draws set to 0: same seed, same groups) in
    every slot the header says is noised."""
    header, noisy, exact = _noisy_and_exact(monkeypatch, client_key, "mqos-auc", "sampled")
    assert header.interval == "random_groups" and header.plain_rows == header.replicates + 1 >= 3
    assert len(noisy) == len(exact) == header.replicates + 1
    sd = np.array(header.noise_sd).reshape(2, header.items, header.item_slots)
    noised = [(i, s) for i in range(header.items) for s in range(header.item_slots)
              if sd[1, i, s] > 0 and i not in header.suppressed_items]
    assert noised
    unnoised = [(i, s) for i in range(header.items) for s in range(header.item_slots)
                if not sd[1, i, s] > 0 and i not in header.suppressed_items]
    for r in range(1, len(noisy)):
        for i, s in noised:
            assert noisy[r][i][s] != exact[r][i][s], (r, i, s)
        for i, s in unnoised:  # the runs differ by the noise alone: the draws are the same
            assert noisy[r][i][s] == exact[r][i][s], (r, i, s)


def _small_aian(seed: int, members: int = 8):
    """One-hot probabilities with `members` aian members (effective size `members`)."""
    tester, client = make_inputs(500, 500, 500, seed=seed, one_hot=True)
    aian = GROUPS.index("aian")
    arg = tester[GROUPS].to_numpy().argmax(axis=1)
    keep = sorted(np.flatnonzero(arg != aian).tolist() + np.flatnonzero(arg == aian)[:members].tolist())
    return tester.iloc[keep].reset_index(drop=True), client.iloc[keep].reset_index(drop=True)


@pytest.mark.usefixtures("fast_crypto")
def test_suppression_follows_the_noised_size_not_the_exact_one(monkeypatch):
    """With the threshold's draw forced to +1000 a group of 8 members (min 30) is
    released; forced to −150 every race group is suppressed (each holds 60 or more
    members) while overall (500) is not: the decision is the noised size's. An exact
    comparison would do neither."""
    tester_df, client_df = _small_aian(32)
    policy = dataclasses.replace(NOISY, min_effective_size=30.0)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1)
    aian = GROUPS.index("aian")
    suppressed = {}
    sizes = tester_df[GROUPS].sum()
    assert sizes.drop("aian").min() >= 60 and sizes["aian"] == 8
    for draw in (1000.0, -150.0):
        monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma, draw=draw: draw)
        seen: list = []
        result, _, _ = _run(spec, tester_df, client_df, policy, seen=seen)
        suppressed[draw] = set(_header(seen).suppressed_items)
        if draw > 0:
            assert "suppressed" not in result.release
    assert aian not in suppressed[1000.0] and not suppressed[1000.0]
    assert suppressed[-150.0] == set(range(len(GROUPS)))  # every race group, not overall


@pytest.mark.usefixtures("fast_crypto")
def test_an_audit_whose_every_cell_is_suppressed_still_ends_with_a_result(monkeypatch):
    """Noised sizes that suppress every cell, overall included: the header names the race
    groups as small (never "overall", which the Test-Client would refuse as no group) and
    the result says every estimate is unknown."""
    tester_df, client_df = _small_aian(32)
    policy = dataclasses.replace(NOISY, min_effective_size=30.0)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1)
    monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma: -10_000.0)
    seen: list = []
    result, _, _ = _run(spec, tester_df, client_df, policy, seen=seen)
    assert set(_header(seen).small_groups) == set(GROUPS)
    assert all(g.estimate is None for g in result.groups) and not result.verdict.significant


@pytest.mark.usefixtures("fast_crypto")
def test_a_probabilistic_count_pool_is_suppressed_on_its_noised_size(monkeypatch):
    """The count metric, aggregated under encryption, is withheld on noised values at both
    of its steps. The Tester decides per group on its noised size: a −1000 draw withholds
    every group's items (named in the header), a +1000 draw none. The result recipient
    decides per cell on the noised count: a one-member pool's cells are withheld, and
    with +1000 members of noise forced into every slot they are released (1000 and more),
    which a decision on the exact count (under 1) would never do."""
    tester_df, client_df = make_inputs(500, 500, 500, seed=33)
    pools = pd.DataFrame({"member_id": client_df.member_id, "pool": ["big"] * 499 + ["one"]})
    policy = dataclasses.replace(NOISY, min_effective_size=30.0)
    spec = AuditSpec(metric="prob-count", client_dataset="d", result_recipient="tester")
    seen: list = []
    monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma: -1000.0)
    down, _, _ = _run(spec, tester_df, pools, policy, seen=seen)
    assert len(_header(seen).suppressed_items) == _header(seen).items  # every group, and overall
    assert all(p.expected_count is None for p in down.pools)
    assert set(down.release["suppressed"]) >= {f"{pool}/{g}" for pool in ("big", "one") for g in GROUPS}
    seen.clear()
    monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma: 1000.0)
    up, _, _ = _run(spec, tester_df, pools, policy, seen=seen)
    assert not _header(seen).suppressed_items and not up.release.get("suppressed")
    assert all(p.expected_count is None for p in up.pools if p.pool == "one")
    assert all(p.expected_count is not None for p in up.pools if p.pool == "big")

    def thousand(scales, slot_bits):
        return sum((1000 << 32) << (s * slot_bits) for s, x in enumerate(scales) if x > 0)

    monkeypatch.setattr(tester_protocol, "gaussian_slots", thousand)
    forced, _, _ = _run(spec, tester_df, pools, policy)
    one = [p for p in forced.pools if p.pool == "one"]
    assert one and all(p.expected_count is not None and p.expected_count >= 1000 for p in one)


class _Refuse:
    """A charge that refuses (a spent budget) and records when it was asked."""

    def __init__(self, seen: list) -> None:
        self.seen = seen
        self.calls: list[int] = []

    def __call__(self, rho: float) -> float:
        self.calls.append(len(self.seen))
        raise BudgetExhausted("spent")


def _released(seen) -> list[str]:
    """What left the Tester that carries the audit's outcome."""
    out = []
    for d, m in seen:
        kind = m.WhichOneof("body")
        if d != "to_client":
            continue
        if kind == "aggregates_header" or (kind == "chunk" and m.chunk.table == pb.AGGREGATES) or kind == "result":
            out.append(kind)
    return out


@pytest.mark.usefixtures("fast_crypto")
@pytest.mark.parametrize("metric, recipient", [("ero", "tester"), ("ero", "client"), ("pot", "client"),
                                               ("mqos-auc:exact", "client"), ("prob-count", "tester"),
                                               ("prob-count", "client")])
def test_the_budget_is_charged_before_anything_leaves(metric, recipient):
    """A refused charge stops the audit before any aggregate or result leaves the Tester,
    on every path (HE metrics, the squares round of MQOS-AUC exact, the probabilistic
    count computed at the Tester), and the Tester keeps no result either."""
    name, _, option = metric.partition(":")
    tester_df, client_df = make_inputs(300, 300, 300, seed=34)
    rng = np.random.default_rng(34)
    if name == "pot":
        client_df = _pot_frame(tester_df, rng)
    elif name == "mqos-auc":
        client_df = _auc_frame(tester_df, rng)
    elif name == "prob-count":
        client_df = pd.DataFrame({"member_id": client_df.member_id, "pool": rng.choice(["a", "b"], len(client_df))})
    spec = AuditSpec(metric=name, metric_option=option, client_dataset="d", bootstrap=10, seed=1,
                     result_recipient=recipient)
    seen: list = []
    charge = _Refuse(seen)
    tester, client = session_pair(spec, tester_df, client_df, NOISY, charge=charge)
    try:
        with pytest.raises(BudgetExhausted):
            run_sessions(tester, client, lambda d, m: seen.append((d, m)))
        assert charge.calls, "the budget was never charged"
        assert _released(seen) == [] and tester.result is None and client.result is None
    finally:
        tester.close()
        client.close()


@pytest.mark.usefixtures("fast_crypto")
def test_the_minimum_intersection_counts_distinct_members_not_rows():
    """LOT's rows are pairs of members: fewer than 100 distinct members in far more than
    100 rows are refused under a minimum of 100; the count is exact (passes at the
    number of distinct members, refused at one more)."""
    tester_df, _ = make_inputs(300, 300, 300, seed=35)
    lists = random_ranked_lists(60, np.random.default_rng(35), min_len=3, max_len=5, n_members=60)
    distinct = lists.member_id.nunique()
    assert distinct < 100 and len(lists) > 200
    spec = AuditSpec(metric="lot", client_dataset="d", bootstrap=10, seed=1)
    off = ReleasePolicy.off()
    for refused in (100, distinct + 1):
        with pytest.raises(IntersectionRefused):
            _run(spec, tester_df, lists, dataclasses.replace(off, min_intersection=refused))
    result, _, _ = _run(spec, tester_df, lists, dataclasses.replace(off, min_intersection=distinct))
    assert result is not None


@pytest.mark.usefixtures("fast_crypto")
@pytest.mark.parametrize("correction", ["none", "calibration"])
def test_each_slot_of_a_masked_item_gets_its_own_mask_noise(monkeypatch, correction):
    """(r·Num + e1, r·Den + e2): with e1 = e2 the Test-Client would read r·(Num − Den) as
    A − B and factor it; every masked item's slots get distinct draws below r (with the
    correction too, where the items of a replicate share r)."""
    from tester_service import aggregation
    tester_df, client_df = make_inputs(300, 300, 300, seed=36)
    masks: list = []
    original = aggregation.mask_chunk

    def recording(n, h, items, ratio, pads):
        masks.extend(ratio or [])
        return original(n, h, items, ratio, pads)

    monkeypatch.setattr(aggregation, "mask_chunk", recording)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=5, seed=2, result_recipient="client",
                     correction=correction)
    seen: list = []
    _run(spec, tester_df, client_df, ReleasePolicy.off(), seen=seen)
    header = _header(seen)
    shift, slots = header.slot_bits, header.item_slots
    masked = [(r, noise) for r, noise in masks if r != 1]
    assert len(masked) >= 6 * header.items
    for r, noise in masked:
        draws = [(noise >> (s * shift)) & ((1 << shift) - 1) for s in range(slots)]
        assert all(0 <= e < r for e in draws)
        assert len(set(draws)) == slots, "slots share one mask draw"


@pytest.mark.usefixtures("fast_crypto")
@pytest.mark.slow
def test_groups_suppressed_by_the_controls_leave_the_corrections_solve():
    """A group suppressed for its size has its cell replaced (its masked Num is noise):
    the other groups' corrected values must not use it. They equal the plaintext solve
    over the kept groups, in two audits with fresh masks."""
    from common.stats import correction
    from tests.test_correction import calibrated_population
    tester_df, client_df, p, _ = calibrated_population(1000, 40, alpha=1.0)
    aian = GROUPS.index("aian")
    p = p.copy()
    p[:, aian] *= 0.05
    p /= p.sum(axis=1, keepdims=True)
    tester_df[GROUPS] = p
    assert p[:, aian].sum() < 30 and p.sum(axis=0).min() < 30 <= np.delete(p.sum(axis=0), aian).min()
    policy = dataclasses.replace(ReleasePolicy.off(), min_effective_size=30.0)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=2, correction="calibration",
                     result_recipient="client")
    f = ((client_df.y_pred == 1) & (client_df.y_true == 0)).to_numpy(float)
    d = (client_df.y_true == 0).to_numpy(float)
    m, num = correction.plain_matrix(p, d), p.T @ f
    kept = [j for j in range(len(GROUPS)) if j != aian]
    twin = np.linalg.solve(m[np.ix_(kept, kept)], num[kept])
    for _ in range(2):
        report, _, _ = _run(spec, tester_df, client_df, policy)
        assert report.release["suppressed"] == ["aian"]
        got = np.array([report.group(GROUPS[j]).corrected_estimate for j in kept], dtype=float)
        assert np.allclose(got, twin, atol=1e-6, rtol=0), (got, twin)


# ---------------------------------------------------------------- the accountant and the noise at their edges
class _SlowSpent(dict):
    """A ledger whose reads take a moment: two charges that are not serialised both read
    the old value before either writes."""

    def get(self, *args):
        value = super().get(*args)
        time.sleep(0.05)
        return value


def test_concurrent_charges_cannot_overspend_even_when_they_overlap():
    """Two audits of one identity charge at the same moment with room for one: exactly
    one is charged, the other refused; the ledger never exceeds the budget."""
    acc = PrivacyAccountant(1.0)
    acc._spent = _SlowSpent()
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def audit():
        barrier.wait()
        try:
            acc.charge("c", 1.0)
            outcomes.append("charged")
        except BudgetExhausted:
            outcomes.append("refused")

    threads = [threading.Thread(target=audit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["charged", "refused"]
    assert acc.spent("c") == pytest.approx(1.0)


def test_a_new_identity_has_spent_nothing_and_may_spend_the_whole_budget():
    """The pre-check a Tester service runs before any work (`check`) and the spent rho it
    reports start at 0 for an identity it has not seen, and one charge is counted once."""
    accountant = PrivacyAccountant(budget=1.0)
    assert accountant.spent("new") == 0.0 and accountant.remaining("new") == 1.0
    accountant.check("new", 1.0)
    assert accountant.charge("other", 0.25) == 0.75
    assert accountant.spent("other") == 0.25 and accountant.spent("new") == 0.0


def test_second_moments_refuse_noise_beyond_the_slots_headroom_naming_the_flag():
    """`moment_sigmas` refuses like `sigmas`: a rho so
    small that the noise would overflow its slot is an error naming --noise-rho, never a
    release with clipped noise."""
    from common.errors import InputError
    policy = ReleasePolicy(rho=1e-15, budget=1.0)
    with pytest.raises(InputError, match="headroom") as refused:
        policy.moment_sigmas(2.0, squares=1)
    assert refused.value.parameter == "noise rho"
    assert "parameter 'noise rho'" in str(refused.value) and "use a larger rho" in str(refused.value)


def test_noise_slots_with_no_scale_add_nothing():
    """A slot whose noise scale is 0 (a release without noise, or a slot the plan keeps
    exact) gets exactly 0: no offset, not even one fixed-point unit."""
    from tester_service.release import gaussian_slots
    assert gaussian_slots([0.0, 0.0, 0.0], 40) == 0
