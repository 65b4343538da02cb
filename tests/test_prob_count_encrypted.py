"""The probabilistic count under the release controls (design §5.8): its pools travel
inside the ciphertexts, its counts are released as noised aggregates of the announced
noise to the result recipient alone, and a Test-Client accepts the plaintext-pools form
(no release noise) only on its operator's opt-in."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from client_service.protocol import NOISELESS_HELLO_REFUSED, ClientSession
from common.errors import InputError, ProtocolError
from common.metrics.base import PROBABILITY_BITS
from common.metrics.prob_count import MAX_ENCRYPTED_POOLS
from ppre.report.text import render_text
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.release import ReleasePolicy
from tests.helpers import TEST_BITS, make_inputs, one_key_inline_chunks, run_sessions

#: noise on, without the size thresholds these small tables would not pass
NOISY = ReleasePolicy(min_intersection=1, min_effective_size=0.0)


@pytest.fixture(scope="module", autouse=True)
def fast_crypto():
    with one_key_inline_chunks():
        yield


def _pools(n_pools: int, seed: int, members: int = 300):
    tester, client = make_inputs(members, members, members, seed=seed)
    rng = np.random.default_rng(seed)
    labels = [f"p{k:02d}" for k in range(n_pools)]
    return tester, pd.DataFrame({"member_id": client.member_id.astype(str),
                                 "pool": np.array(labels)[np.arange(len(client)) % n_pools][rng.permutation(len(client))]})


def _run(tester_df, client_df, release, *, recipient="client", accept_noiseless=True, seen=None,
         edit=lambda direction, message: None):
    """Both sessions to the end (`run_sessions`), every message kept in `seen` as
    (direction, message) and passed to `edit` on its way, which may change it in place:
    (the Tester's session, the Test-Client's session)."""
    spec = AuditSpec(metric="prob-count", client_dataset="d", result_recipient=recipient)
    tester = TesterSession(spec, tester_df, min_modulus_bits=TEST_BITS, release=release)
    client = ClientSession(lambda name, metric: client_df.copy(), modulus_bits=TEST_BITS, allow_insecure=True,
                           accept_noiseless=accept_noiseless)
    seen = [] if seen is None else seen

    def tap(direction, message):
        edit(direction, message)
        seen.append((direction, message))
    try:
        run_sessions(tester, client, tap)
        return tester, client
    finally:
        tester.close()
        client.close()


def _kinds(seen, direction):
    return [m.WhichOneof("body") for d, m in seen if d == direction]


@pytest.mark.parametrize("recipient", ["client", "tester"])
def test_the_rows_carry_no_pool_and_the_result_goes_to_the_recipient_alone(recipient):
    tester_df, client_df = _pools(3, seed=61)
    seen: list = []
    tester, client = _run(tester_df, client_df, NOISY, recipient=recipient, seen=seen)
    hello = next(m.hello for d, m in seen if m.WhichOneof("body") == "hello")
    assert hello.release_noise
    rows = [m.chunk for d, m in seen if d == "to_tester" and m.WhichOneof("body") == "chunk"
            and m.chunk.table == pb.CLIENT_ROWS]
    assert rows and all(c.ciphertexts and not c.strata for c in rows)
    header = next(m.aggregates_header for d, m in seen if m.WhichOneof("body") == "aggregates_header")
    assert (header.interval, header.replicates, header.zero_tests) == ("exact", 0, 0)
    assert header.plain_rows == (1 if recipient == "client" else 0)
    assert header.min_effective_size == NOISY.min_effective_size
    kept, other = (client.result, tester.result) if recipient == "client" else (tester.result, client.result)
    assert kept is not None and len(kept.pools) == 3 * 6 and kept.result_recipient == recipient
    # the members shown are noised counts, and the table and the page say so
    from ppre import report as rp
    assert "members (noised)" in render_text(kept) and "members (noised)" in rp.render_html(kept)
    if recipient == "client":  # the Tester's operator gets a receipt: no pool, no count
        assert other.is_receipt and not other.pools and "masked_plaintexts" not in _kinds(seen, "to_tester")
    else:
        assert other is None and "client_result" not in _kinds(seen, "to_tester")
        assert kept.n_matched == len(client_df)


def test_the_counts_carry_exactly_the_announced_noise():
    """Against the exact counts of the same members (the plaintext form, controls off),
    the released counts' errors over 20 pools x 6 groups, divided by the noise sd the
    header announces for their slot (σ₀ = single_sigma(1), all but the threshold's
    share of ρ: one member moves one pool's slots), have mean about 0 and sd about 1;
    the "overall" items carry none of their own (their sd is the groups' in quadrature)."""
    tester_df, client_df = _pools(20, seed=62, members=2400)
    exact = _run(tester_df, client_df, ReleasePolicy.off(), recipient="tester")[0].result
    seen: list = []
    noised = _run(tester_df, client_df, NOISY, seen=seen)[1].result
    header = next(m.aggregates_header for d, m in seen if m.WhichOneof("body") == "aggregates_header")
    sd = np.array(header.noise_sd[:len(header.noise_sd) // 2]).reshape(header.items, header.item_slots)
    groups = len(exact.groups)
    group_items = groups * header.items // (groups + 1)  # then "overall"'s items
    sigma = NOISY.single_sigma(1) * 2.0 ** PROBABILITY_BITS
    assert np.allclose(sd[:group_items][sd[:group_items] > 0], sigma)
    assert np.allclose(sd[group_items:][sd[group_items:] > 0], math.sqrt(groups) * sigma)
    truth = {(p.pool, p.group): p.expected_count for p in exact.pools}
    # cells whose exact count is 4 sd above 0, so that withholding a negative noised one
    # (below the minimum, here 0) does not cut the errors
    z = np.array([(p.expected_count - truth[(p.pool, p.group)]) / NOISY.single_sigma(1)
                  for p in noised.pools
                  if truth[(p.pool, p.group)] > 4 * NOISY.single_sigma(1) and p.expected_count is not None])
    assert len(z) >= 100
    print(f"{len(z)} cells: mean {z.mean():.3f}, sd {z.std(ddof=1):.3f}")
    assert abs(z.mean()) < 4 / math.sqrt(len(z)) and 0.7 < z.std(ddof=1) < 1.3


def test_a_test_client_refuses_the_plaintext_pools_form_unless_its_operator_accepts():
    """A Tester with its controls off would read every row's pool in plaintext: the
    Test-Client refuses the Hello, naming the flag, unless its operator opted in."""
    tester_df, client_df = _pools(2, seed=63)
    with pytest.raises(ProtocolError) as refused:
        _run(tester_df, client_df, ReleasePolicy.off(), accept_noiseless=False)
    assert str(refused.value) == NOISELESS_HELLO_REFUSED.format(metric="prob-count")
    assert "--accept-noiseless" in str(refused.value)
    tester, _ = _run(tester_df, client_df, ReleasePolicy.off(), accept_noiseless=True)
    assert tester.result is not None and len(tester.result.pools) == 2 * 6
    assert "(noised)" not in render_text(tester.result)  # exact counts from the joined rows
    # with noise on, no opt-in is needed
    _, client = _run(tester_df, client_df, NOISY, accept_noiseless=False)
    assert client.result is not None and client.result.pools


def test_more_pools_than_the_encrypted_form_holds_are_refused_naming_the_column():
    tester_df, client_df = _pools(MAX_ENCRYPTED_POOLS + 1, seed=64)
    with pytest.raises(InputError) as refused:
        _run(tester_df, client_df, NOISY)
    assert refused.value.column == "pool" and f"at most {MAX_ENCRYPTED_POOLS}" in str(refused.value)


def _edit_header(change):
    def edit(direction, message):
        if message.WhichOneof("body") == "aggregates_header":
            change(message.aggregates_header)
    return edit


@pytest.mark.parametrize("field, value", [("replicates", 1), ("interval", "random_groups"), ("plain_rows", 0),
                                          ("zero_tests", 7), ("min_effective_size", float("nan")),
                                          ("min_effective_size", -1.0)])
def test_the_test_client_refuses_a_count_header_out_of_its_form(field, value):
    """The count cells come as one row of noised aggregates (no replicates, the interval
    "exact", no zero tests, the row released as it is) with a finite minimum size."""
    tester_df, client_df = _pools(2, seed=65)
    _, client = _run(tester_df, client_df, NOISY)
    assert client.result is not None  # untouched: accepted
    with pytest.raises(ProtocolError, match="^aggregates header: "):
        _run(tester_df, client_df, NOISY, edit=_edit_header(lambda h: setattr(h, field, value)))


def test_the_tester_refuses_pool_facts_that_do_not_match_the_labels():
    """The pools' count sets the encrypted rows' width: a HelloAck whose `pools` differs
    from its labels, or exceeds what the encrypted form holds, is refused."""
    import json
    tester_df, client_df = _pools(2, seed=66)
    for pools in (3, MAX_ENCRYPTED_POOLS + 1):
        def edit(direction, message, pools=pools):
            if message.WhichOneof("body") == "hello_ack":
                message.hello_ack.info_json = json.dumps({"pools": pools})
        with pytest.raises(ProtocolError, match="dataset facts are malformed"):
            _run(tester_df, client_df, NOISY, edit=edit)
