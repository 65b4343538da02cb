"""Every test runs with its own user data directory, so that `ppre audit --local`'s
privacy ledger (`tester_service.release.local_ledger_path`) never carries budget from
one test, or from the developer's own runs, into another."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_data_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
