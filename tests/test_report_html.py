"""The HTML report as a person sees it: rendered for a passing, a failing (NaN) and a repaired
fixture, opened in headless Chromium (light and dark), with no console error and no request
leaving the file, and its plots and tables there. Screenshots go to $RLX_AMP_ARTIFACTS when set
(CI keeps them), else beside the test's temporary files.

Skipped only when no Chromium or no playwright can be found, and the skip says which.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import onnx
import pytest

from fixtures.make_fixtures import BROKEN_IN_F16, DEMO
from tests.helpers import rlx
from tests.report_pages import CASES, chromium, open_page

REPO = Path(__file__).resolve().parent.parent


def _model(tmp_path: Path, fixture: str) -> str:
    """The fixture saved in `tmp_path`, by its bare file name (the page shows the names as given)."""
    if fixture == "demo":
        shutil.copy(REPO / "fixtures" / "models" / DEMO, tmp_path / DEMO)
        return DEMO
    onnx.save(BROKEN_IN_F16[fixture]().model, str(tmp_path / f"{fixture}.onnx"))
    return f"{fixture}.onnx"


def _render(tmp_path: Path, name: str) -> Path:
    fixture, args, code = CASES[name]
    model = _model(tmp_path, fixture)
    result = rlx(model, "-o", f"{name}.onnx", *args, "--report-html", f"{name}.html", "-q", cwd=tmp_path)
    assert result.returncode == code, result.stdout + result.stderr
    return tmp_path / f"{name}.html"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_page_is_self_contained(tmp_path: Path, name: str) -> None:
    """Without a browser: one file, no script, no reference to anything outside it."""
    text = _render(tmp_path, name).read_text()
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#|data:)""", text), "a reference leaves the file"
    assert not re.search(r"url\((?!#)", text), "a CSS or SVG url() leaves the file"
    assert text.count("<svg") >= 4  # drift plots, precision bars (and localize / repair)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_page_as_a_person_sees_it(tmp_path: Path, name: str) -> None:
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set RLX_AMP_CHROMIUM); .ci/run installs it")
    pytest.importorskip("playwright", reason="playwright is not installed (pip install -e '.[test]')")
    page = _render(tmp_path, name)
    artifacts = Path(os.environ.get("RLX_AMP_ARTIFACTS") or tmp_path)
    shots = {scheme: artifacts / f"report-{name}-{scheme}.png" for scheme in ("light", "dark")}
    view = open_page(executable, page, shots)
    errors = [(kind, text) for kind, text in view.console if kind in ("error", "pageerror", "warning")]
    assert errors == [], errors
    assert set(view.requests) == {page.resolve().as_uri()}, view.requests  # nothing but the file itself
    facts = view.facts
    assert facts["title"].startswith("rlx-amp")
    assert facts["nonEmptySvgs"] == facts["svgs"] >= 4  # every plot drawn, none empty or collapsed
    assert facts["tables"] >= 4 and not facts["overflowX"]
    text = facts["text"]
    assert "Where drift starts" in text and "Conversion" in facts["headings"]
    if name == "passing":
        assert "Verdict: passed" in text and "Output y PASS" in text
    if name == "failing":
        assert "Verdict: failed" in text and "new NaN" in text and "NaN/Inf appears" in text
        assert "Minimum tolerances that would have passed" in text
    if name == "repaired":
        assert "Repair" in facts["headings"] and "Met the tolerance" in text and "repair: overflow" in text
    for png in shots.values():
        assert png.stat().st_size > 20_000  # a rendered page, not a blank one


def test_a_batch_is_one_page_with_a_section_per_model(tmp_path: Path) -> None:
    """Batch mode: one page, a section per converted model, the unreadable one as ERROR; the
    verify command writes the same page for its one pair."""
    for name in ("exp_overflow", "mask_softmax"):
        onnx.save(BROKEN_IN_F16[name]().model, str(tmp_path / f"{name}.onnx"))
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    (tmp_path / "out").mkdir()
    result = rlx("exp_overflow.onnx", "mask_softmax.onnx", "broken.onnx", "--policy", "always-f16", "--out-dir", "out",
                 "--verify", "--no-screen", "--provider", "cpu", "--report-html", "batch.html", "-q", cwd=tmp_path)
    assert result.returncode == 2, result.stderr  # the worst: a bad input
    text = (tmp_path / "batch.html").read_text()
    assert text.count("<h2 id=") == 2  # one section per converted model
    assert "out/exp_overflow.onnx" in text and "out/mask_softmax.onnx" in text
    shown = re.sub(r"<[^>]+>", "", text)  # what a reader sees, without the markup
    assert "broken.onnx" in shown and "ERROR" in shown and "Verdict: failed" in shown
    verified = rlx("verify", "mask_softmax.onnx", "out/mask_softmax.onnx", "--provider", "cpu", "--report-html",
                   "v.html", "-q", cwd=tmp_path)
    assert verified.returncode == 1  # the plain always-f16 conversion overflows
    page = (tmp_path / "v.html").read_text()
    assert "rlx-amp drift report" in page and page.count("<svg") == 2 and "Conversion</h3>" not in page
