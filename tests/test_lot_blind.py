"""LOT's blind path (`common.metrics.lot`, "The Tester blind to the pairs"): under the
release controls the Tester never sees a row, and what it releases is what the plaintext
path would have released. The attack that reads the rows is in
`tests/attacks/test_row_linking.py`; here: the items, the finisher's size rule, and the
gate's refusals of a peer that breaks the path."""
from __future__ import annotations

import inspect
import math
import secrets

import numpy as np
import pandas as pd
import pytest

from common.errors import ProtocolError
from common.metrics.lot import Lot
from common.stats import moments
from ppre.report.text import render_text
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.helpers import TEST_BITS, local_audit, one_key_inline_chunks

GROUPS = ("hsm", "non_hsm")
LIST_LENGTH = 4


@pytest.fixture(scope="module", autouse=True)
def fast_crypto():
    with one_key_inline_chunks():
        yield


def lot_inputs(n_members: int = 160, n_joined: int = 130, n_queries: int = 150, seed: int = 5):
    """The Tester's two-group table (`n_joined` of the Test-Client's members, and others of
    its own) and ranked lists over all `n_members` of the Test-Client's."""
    rng = np.random.default_rng(seed)
    members = [f"m{i:04d}" for i in range(n_members)]
    held = members[:n_joined] + [f"t{i:04d}" for i in range(40)]
    p = rng.dirichlet([0.6, 0.6], size=len(held))
    tester = pd.DataFrame({"member_id": held, GROUPS[0]: p[:, 0], GROUPS[1]: p[:, 1]})
    rows = []
    for q in range(n_queries):
        for rank, m in enumerate(rng.choice(members, size=LIST_LENGTH, replace=False), start=1):
            rows.append({"query_id": f"q{q:03d}", "member_id": str(m), "rank": float(rank),
                         "relevance": float(rng.integers(0, 4))})
    return tester, pd.DataFrame(rows)


#: above the most rows a member of `lot_inputs` is in (17), so that no row is dropped
ROWS_PER_MEMBER = "20"


def spec(**kw) -> AuditSpec:
    kw.setdefault("params", {"rows_per_member": ROWS_PER_MEMBER})
    return AuditSpec(metric="lot", client_dataset="d", bootstrap=200, seed=3, **kw)


@pytest.fixture()
def noiseless(monkeypatch):
    """The controls on, their noise drawn as 0 (so that two audits can be compared item by item)."""
    monkeypatch.setattr("tester_service.protocol.gaussian_slots", lambda scales, bits: 0)
    monkeypatch.setattr("tester_service.protocol.gaussian", lambda sigma: 0.0)


def controls(min_effective_size: float) -> ReleasePolicy:
    """The controls with a noise scale small against these sizes (their sd under 1 member)."""
    return ReleasePolicy(min_effective_size=min_effective_size, rho=1000.0, budget=math.inf)


def released(monkeypatch, tester, client, **kw):
    """One audit under the controls; the released row as the Test-Client decoded it."""
    rows = []
    original = moments.finish_release

    def keep(plan, correction, decoded, *args, **kwargs):
        rows.append([list(x) for x in decoded])
        return original(plan, correction, decoded, *args, **kwargs)
    monkeypatch.setattr("client_service.protocol.moments.finish_release", keep)
    report, t, c = local_audit(tester, client, spec=spec(**kw), release=controls(0.0))
    monkeypatch.setattr("client_service.protocol.moments.finish_release", original)
    return rows[0], report, t


def test_the_blind_path_releases_the_items_the_plaintext_path_would(monkeypatch, noiseless):
    """Noise drawn as 0: every cell's (Num, Den), per rank pair and pooled, is the plaintext
    path's exactly; the second moments agree to rounding (the weights are rounded once per
    member instead of once per row); so do the estimates."""
    tester, client = lot_inputs()
    blind_row, blind_report, blind_tester = released(monkeypatch, tester, client)
    monkeypatch.setattr(Lot, "blind_pairs", False)
    plain_row, plain_report, _ = released(monkeypatch, tester, client)
    assert len(blind_row) == len(plain_row)
    cells = 4 * 2  # (None, 3 rank pairs) x 2 ordered group pairs: the cells' items come first
    assert [r[:2] for r in blind_row[:cells]] == [r[:2] for r in plain_row[:cells]]
    for b, p in zip(blind_row[cells:], plain_row[cells:]):
        assert b[1] == pytest.approx(p[1], rel=1e-9, abs=2.0 ** 40)
    estimates = [g.estimate for g in blind_report.cells]
    assert None not in estimates and estimates == [g.estimate for g in plain_report.cells]
    # the blind Tester matched members, not rows: those of the lists' members it holds
    assert blind_tester.n_matched == len(set(client["member_id"]) & set(tester["member_id"])) < len(client) / 4


def test_the_finisher_withholds_a_cell_whose_noised_size_is_below_the_minimum(monkeypatch, noiseless):
    """The blind Tester knows no cell's size: the finishing party withholds each cell
    whose released (noised) denominator is below the controls' minimum, at either
    recipient, and reports it withheld."""
    tester, client = lot_inputs()
    for recipient in ("client", "tester"):
        report, t, _ = local_audit(tester, client, spec=spec(result_recipient=recipient),
                                   release=controls(1e9))
        assert t._released.suppressed == []
        assert report.cells and all(c.estimate is None for c in report.cells), report.cells
        assert len(report.release["suppressed"]) == len(report.cells) and "suppressed: " in render_text(report)
        shown = [[c.estimate is not None for c in local_audit(
            tester, client, spec=spec(result_recipient=recipient), release=controls(size))[0].cells]
            for size in (0.0, 1.0)]
        assert shown[0] == shown[1] and sum(shown[0]) > len(shown[0]) / 2  # every cell's size is above 1


def tampered(tester, client, tamper, **kw):
    return local_audit(tester, client, spec=spec(**kw), release=ReleasePolicy(min_intersection=10), tap=tamper)


def test_a_member_listed_twice_is_refused():
    tester, client = lot_inputs(60, 50, 40)

    def twice(direction, msg):
        if msg.HasField("chunk") and msg.chunk.table == pb.MEMBER_POINTS:
            msg.chunk.points = msg.chunk.points[:32] * 2 + msg.chunk.points[64:]
    with pytest.raises(ProtocolError, match="twice in the member table"):
        tampered(tester, client, twice)


@pytest.mark.parametrize("table, named", [(pb.CLIENT_ROWS, "client rows"), (pb.MEMBER_VECTORS, "member vectors"),
                                          (pb.BLIND_TOTALS, "masked totals")])
def test_a_table_one_row_short_of_what_it_answers_is_refused(table, named):
    """The blind rows against the member table the Tester received, the member vectors
    against the one the Test-Client sent, the masked totals against the rank pairs."""
    tester, client = lot_inputs(60, 50, 40)

    def short(direction, msg):
        if msg.HasField("table_end") and msg.table_end.table == table:
            msg.table_end.rows -= 1
    with pytest.raises(ProtocolError, match=named):
        tampered(tester, client, short)


def test_a_masked_sum_that_does_not_decode_is_refused():
    """A Test-Client whose masked sums overflow their slots (here: every one replaced by
    HE_T.Enc of a uniform element of Z_n, far beyond the slot plan, so that their weighted
    totals do not decode either) gets a clean protocol error."""
    tester, client = lot_inputs(60, 50, 40)
    seen = {}

    def keep_key(direction, msg):
        if msg.HasField("hello"):
            seen["n"] = int.from_bytes(msg.hello.tester_paillier_n, "big")
        if msg.HasField("chunk") and msg.chunk.table == pb.CLIENT_ROWS:
            n = seen["n"]
            width = (2 * n.bit_length() + 7) // 8
            count = len(msg.chunk.tester_ciphertexts) // width  # Enc_T(uniform in Z_n), randomness 1:
            msg.chunk.tester_ciphertexts = b"".join(  # no slot plan holds their weighted totals
                ((1 + secrets.randbelow(n) * n) % (n * n)).to_bytes(width, "big") for _ in range(count))
    with pytest.raises(ProtocolError, match="does not decode"):
        tampered(tester, client, keep_key)


def test_the_test_client_refuses_a_blind_hello_without_the_testers_key_and_a_key_elsewhere():
    tester, client = lot_inputs(60, 50, 40)

    def drop(direction, msg):
        if msg.HasField("hello"):
            msg.hello.tester_paillier_n = b""
            msg.hello.tester_paillier_h = b""
    with pytest.raises(ProtocolError, match="needs the Tester's own key"):
        tampered(tester, client, drop)

    def add(direction, msg):
        if msg.HasField("hello"):
            msg.hello.tester_paillier_n = (2 ** TEST_BITS - 1).to_bytes(TEST_BITS // 8, "big")
            msg.hello.tester_paillier_h = b"\x02"
    with pytest.raises(ProtocolError, match="only LOT under release noise"):
        local_audit(tester, client, spec=spec(), release=ReleasePolicy.off(), tap=add)


@pytest.mark.parametrize("column", ["tester_ciphertexts", "ciphertexts"])
def test_masked_totals_that_are_not_units_are_refused(column):
    """The masked totals' table: a ciphertext that is not a unit under its key (here 0) is
    refused by the gate."""
    tester, client = lot_inputs(60, 50, 40)

    def zero(direction, msg):
        if msg.HasField("chunk") and msg.chunk.table == pb.BLIND_TOTALS:
            data = getattr(msg.chunk, column)
            setattr(msg.chunk, column, bytes(len(data)))
    with pytest.raises(ProtocolError):
        tampered(tester, client, zero)


def test_the_tester_decrypts_only_totals_never_a_members_sums(monkeypatch):
    """The Tester's key decrypts, in one audit, the weighted totals and the masked totals
    (per rank pair and head weight, per rank pair and slot) and nothing else: as many
    ciphertexts as those, whatever the member count."""
    tester, client = lot_inputs(60, 50, 40)
    from common.crypto import paillier
    seen = []
    original = paillier.PrivateKey.decrypt_signed

    def counted(self, cts):
        seen.append(len(cts))
        return original(self, cts)
    monkeypatch.setattr(paillier.PrivateKey, "decrypt_signed", counted)
    task = paillier.PrivateKey.decrypt_task
    callers = []

    def noted(self, **kw):  # the tests' parties share one key: tell the Tester's calls by their caller
        callers.append(inspect.stack()[1].filename)
        return task(self, **kw)
    monkeypatch.setattr(paillier.PrivateKey, "decrypt_task", noted)
    _, t, _ = tampered(tester, client, None)
    assert not [f for f in callers if "tester_service" in f], callers
    plan = t._blind_plan
    assert sum(seen) == plan.strata * (plan.weights * plan.vector_cts + plan.sum_slots * plan.weight_cts)


def test_what_the_tester_decrypts_hides_every_member_sum_and_every_cell(monkeypatch):
    """A curious Tester decrypts everything its key opens: each member's masked sums
    (its key is the member vectors' key) and the totals. Every member's slot then lies
    beyond 2^(mask_bits − 24) (z itself is below 2^(mask_bits − 64)), and every
    A − (Σ w·r + m) it forms beyond 2^(total_mask_bits − 24) (the cell itself far below).
    With the masks drawn as 0 (the defence removed) both are small: the check fails."""
    tester, client = lot_inputs(60, 50, 40)
    from client_service import blind_pairs as client_side
    from common.crypto import encoding, paillier
    from tester_service import blind_pairs as tester_side

    def reading(zero_masks: bool) -> tuple[int, int, object]:
        if zero_masks:
            monkeypatch.setattr(client_side, "draw", lambda bits, count, length: [[0] * length] * count)
        key = paillier.generate_keypair(TEST_BITS)  # the tests' one cached key: the Tester's too
        rows, formed = [], []
        original = tester_side.cell_items

        def spied(items, groups, totals, masked, *rest):
            formed.extend(totals[g][h] - masked[h][g] for kind, g, h in items if kind == "cell")
            return original(items, groups, totals, masked, *rest)
        monkeypatch.setattr(tester_side, "cell_items", spied)

        def tap(direction, msg):
            if msg.HasField("chunk") and msg.chunk.table == pb.CLIENT_ROWS:
                rows.append(msg.chunk.tester_ciphertexts)
        _, t, _ = tampered(tester, client, tap)
        plan = t._blind_plan
        unpack = encoding.SlotLayout(plan.slot_bits, plan.slots).unpack
        cts = paillier.ciphertexts_from_bytes(b"".join(rows), key.public)
        plain, per = key.decrypt_signed(cts), plan.vector_cts  # per (member, rank pair): its sum slots
        slots = [x for e in range(0, len(plain), per)
                 for x in [y for m in plain[e:e + per] for y in unpack(m)][:plan.sum_slots]]
        small_sums = sum(abs(x) < 1 << (plan.mask_bits - 24) for x in slots)
        small_cells = sum(abs(x) < 1 << (plan.total_mask_bits - 24) for x in formed)
        return small_sums, small_cells, (len(slots), len(formed))

    sums, cells, sizes = reading(False)
    assert (sums, cells) == (0, 0), sizes
    sums, cells, sizes = reading(True)
    assert sums == sizes[0] and cells == sizes[1], sizes


def test_the_blind_path_refuses_an_intersection_below_the_minimum_before_sending_a_vector():
    """The intersection's controls act on the joined members, with the one refusal text,
    before any member vector leaves."""
    from tester_service.release import IntersectionRefused
    tester, client = lot_inputs(60, 50, 40)
    sent = []

    def tap(direction, msg):
        if msg.HasField("chunk") and msg.chunk.table == pb.MEMBER_VECTORS:
            sent.append(msg)
    with pytest.raises(IntersectionRefused):
        local_audit(tester, client, spec=spec(), release=ReleasePolicy(min_intersection=1000), tap=tap)
    assert sent == []


def test_a_tester_that_announces_a_weak_h_still_finds_every_masked_sum_rerandomised(monkeypatch):
    """The Test-Client rerandomises its masked sums under the Tester's key with a
    randomizer base of its own (`client_service.blind_pairs.member_part`). With the
    Tester's announced h of order 2 (n² − 1) instead, a (member, rank pair) that heads no
    row would reach the Tester as Enc(r) with randomizer ±1, and one that heads rows with
    a product of the Tester's own vectors' randomizers: the Tester, which holds the key,
    would read off who heads a row at which rank pair, i.e. every member's ranks."""
    import types

    from common.crypto import paillier
    from tester_service import protocol as tester_protocol
    tester, client = lot_inputs(60, 50, 40)
    key = paillier.generate_keypair(TEST_BITS)
    weak = paillier.PrivateKey(paillier.PublicKey(key.public.n, key.public.n2 - 1), key.p, key.q)
    tester_paillier = types.ModuleType("tester_paillier")
    tester_paillier.__dict__.update(paillier.__dict__)
    tester_paillier.generate_keypair = lambda *args, **kw: weak
    monkeypatch.setattr(tester_protocol, "paillier", tester_paillier)
    rows = []

    def tap(direction, msg):
        if msg.HasField("chunk") and msg.chunk.table == pb.CLIENT_ROWS:
            rows.append(msg.chunk.tester_ciphertexts)
    tampered(tester, client, tap)
    n, n2 = weak.public.n, weak.public.n2
    cts = paillier.ciphertexts_from_bytes(b"".join(rows), weak.public)
    randomizers = {c * pow((1 + (m % n) * n) % n2, -1, n2) % n2 for c, m in zip(cts, weak.decrypt_signed(cts))}
    assert len(cts) > 100 and not randomizers & {1, n2 - 1}
