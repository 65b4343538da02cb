"""(C) A Test-Client that under-states its rows per member on LOT's blind path (`rows_per_member`)."""
from __future__ import annotations

import pytest

from tests.attacks import rows_per_member
from tests.helpers import one_key_inline_chunks


@pytest.fixture(scope="module", autouse=True)
def fast_crypto():
    with one_key_inline_chunks():
        yield


def test_stating_one_row_per_member_reads_no_targets_group():
    """The Tester sizes the noise from its own cap on rows per member (`rows_per_member`,
    default 4), which our Test-Client keeps to: what a Test-Client states of its rows is
    not read, and each target keeps at most 4 of its 800 rows. Measured on the commit
    before the cap (the Tester sized the noise from the stated rows, here 1): 14 of 15
    targets' groups read in one default audit (blind 2.5, margin 8); with the cap: 3 of 15,
    the audit answered."""
    outcome = rows_per_member.run()
    print(outcome)
    assert outcome.answered, outcome
    assert not outcome.above_blind, outcome
