"""Sans-I/O audits whose Test-Client decrypts with a key pair the test holds too, so that
the test can read what the Test-Client receives or forge a ciphertext against its
modulus; the per-row work runs inline. A test module takes the fixtures by importing
them."""
from __future__ import annotations

import pandas as pd
import pytest

from client_service.protocol import ClientSession
from common.crypto import paillier
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.release import ReleasePolicy
from tests.helpers import TEST_BITS, one_key_inline_chunks


@pytest.fixture(scope="module")
def client_key():
    return paillier.generate_keypair(TEST_BITS, allow_insecure=True)


@pytest.fixture
def fast_crypto(client_key):
    """One cached key pair for the Test-Client (so a test can decrypt what it receives),
    inline chunks (`tests.helpers.one_key_inline_chunks`)."""
    with one_key_inline_chunks(client_key):
        yield


def _loader(frame: pd.DataFrame):
    def load(name, metric):
        out = frame.copy()
        out["member_id"] = out["member_id"].astype(str)
        return out
    return load


def session_pair(spec: AuditSpec, tester_df, client_df, release: ReleasePolicy, *, charge=None):
    """A Tester session and a Test-Client session for `spec`, neither started."""
    tester = TesterSession(spec, tester_df, min_modulus_bits=TEST_BITS, release=release, charge=charge)
    client = ClientSession(_loader(client_df), modulus_bits=TEST_BITS, allow_insecure=True)
    return tester, client
