"""Files are sacred: the paths a run reads and writes, and how outputs reach the disk.

The rules (docs/files.md):

- **Paths are planned.** Every path a run will read (models, their external data, input files,
  map files) and write (models, data files, reports, saved inputs) is resolved, links followed,
  and checked before any output is written (`RunPaths`): no written path may be, or alias, a
  read path or another written path.
- **Outputs appear whole or not at all.** Each output is written into a private staging
  directory beside its final path and moved into place by `OutputSet.commit`, all outputs of a
  run together, only after the run succeeded. An earlier output is replaced only then.
- **A model and its data file are one.** A model's default data file is named after its
  content (`OUT.<sha256 prefix>.data`), so no other run can write a different file under that
  name: the data file is moved in first (a new name, referenced by nothing yet), then the model
  by one atomic rename. The data files of the model it replaced are removed afterwards.
  Commits into one directory are serialized by a lock on the directory.
- **External data stays inside the model's directory** (`external_data_path`), as onnx
  requires when it loads: no absolute path, no `..`, no symlink, and offsets and lengths within
  the file.
- Outputs get the mode the umask gives an ordinary new file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.stops import raise_stop, signals_deferred, stop_requested

try:  # POSIX only: elsewhere commits into one directory are not serialized across processes
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "OutputSet",
    "OutputState",
    "RunPaths",
    "ScratchDir",
    "check_data_name",
    "check_writable",
    "content_data_name",
    "external_data_path",
    "is_content_data_name",
]

logger = logging.getLogger(__name__)

STAGE_PREFIX = ".rlx-amp-stage-"

#: Longest file name most file systems accept.
NAME_MAX = 255


def content_data_name(model_name: str, digest: str) -> str:
    """The default data file name of a model: its name and a prefix of its data's sha256."""
    return f"{model_name}.{digest[:16]}.data"


def is_content_data_name(model_name: str, name: str) -> bool:
    return re.fullmatch(re.escape(model_name) + r"\.[0-9a-f]{16}\.data", name) is not None


def check_data_name(name: str) -> str:
    """`--data-name` must be a plain file name: the data file lives beside the model."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise InputError(f"--data-name: {name!r} must be a plain file name (the data file is written beside the model)")
    if len(os.fsencode(name)) > NAME_MAX:
        raise InputError(f"--data-name: {name[:40]}...: file name too long")
    return name


def external_data_path(base_dir: Path, location: str, tensor: str, model: str) -> Path:
    """The file holding a tensor's external data, checked to lie inside `base_dir`."""
    where = f"{model}: tensor {tensor!r}: external data location {location!r}"
    if not location:
        raise InputError(f"{model}: tensor {tensor!r}: external data has no location")
    if "\0" in location:
        raise InputError(f"{where} is not a file name")
    posix, windows = PurePosixPath(location), PureWindowsPath(location)
    if posix.is_absolute() or windows.is_absolute() or windows.drive:
        raise InputError(f"{where} is an absolute path; external data must lie in the model's directory")
    if ".." in posix.parts or ".." in windows.parts:
        raise InputError(f"{where} leads out of the model's directory")
    path = base_dir / location
    try:
        # Every component below the model's directory: no link may lead anywhere.
        current = base_dir
        for part in posix.parts:
            current = current / part
            if current.is_symlink():
                raise InputError(f"{where} is a symbolic link; onnx loads external data only from regular files")
        info = path.stat()
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except OSError as e:
        raise InputError(f"{where}: cannot read ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{where} is not a regular file")
    return path


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


@dataclass(frozen=True)
class _Planned:
    role: str
    path: Path = field(compare=False)
    real: Path

    def identity(self) -> tuple[int, int] | None:
        try:
            info = os.stat(self.real)
        except OSError:
            return None
        return info.st_dev, info.st_ino

    def same_file(self, other: _Planned) -> bool:
        if self.real == other.real:
            return True
        mine, theirs = self.identity(), other.identity()
        return mine is not None and mine == theirs  # hard links


class RunPaths:
    """The paths one run reads and writes; `check` before writing anything."""

    def __init__(self) -> None:
        self.reads: list[_Planned] = []
        self.writes: list[_Planned] = []

    def read(self, path: str | os.PathLike[str], role: str) -> None:
        _add_planned(self.reads, Path(path), role)

    def write(self, path: str | os.PathLike[str], role: str) -> None:
        _add_planned(self.writes, Path(path), role)

    def protected(self) -> list[Path]:
        """The read paths, which no step of the run may replace or remove."""
        return [r.real for r in self.reads]

    def check(self) -> None:
        """InputError naming both paths when a written path is a read one or another written one."""
        for k, w in enumerate(self.writes):
            for r in self.reads:
                if w.same_file(r):
                    raise InputError(
                        f"{w.path}: the {w.role} would overwrite the {r.role} {r.path}; choose another path"
                    )
            for other in self.writes[:k]:
                if w.same_file(other):
                    raise InputError(
                        f"{w.path}: the {w.role} and the {other.role} ({other.path}) are the same file; "
                        "choose another path"
                    )
            check_writable(w.path, w.role)


def _add_planned(planned: list[_Planned], path: Path, role: str) -> None:
    _check_name(path, role)
    entry = _Planned(role, path, _real(path))
    if entry not in planned:
        planned.append(entry)


def _check_name(path: Path, role: str) -> None:
    if "\0" in str(path):
        raise InputError(f"{path!r}: the {role} path contains a NUL character")
    if any(len(os.fsencode(part)) > NAME_MAX for part in path.parts):
        raise InputError(f"{str(path)[:60]}...: file name too long for the {role}")


def check_writable(path: Path, role: str) -> None:
    """The output can be created: its directory exists and is writable, and no directory,
    FIFO or device sits at the path."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except NotADirectoryError:
        raise InputError(f"{path}: directory {directory} of the {role} does not exist (a file is in the way)") from None
    except OSError as e:
        raise InputError(f"{path}: cannot use as the {role} ({e.strerror})") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise InputError(f"{path}: the {role} path is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: the {role} path exists and is not a regular file")
    if not directory.is_dir():
        raise InputError(f"{path}: directory {directory} of the {role} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"{path}: directory {directory} of the {role} is not writable")


#: The staging and scratch directories that exist now (`remove_leftover_dirs`).
_LIVE_DIRS: set[Path] = set()
#: Told of each private directory made (True) and removed (False) in this process: a supervised
#: run's child tells its supervisor, which removes what a crash left (`supervise`).
_dir_listener: Callable[[Path, bool], None] | None = None


def listen_to_dirs(listener: Callable[[Path, bool], None] | None) -> None:
    """Where this process tells of the private directories it makes and removes (None: nowhere)."""
    global _dir_listener
    _dir_listener = listener


def private_dir(prefix: str, parent: str | os.PathLike[str] | None = None) -> Path:
    """A new private directory (mode 0700; under TMPDIR, or in `parent`), not cut in half by
    Ctrl-C or SIGTERM; `remove_private_dir` removes it."""
    with signals_deferred():
        made = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        _LIVE_DIRS.add(made)
        if _dir_listener is not None:
            _dir_listener(made, True)
    return made


def remove_private_dir(path: Path) -> None:
    with signals_deferred():
        shutil.rmtree(path, ignore_errors=True)
        _LIVE_DIRS.discard(path)
        if _dir_listener is not None:
            _dir_listener(path, False)


def live_dirs() -> frozenset[Path]:
    """The staging and scratch directories that exist now."""
    return frozenset(_LIVE_DIRS)


def remove_leftover_dirs(kept: frozenset[Path] = frozenset()) -> None:
    """Remove the staging and scratch directories still there when a run ends, but for
    `kept` (those that were there when it started): each owner removes its own, unless a
    signal cut short the code between its creation and its `with` block, or its removal."""
    with signals_deferred():
        for path in _LIVE_DIRS - kept:
            remove_private_dir(path)


if hasattr(os, "register_at_fork"):  # POSIX; a forked worker's are its own
    os.register_at_fork(after_in_child=_LIVE_DIRS.clear)


@dataclass(frozen=True)
class OutputState:
    """An `OutputSet`'s staging, as one process hands it to another (it pickles)."""

    stages: dict[Path, Path]
    files: list[tuple[int, Path, Path]]
    models: list[tuple[Path, set[str]]]


class OutputSet:
    """The files one run writes, staged and committed together.

    `stage(final)` gives a path in a private directory beside `final` (same file system, so the
    commit is a rename); write the file there. `commit()` moves every staged file into place,
    data files first, models next, the rest last, and removes data files that the replaced
    models used and the new ones do not. Leaving the `with` block without a commit (an error,
    Ctrl-C, SIGTERM) removes everything staged: nothing was written.
    """

    DATA, MODEL, OTHER = 0, 1, 2

    def __init__(self, protected: Iterable[Path] = ()) -> None:
        self._protected = {_real(p) for p in protected}
        self._stages: dict[Path, Path] = {}
        self._files: list[tuple[int, Path, Path]] = []  # (order, staged, final)
        self._models: list[tuple[Path, set[str]]] = []  # final model path -> data file names it uses

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def protect(self, paths: Iterable[Path]) -> None:
        self._protected |= {_real(p) for p in paths}

    def stage_dir(self, final: Path) -> Path:
        directory = final.parent if str(final.parent) else Path(".")
        key = _real(directory)
        if key not in self._stages:
            try:
                self._stages[key] = private_dir(STAGE_PREFIX, directory)
            except OSError as e:
                raise InputError(f"{final}: cannot write in {directory} ({e.strerror})") from None
        return self._stages[key]

    def stage(self, final: str | os.PathLike[str], order: int = OTHER) -> Path:
        """A staging path for `final`, committed in `order` (DATA, MODEL, OTHER)."""
        final = Path(final)
        staged = self.stage_dir(final) / final.name
        self._files = [f for f in self._files if f[2] != final]
        self._files.append((order, staged, final))
        return staged

    def model_uses(self, final: Path, data_names: Iterable[str]) -> None:
        """Record the data files a staged model reads, so the commit can retire old ones."""
        self._models.append((Path(final), set(data_names)))

    def write_text(self, final: str | os.PathLike[str], text: str) -> None:
        self.write_bytes(final, text.encode())

    def write_bytes(self, final: str | os.PathLike[str], data: bytes) -> None:
        staged = self.stage(final)
        try:
            with open(staged, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise InputError(f"{final}: cannot write ({e.strerror})") from None

    def commit(self) -> None:
        """Move every staged file into place. Signals wait until the moves are done. After a
        SIGINT or SIGTERM whose exception was lost (`stops.stop_requested`) nothing is moved."""
        with signals_deferred(committing=True), _locked(self._stages):
            if stop_requested():
                raise_stop()
            for _, staged, final in sorted(self._files, key=lambda f: f[0]):
                if (
                    _real(final) in self._protected
                ):  # a data file name that is an input's (checked before; never replace one)
                    raise InputError(f"{final}: would overwrite an input of this run")
                try:
                    os.replace(staged, final)
                except OSError as e:
                    raise InputError(f"{final}: cannot write ({e.strerror})") from None
            self._retire_old_data()
        self._files.clear()
        self.discard()

    def _retire_old_data(self) -> None:
        """Remove the content-named data files of the models just replaced."""
        for model, uses in self._models:
            directory = model.parent if str(model.parent) else Path(".")
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                if name in uses or not is_content_data_name(model.name, name):
                    continue
                old = directory / name
                if _real(old) in self._protected:
                    continue
                with contextlib.suppress(OSError):
                    old.unlink()
                    logger.info("removed %s (data of the replaced %s)", old, model)
        self._models.clear()

    def state(self) -> OutputState:
        """What is staged, to hand to the process that commits (`adopt`)."""
        return OutputState(dict(self._stages), list(self._files), [(m, set(u)) for m, u in self._models])

    def adopt(self, state: OutputState) -> None:
        """Take over what another process staged in a copy of this set (a supervised child):
        its staging directories are this process's to commit or remove from now on."""
        with signals_deferred():
            self._stages.update(state.stages)
            _LIVE_DIRS.update(state.stages.values())
            self._files = list(state.files)
            self._models = list(state.models)

    def discard(self) -> None:
        with signals_deferred():
            for stage in self._stages.values():
                remove_private_dir(stage)
            self._stages.clear()
            self._files.clear()


class ScratchDir:
    """A private temporary directory (mode 0700, under TMPDIR), removed on exit; creating and
    removing it are not cut in half by Ctrl-C or SIGTERM."""

    def __init__(self, prefix: str) -> None:
        self.dir = private_dir(prefix)

    def __enter__(self) -> ScratchDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        remove_private_dir(self.dir)


@contextlib.contextmanager
def _locked(directories: Iterable[Path]) -> Iterator[None]:
    """An exclusive lock on each directory (sorted, so two runs cannot deadlock)."""
    fds: list[int] = []
    try:
        if fcntl is not None:
            for d in sorted({_real(p) for p in directories}):
                fd = os.open(d, os.O_RDONLY)
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        for fd in fds:
            os.close(fd)  # closing releases the lock
