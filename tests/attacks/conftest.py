"""One synthetic population (`ppre synth` + public `ppre bisg`) for every attack test."""
from __future__ import annotations

import pytest

from tests.attacks.harness import Population, make_population


@pytest.fixture(scope="session")
def population(tmp_path_factory) -> Population:
    return make_population(tmp_path_factory.mktemp("attack-population"))
