"""Shared test helpers: synthetic inputs and an in-process driver for the two sessions."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections import deque

import numpy as np
import pandas as pd

from client_service.protocol import ClientSession
from common.races import RACES
from common.stats.results import delivered
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.release import ReleasePolicy

TEST_BITS = 1024  # tests only: production refuses < 2048


@contextlib.contextmanager
def one_key_inline_chunks(key=None):
    """For sans-I/O sessions: every Test-Client session takes one test key pair (`key`, one
    the test holds to read what the Test-Client receives; default a fresh one), with no key
    generation per audit, and the per-row work runs inline (no worker pool). The one
    in-process key override; processes take `PPRE_TEST_KEY_BITS` (tests/conftest.py)."""
    import pytest

    from common.crypto import paillier
    key = key if key is not None else paillier.generate_keypair(TEST_BITS, allow_insecure=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PPRE_WORKERS", "1")
        mp.setattr("client_service.protocol.paillier.generate_keypair", lambda *a, **kw: key)
        yield


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of the call)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_inputs(n_tester: int, n_client: int, overlap: int, *, seed: int = 0, one_hot: bool = False):
    rng = np.random.default_rng(seed)
    tester_ids = [f"m{i:06d}" for i in range(n_tester)]
    client_ids = tester_ids[:overlap] + [f"x{i:06d}" for i in range(n_client - overlap)]
    if one_hot:
        probs = np.eye(len(RACES))[rng.integers(0, len(RACES), n_tester)]
    else:
        probs = rng.dirichlet(np.full(len(RACES), 0.7), n_tester)
    tester = pd.DataFrame(probs, columns=list(RACES))
    tester.insert(0, "member_id", tester_ids)
    y_true = rng.integers(0, 2, n_client)
    y_pred = rng.integers(0, 2, n_client)
    client = pd.DataFrame({"member_id": client_ids, "y_true": y_true, "y_pred": y_pred})
    return tester, client


def plain_ratio(probabilities: np.ndarray, f: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The plaintext weighted formula mu[j] = Σ p_ij f_i / Σ p_ij d_i (design §5)."""
    p = np.asarray(probabilities, dtype=np.float64)
    num = p.T @ np.asarray(f, dtype=np.float64)
    den = p.T @ np.asarray(d, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def run_sessions(tester: TesterSession, client: ClientSession, tap=None):
    """Drive both state machines in one process, as the gRPC layer does: each message the
    Tester's handler produces reaches the Test-Client as soon as it is produced (the
    servers stream a handler's messages as it yields them), so a handler that fails after
    yielding has already sent what it yielded, as it would have over the wire; the
    Test-Client's replies wait for the Tester's handler to finish, as its inbound stream is
    read one message at a time."""
    to_tester: deque = deque()

    def deliver(messages) -> None:
        for msg in messages:
            if tap:
                tap("to_client", msg)
            to_tester.extend(client.receive(msg))

    deliver(tester.start())
    while to_tester:
        msg = to_tester.popleft()
        if tap:
            tap("to_tester", msg)
        deliver(tester.receive(msg))
    if tester.result is not None and tester.result.is_receipt and client.result is not None:
        # result recipient client: the Test-Client kept the result, the Tester a receipt;
        # this one process holds both sides, as local mode does (design §3.7)
        return delivered(tester.result, client.result)
    return tester.result


def local_audit(tester_df, client_df, *, spec: AuditSpec | None = None, tap=None, n_buckets: int = 128,
                release: ReleasePolicy | None = None, modulus_bits: int | None = None):
    """Both sessions in one process; `release` defaults to no release controls (exact
    results, for comparisons with plaintext twins); `modulus_bits`: the Paillier key's
    size (default the tests' small TEST_BITS)."""
    spec = spec or AuditSpec(metric="ero", client_dataset="d", bootstrap=50, seed=1)

    def loader(name, metric):
        assert name == spec.client_dataset
        frame = client_df.copy()
        frame["member_id"] = frame["member_id"].astype(str)
        return frame

    bits = modulus_bits or TEST_BITS
    tester = TesterSession(spec, tester_df, min_modulus_bits=bits, n_buckets=n_buckets,
                           release=release if release is not None else ReleasePolicy.off())
    client = ClientSession(loader, modulus_bits=bits, allow_insecure=True)
    try:
        return run_sessions(tester, client, tap), tester, client
    finally:
        tester.close()
        client.close()


def apply_ratio_mask(mask, num: int, den: int) -> tuple[int, int]:
    """What the Tester's homomorphic `RatioMask` masking computes, on plaintexts:
    (r*Num + e_num, r*Den + e_den) (design §4.7)."""
    return mask.r * num + mask.e_num, mask.r * den + mask.e_den


def write_inputs(directory, n: int, overlap: int, *, seed: int):
    """`make_inputs(n, n, overlap)` written as the Tester's probability table and the
    Test-Client's ERO dataset: (tester frame, client frame, table path, dataset path)."""
    tester, client = make_inputs(n, n, overlap, seed=seed)
    tp, cp = directory / "probabilities.csv", directory / "ero.csv"
    tester.to_csv(tp, index=False)
    client.to_csv(cp, index=False)
    return tester, client, tp, cp


def wait_until(condition, timeout: float = 15.0) -> bool:
    """Poll `condition()` until it holds (teardown runs a moment after the last message)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def netns_usable() -> tuple[bool, str]:
    """Whether tests may build network namespaces here, and if not, why."""
    if os.environ.get("PPRE_TEST_NETWORK", "").lower() == "loopback":
        return False, "PPRE_TEST_NETWORK=loopback"
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "not running as root"
    if not shutil.which("ip"):
        return False, "iproute2 `ip` not found"
    return True, ""


def pid_alive(pid: int) -> bool:
    """Whether a process exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exact_session(*args, **kw) -> TesterSession:
    """A TesterSession without release controls (unless a test gives its own): tests of
    the protocol's exactness compare with plaintext twins to 1e-9."""
    kw.setdefault("release", ReleasePolicy.off())
    return TesterSession(*args, **kw)

#: the services without release controls: exact results from small test inputs (the
#: controls themselves are tested in tests/test_release.py and tests/attacks/)
NO_RELEASE_CONTROLS = ReleasePolicy.off()


class CallContext:
    """A server-side call's context as gRPC gives it: the peer's verified names."""

    def __init__(self, **auth) -> None:
        self.auth = {k: [v.encode() for v in vs] for k, vs in auth.items()}
        self.aborted = None

    def auth_context(self):
        return self.auth

    def abort(self, code, message):
        self.aborted = (code, message)
        raise PermissionError(message)
