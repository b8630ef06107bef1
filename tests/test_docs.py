"""The documents a user reads hold true (issue 24): README is a short front page whose quick
start and test command are the real ones; every flag the docs name is one the CLI accepts, and
docs/cli.md names every flag it accepts and every exit code; the Python examples run as
written; mkdocs' navigation lists every page; CHANGELOG keeps its form; one version."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"

#: Pages the pipeline integrations' own work writes (their flags are Olive's and onnx-ir's).
PIPELINE_PAGES = {"olive.md", "onnx-ir.md"}

#: Flags of other tools that the docs name: the benchmark scripts', pip's, optimum-cli's, olive's, mkdocs'.
OTHER_TOOLS_FLAGS = {
    "--external", "--minimality", "--nodes", "--model", "--peers-max-nodes", "--peer-timeout", "--contenders",
    "--no-deps", "--index", "--workdir", "--keep", "--models", "--budget", "--baseline-rev", "--rounds",
    "--repeats", "--repeat", "--node-cases", "--emulation", "--task", "--config", "--package-config", "--strict",
    "--rlx-policy", "--tv-python", "--autocast-python",  # bench/gain_zoo.py
    "--policies",  # bench/scale.py
    "--runs",  # bench/startup.py, bench/task_cost.py
    "--dist",  # pytest-xdist (make test)
    "--onnx", "--save", "--strongly", "--trt", "--onnxrt",  # trtexec, polygraphy run (docs/recipes.md)
}


def _cli_flags() -> set[str]:
    import click

    from rlx_onnx_amp.cli import main

    flags: set[str] = {"--help", "--version"}
    for command in main.commands.values():
        for param in command.params:
            if isinstance(param, click.Option):
                flags.update(o for o in param.opts + param.secondary_opts if o.startswith("--"))
    return flags


def _flags_named(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


def _our_pages() -> list[Path]:
    return [README, *(p for p in sorted(DOCS.glob("*.md")) if p.name not in PIPELINE_PAGES)]


# ---- README -----------------------------------------------------------------------------------

def test_readme_is_a_front_page() -> None:
    readme = README.read_bytes()
    assert len(readme) <= 16 * 1024, f"README.md is {len(readme)} bytes; move the detail under docs/"
    text = readme.decode()
    # No figure or statement rests on a commit hash alone: figures live in docs/benchmarks.md.
    assert not re.findall(r"`[0-9a-f]{7,12}`", text)


def test_readme_quick_start_is_the_real_one() -> None:
    """The one command that installs and runs the main job on the bundled demo, and the one that
    runs the tests, which is exactly what CI runs, and which builds the docs."""
    readme = README.read_text()
    # The light set: the package and onnxruntime's CPU wheel, nothing the tests need.
    assert ('pip install -e ".[cpu]" && rlx-amp fixtures/models/demo_transformer.onnx --policy auto-mixed '
            "-o demo_auto_mixed.onnx") in readme
    assert (REPO / "fixtures" / "models" / "demo_transformer.onnx").is_file()
    assert "```sh\nmake check\n```" in readme
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert ci[-1] == "make check", "CI must run exactly README's test command"
    makefile = (REPO / "Makefile").read_text()
    (check_deps,) = re.findall(r"^check: (.*)$", makefile, re.M)
    assert check_deps.split() == ["install"] and re.search(r"^check: .*\n\t\$\(MAKE\) test$", makefile, re.M)
    (test_deps,) = re.findall(r"^test: (.*)$", makefile, re.M)
    assert "docs" in test_deps.split()
    docs_recipe = re.search(r"^docs:\n((?:\t.*\n)+)", makefile, re.M).group(1)  # type: ignore[union-attr]
    assert "mkdocs build --strict" in docs_recipe
    # --quiet hides the warnings --strict counts: with it a broken link builds with exit 0.
    assert "--quiet" not in docs_recipe and " -q" not in docs_recipe


# ---- flags, exit codes -------------------------------------------------------------------------

def test_every_flag_the_docs_name_is_accepted() -> None:
    unknown = {}
    accepted = _cli_flags() | OTHER_TOOLS_FLAGS
    for page in _our_pages():
        bad = sorted(_flags_named(page.read_text()) - accepted)
        if bad:
            unknown[page.name] = bad
    assert not unknown, f"the docs name flags the CLI does not accept: {unknown}"


def test_every_flag_the_cli_accepts_is_in_the_reference() -> None:
    reference = "".join((DOCS / name).read_text() for name in ("cli.md", *sorted(PIPELINE_PAGES)))
    missing = sorted(_cli_flags() - _flags_named(reference))
    assert not missing, f"docs/cli.md does not document: {missing}"


def test_the_reference_names_every_exit_code() -> None:
    from rlx_onnx_amp import exits

    codes = {v for k, v in vars(exits).items() if k.startswith("EXIT_") and isinstance(v, int)} | {3}
    cli = (DOCS / "cli.md").read_text()
    table = cli[cli.index("## Exit codes"):]
    missing = sorted(c for c in codes if f"`{c}`" not in table)
    assert not missing, f"docs/cli.md's exit code table lacks {missing}"


# ---- the Python examples -----------------------------------------------------------------------

@pytest.mark.parametrize(("page", "after"), [("docs/api.md", "# Python API"), ("README.md", "## Python API")])
def test_python_example_runs_as_written(page: str, after: str, tmp_path: Path) -> None:
    text = (REPO / page).read_text()
    (example,) = re.findall(re.escape(after) + r"\n.*?```python\n(.*?)```", text, re.S)
    result = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "True" in result.stdout  # the example verifies what it wrote, and it passes


# ---- the site ----------------------------------------------------------------------------------

def test_mkdocs_navigation_lists_every_page() -> None:
    """`mkdocs build --strict` (make test) fails on a page left out; this says which, without mkdocs."""
    config = (REPO / "mkdocs.yml").read_text()
    assert re.search(r"^docs_dir: docs$", config, re.M)
    nav = re.findall(r"^\s+- [^:]+: (\S+\.md)$", config, re.M)
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    assert len(nav) == len(set(nav))


def _mkdocs_build(root: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    # The timeout only guards against a hang: a loaded machine builds the site in seconds.
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(root / "site")],
                          capture_output=True, text=True, cwd=root, timeout=600)


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    """`make docs`' build of the real tree: no warning, so exit 0."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    result = _mkdocs_build(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr


def test_a_broken_docs_link_fails_the_build(tmp_path: Path) -> None:
    """The same build with one link to a page that does not exist fails, and says which link."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    page = tmp_path / "docs" / "testing.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = _mkdocs_build(tmp_path)
    assert result.returncode != 0, result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert any("testing.md" in line and "no-such-page.md" in line for line in warnings), result.stderr


# ---- CHANGELOG and the version -----------------------------------------------------------------

def test_changelog_keeps_a_changelog() -> None:
    """https://keepachangelog.com/en/1.1.0/: `## [Unreleased]` first, then `## [X.Y.Z] - YYYY-MM-DD`
    newest first, each with `### Added/Changed/Deprecated/Removed/Fixed/Security` sections; the
    current version has its heading, or is what [Unreleased] will become."""
    import rlx_onnx_amp

    text = (REPO / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings and headings[0] == "[Unreleased]", headings[:1]
    versions = []
    for heading in headings[1:]:
        found = re.fullmatch(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})", heading)
        assert found, f"not a version heading: {heading!r}"
        versions.append(tuple(int(n) for n in found.group(1).split(".")))
    assert versions == sorted(versions, reverse=True)
    sections = set(re.findall(r"^### (.*)$", text, re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, sections
    version = rlx_onnx_amp.__version__
    assert f"## [{version}] - " in text or "## [Unreleased]" in text


def test_one_version() -> None:
    """`rlx-amp --version`, the installed metadata and `rlx_onnx_amp.__version__` agree."""
    from importlib.metadata import version

    import rlx_onnx_amp
    from tests.helpers import rlx

    assert version("rlx-onnx-amp") == rlx_onnx_amp.__version__
    result = rlx("--version")
    assert result.returncode == 0
    assert result.stdout.strip().endswith(f"version {rlx_onnx_amp.__version__}"), result.stdout
