"""An earlier revision of this repository, checked out beside it for a side-by-side bench run.

    from baseline import worktree
    with worktree("a27eb95") as (root, commit):
        ...  # run root's code (PYTHONPATH=root)

Used by scale.py, identical_outputs.py and verify_memory.py (`--baseline-rev`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[tuple[Path, str]]:
    """REV checked out (detached, `git worktree`) into a temporary directory: yields (root,
    commit); the worktree is removed on exit, also on error (or, if git cannot, deleted and
    pruned)."""
    with tempfile.TemporaryDirectory(prefix="rlx-amp-baseline-") as tmp:
        root = Path(tmp) / "tree"
        add = subprocess.run(["git", "worktree", "add", "-f", "--detach", str(root), rev], capture_output=True,
                             text=True, cwd=REPO)
        if add.returncode != 0:
            raise SystemExit(f"git worktree add {rev} failed: {add.stderr.strip()}")
        try:
            head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root, check=True)
            yield root, head.stdout.strip()
        finally:
            rm = subprocess.run(["git", "worktree", "remove", "--force", str(root)], capture_output=True, text=True,
                                cwd=REPO)
            if rm.returncode != 0:
                print(f"git worktree remove {root}: {rm.stderr.strip()}; removing it and pruning", flush=True)
                shutil.rmtree(root, ignore_errors=True)
                subprocess.run(["git", "worktree", "prune"], capture_output=True, cwd=REPO)
