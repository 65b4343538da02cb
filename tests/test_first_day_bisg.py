"""A new user's own exports in `ppre tester validate-bisg`: the members and Self-ID files
are read through the column mapping (`--id-column`, `--column OURS=THEIRS`), one mapping
for both files, as `ppre tester serve` and `ppre bisg` read them (docs/inputs.md)."""
from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

from tests.processes import child_env, ppre_argv

SURNAMES = ("GARCIA", "SMITH", "NGUYEN", "JOHNSON", "KIM", "LOPEZ", "WILLIAMS", "PATEL")
ZIPS = ("10001", "60601", "94103", "30303", "77002")
RACES = ("white", "black", "api", "hispanic")


def ppre(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*ppre_argv(), *args], capture_output=True, text=True, timeout=60, env=child_env(), cwd=cwd)


def own_exports(folder: Path) -> None:
    """A CRM export and a survey export, neither with PPRE's column names."""
    rng = random.Random(1)
    (folder / "crm.csv").write_text("Customer Key,Last Name,ZIP Code\n" + "".join(
        f"c{i},{rng.choice(SURNAMES)},{rng.choice(ZIPS)}\n" for i in range(40)))
    (folder / "survey.csv").write_text("Customer Key,race\n" + "".join(
        f"c{i},{rng.choice(RACES)}\n" for i in range(0, 40, 2)))


def test_validate_bisg_reads_ones_own_exports_through_the_column_mapping(tmp_path):
    own_exports(tmp_path)
    out = ppre("tester", "validate-bisg", "--members", "crm.csv", "--self-id", "survey.csv", "--json",
               "--id-column", "Customer Key", "--column", "surname=Last Name", "--column", "zip=ZIP Code",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["members"]["read"] == 40 and report["self_id"] == {
        "read": 20, "used": 20, "not_among_members": 0, "of_dropped_members": 0}


def test_validate_bisg_names_a_mapping_to_a_column_it_does_not_read(tmp_path):
    own_exports(tmp_path)
    out = ppre("tester", "validate-bisg", "--members", "crm.csv", "--self-id", "survey.csv",
               "--id-column", "Customer Key", "--column", "surnme=Last Name", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--column" in out.stderr and "did you mean 'surname'?" in out.stderr
