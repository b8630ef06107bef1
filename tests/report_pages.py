"""The HTML reports the browser test renders, and a headless Chromium to look at them.

`make report-screenshots` runs the browser test with RLX_AMP_ARTIFACTS=docs/img, which is how
docs/reports.md's screenshot is made: the same commands, the same browser.

    CASES[name] = (fixture, rlx-amp arguments after MODEL, expected exit code)
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: name -> (fixture name in make_fixtures, rlx-amp arguments after MODEL, exit code)
CASES: dict[str, tuple[str, tuple[str, ...], int]] = {
    # The demo transformer passes under always-f16 (its -1e9 mask clamped to -65504).
    "passing": ("demo", ("--policy", "always-f16", "--verify", "--localize", "--provider", "cpu"), 0),
    # exp_overflow, the literal policy (--no-screen): Exp past 65504 gives Inf, then NaN from Inf/Inf.
    "failing": ("exp_overflow", ("--policy", "always-f16", "--verify", "--no-screen", "--localize", "--provider", "cpu"), 1),
    # mask_softmax: a doubled -1e9 mask overflows; repair keeps the overflowing nodes in f32.
    "repaired": ("mask_softmax", ("--policy", "always-f16", "--repair", "--localize", "--provider", "cpu"), 0),
}

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    """The Chromium executable: $RLX_AMP_CHROMIUM, or one on PATH; None when there is none."""
    explicit = os.environ.get("RLX_AMP_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


@dataclass
class PageView:
    """What a person sees when the page opens: console messages, every request it made, and facts."""

    console: list[tuple[str, str]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


def open_page(executable: str, page_path: Path, screenshots: dict[str, Path]) -> PageView:
    """Open `page_path` in headless Chromium, once per colour scheme in `screenshots`
    ({"light": png, "dark": png}), saving a full-page screenshot each time."""
    from playwright.sync_api import sync_playwright

    view = PageView()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            for scheme, png in screenshots.items():
                page = browser.new_page(viewport={"width": 1280, "height": 900}, color_scheme=scheme)  # type: ignore[arg-type]
                page.on("console", lambda m: view.console.append((m.type, m.text)))
                page.on("pageerror", lambda e: view.console.append(("pageerror", str(e))))
                page.on("request", lambda r: view.requests.append(r.url))
                page.goto(page_path.resolve().as_uri(), wait_until="load")
                view.facts = page.evaluate(
                    """() => ({
                        title: document.title,
                        svgs: document.querySelectorAll('figure svg').length,
                        nonEmptySvgs: [...document.querySelectorAll('figure svg')]
                            .filter(s => s.getBoundingClientRect().width > 100 && s.querySelector('path, use')).length,
                        tables: document.querySelectorAll('table').length,
                        headings: [...document.querySelectorAll('h2, h3')].map(h => h.textContent.trim()),
                        text: document.body.innerText,
                        overflowX: document.documentElement.scrollWidth > window.innerWidth,
                    })"""
                )
                png.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(png), full_page=True)
                page.close()
        finally:
            browser.close()
    return view
