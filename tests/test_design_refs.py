"""The repository stands alone, and its design citations resolve (docs/design.md).

Every file of the repository (what git tracks, plus new files it does not ignore; without
git, every file outside virtual environments, build outputs and caches) may cite the
design only as "design §N" (or a link such as `docs/design.md#s8`), and every such citation
must name a section that docs/design.md has. Nothing may point at a specification or a
paper file outside the repository: papers are cited by title in design §10.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
SKIP_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis", "mutants",
             "node_modules", "ppre.egg-info", ".venv-openmined"}
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".proto", ".yml", ".yaml", ".toml", ".txt", ".cfg", ".ini", ".sh", ".html",
                 ".json", ""}

# built from parts, so that this file does not match itself
OUTSIDE = [
    re.compile(re.escape("SPEC" + ".md")),
    re.compile(re.escape(".." + "/shared")),
    re.compile(r"(?<![\w-])" + "papers" + r"/"),
    re.compile(r"\b" + "SPEC" + r"(?:\s+sections?)?\s+\d"),  # the old spec's sections cited by number
]
NUMBER = r"\d+(?:\.\d+)*"
# "design §3.6", "design §3.6-§3.7, §4 and §7", "Design\n§2"; the list goes on while numbers follow
CITATION = re.compile(r"\b[Dd]esign(?:\.md)?,?\s+§\s?(" + NUMBER + r")((?:\s*(?:[-–,]|and|or)\s*§?\s?" + NUMBER
                      + r"(?![\d.]*\d))*)")
LINK = re.compile(r"design\.md#([\w.-]+)")
#: the test that looks for such references holds examples of them
CHECKERS = {Path(__file__).resolve()}
HEADING = re.compile(r"^#{2,4}\s+(?:<a id=\"([^\"]+)\"></a>)?(" + NUMBER + r")\.?\s", re.M)


def repository_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True, timeout=60).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        names = []
        for top, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
            names += [os.path.relpath(os.path.join(top, f), ROOT) for f in files]
    paths = [ROOT / n for n in names if not set(Path(n).parts) & SKIP_DIRS]
    return [p for p in paths if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name == "Dockerfile")]


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def design_sections() -> tuple[set[str], set[str]]:
    """docs/design.md's section numbers and its link anchors (explicit ids and GitHub slugs)."""
    text = read(DESIGN)
    numbers, anchors = set(), set()
    for m in HEADING.finditer(text):
        numbers.add(m.group(2))
        if m.group(1):
            anchors.add(m.group(1))
    for line in text.splitlines():
        if line.startswith("#"):
            title = re.sub(r"<[^>]+>", "", line.lstrip("#")).strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return numbers, anchors


def cited_sections(text: str) -> list[str]:
    out = []
    for m in CITATION.finditer(text):
        out.append(m.group(1))
        out += re.findall(NUMBER, m.group(2))
    return out


def test_design_document_exists_with_numbered_sections():
    numbers, anchors = design_sections()
    assert {str(n) for n in range(1, 11)} <= numbers, sorted(numbers)
    assert "s8" in anchors and "s3-1" in anchors


def test_no_file_points_outside_the_repository():
    files = repository_files()
    assert len(files) > 50, "the repository's files were not found"
    found = []
    for path in files:
        if path.resolve() in CHECKERS:
            continue
        for n, line in enumerate(read(path).splitlines(), 1):
            if any(p.search(line) for p in OUTSIDE):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, "references to files outside the repository (cite docs/design.md instead):\n" + "\n".join(found)


def test_every_design_citation_names_an_existing_section():
    numbers, anchors = design_sections()
    bad = []
    for path in repository_files():
        text = read(path)
        for sec in cited_sections(text):
            if sec not in numbers:
                bad.append(f"{path.relative_to(ROOT)}: design §{sec}")
        if path.suffix == ".md" or path.suffix == ".py":
            for anchor in LINK.findall(text):
                if anchor not in anchors:
                    bad.append(f"{path.relative_to(ROOT)}: design.md#{anchor}")
    assert not bad, "citations of sections docs/design.md does not have:\n" + "\n".join(sorted(set(bad)))


def test_design_document_cross_references_resolve():
    """Inside docs/design.md a bare "§N" is one of its own sections."""
    numbers, _ = design_sections()
    text = read(DESIGN)
    cited = re.findall(r"§\s?(" + NUMBER + r")(?![\d.]*\d)", text)
    assert cited and not sorted(set(cited) - numbers)


@pytest.mark.parametrize("line, outside", [
    ("(" + "SPEC" + ".md section 3)", True),
    ("(" + "SPEC" + " 8)", True),
    ("(" + "SPEC" + " section 2)", True),
    ("see ../" + "shared/notes", True),
    ("(`" + "papers" + "/attack.txt`)", True),
    ("[--executor SPEC]", False),
    ("TABLE_UNSPECIFIED = 0", False),
    ("(design §8; Hamman, Chen and Dutta 2023)", False),
])
def test_outside_patterns(line, outside):
    assert any(p.search(line) for p in OUTSIDE) == outside


@pytest.mark.parametrize("text, expected", [
    ("(design §3.6, §3.7, §4.7)", ["3.6", "3.7", "4.7"]),
    ("design §3.1-§3.5 between", ["3.1", "3.5"]),
    ("Design\n§2, via", ["2"]),
    ("[design §5.6](../design.md#s5-6)", ["5.6"]),
    ("design §3 and §7: no member", ["3", "7"]),
    ("design §2.4's default", ["2.4"]),
    ("the design itself (DJN 2010, §4)", []),
])
def test_citation_forms(text, expected):
    assert cited_sections(text) == expected
