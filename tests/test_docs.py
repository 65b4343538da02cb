"""The documentation holds together (docs/development.md, "Tests that keep the
documentation true").

* every relative link in README.md and docs/ names a file of the repository, and a
  heading (or an explicit ``<a id>``) of that file where it names an anchor;
* every page of docs/ is reachable from README.md by following links;
* the README stays a user's page: under 400 lines, with the set-up commands CI runs
  and one line per metric saying from which size it is usable;
* docs/configuration.md names every command and every option of the CLI, and
  docs/python-api.md every parameter of `ppre.audit_local`.

Fast: text only, plus the CLI's own parser.
"""
from __future__ import annotations

import argparse
import re
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
EXPLICIT_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def _prose(text: str) -> str:
    """The text without fenced code blocks (their brackets are not links)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation
    removed except '-' and '_', spaces to '-'."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _prose(page.read_text(encoding="utf-8"))
    found: set[str] = set(EXPLICIT_ID.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(_prose(page.read_text(encoding="utf-8")))


def _local(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:


def _resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


def test_every_relative_link_names_an_existing_file_and_heading():
    broken = []
    for page in PAGES:
        for target in filter(_local, links(page)):
            path, anchor = _resolve(page, target)
            where = f"{page.relative_to(ROOT)} -> {target}"
            if not path.exists():
                broken.append(f"{where}: no such file")
            elif ROOT not in path.parents and path != ROOT:
                broken.append(f"{where}: outside the repository")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{where}: no heading '#{anchor}' in {path.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    reached, queue = {README}, deque([README])
    while queue:
        page = queue.popleft()
        for target in filter(_local, links(page)):
            path, _ = _resolve(page, target)
            if path.is_dir():
                path = path / "README.md"
            if path.suffix == ".md" and path.exists() and path not in reached:
                reached.add(path)
                queue.append(path)
    unreached = [str(p.relative_to(ROOT)) for p in PAGES if p not in reached]
    assert not unreached, f"pages no link from README.md leads to: {unreached}"


def test_slugs_follow_github():
    assert slug("Column mapping: your files as they are") == "column-mapping-your-files-as-they-are"
    assert slug("The report page: `ppre audit --report DIR`") == "the-report-page-ppre-audit---report-dir"
    assert slug("Logs: `--log-format text|json`") == "logs---log-format-textjson"
    assert slug("ERO — false-positive burden") == "ero--false-positive-burden"


# --------------------------------------------------------------------------- the README

def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _ci_test_command() -> str:
    """The one command line of .ci/run that sets up and runs the tests."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    (test_command,) = [line.strip() for line in ci.splitlines() if line.startswith("python3 -m venv")]
    return test_command


def test_the_readme_is_a_users_page_under_400_lines():
    assert len(_readme().splitlines()) < 400


def test_the_readme_holds_the_test_command_ci_runs_and_the_demo_command():
    test_command = _ci_test_command()
    blocks = re.findall(r"^```bash\n(.*?)^```", _readme(), flags=re.S | re.M)
    commands = {line.strip() for block in blocks for line in block.splitlines()}
    assert test_command in commands, "the README's test command must be exactly what .ci/run runs"
    set_up, _ = test_command.split(" && .venv/bin/python -m pytest", 1)
    assert f"{set_up} && .venv/bin/ppre demo" in commands


def test_the_readme_says_from_which_size_each_metric_is_usable():
    from common.metrics import METRICS
    text = _readme()
    start = text.index("### How large an audit must be under the default controls")
    section = text[start:text.index("\n#", start + 1)]
    bullets = [line for line in section.splitlines() if line.startswith("- **")]
    assert len(bullets) == len(METRICS), bullets
    names = {"ero": "ERO", "lot": "LOT", "mqos-ndcg": "MQOS-NDCG", "pot": "POT", "mqos-auc": "MQOS-AUC",
             "output": "Output metric", "prob-count": "Probabilistic count"}
    assert set(names) == set(METRICS)
    for metric, name in names.items():
        assert any(b.startswith(f"- **{name}**") for b in bullets), metric


# --------------------------------------------------------------------------- the configuration reference

def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    from ppre.cli import build_parser

    found = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found.append((path, parser))
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, f"{path} {name}")

    walk(build_parser(), "ppre")
    return found


def test_the_configuration_page_names_every_command_and_option():
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    missing = []
    for path, parser in _commands():
        if f"`{path}`" not in page:
            missing.append(f"command `{path}`")
        for action in parser._actions:
            for option in action.option_strings:
                named = re.search(rf"`{re.escape(option)}[` ]", page)
                if option.startswith("--") and option != "--help" and not named:
                    missing.append(f"{path} {option}")
    assert not missing, "docs/configuration.md does not name: " + ", ".join(missing)


def test_the_python_api_page_names_every_parameter():
    import inspect

    from ppre import audit_local
    page = (DOCS / "python-api.md").read_text(encoding="utf-8")
    missing = [name for name in inspect.signature(audit_local).parameters if not re.search(rf"\b{name}\b", page)]
    assert not missing, f"docs/python-api.md does not name audit_local's parameters {missing}"


def test_every_flag_the_readme_names_exists():
    """The README names only flags `ppre` has (and Docker Compose's `--build`; the test
    command's flags, pip's and pytest's, are left out)."""
    options: set[str] = set()
    for _, parser in _commands():
        for action in parser._actions:
            options.update(action.option_strings)
    from ppre.cli import build_parser
    options.update(o for a in build_parser()._actions for o in a.option_strings)
    test_command = _ci_test_command()
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", _readme().replace(test_command, "")))
    unknown = sorted(named - options - {"--build"})
    assert not unknown, f"README.md names flags no ppre command has: {unknown}"
