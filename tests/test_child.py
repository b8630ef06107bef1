"""`child.run_in_child`: a function run in a fresh child process answers with its result or its
exception; a child that dies (SIGSEGV, as onnxruntime's C++ can) is `ChildCrashed`, never the
end of this process; a time-out or a stop here kills the child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rlx_onnx_amp.child import ChildCrashed, ChildTimeout, child_event, run_in_child, start_in_child


def _segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _exit_with(code: int) -> None:
    os._exit(code)


def _pid_then_wait(pid_file: str, signal_parent: int = 0) -> None:
    """Write this process's id, signal the parent when asked, then wait to be killed."""
    Path(pid_file).write_text(str(os.getpid()))
    if signal_parent:
        os.kill(signal_parent, signal.SIGUSR1)
    while True:
        time.sleep(3600)


def _gone(pid: int) -> bool:
    """Whether `pid` no longer exists (reaped: a zombie would still take signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_result_comes_from_another_process() -> None:
    assert run_in_child(os.getpid) != os.getpid()
    assert run_in_child(divmod, 7, 2) == (3, 1)


def test_the_childs_exception_is_raised_here() -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        run_in_child(int, "not a number")


def test_a_child_killed_by_sigsegv_is_child_crashed() -> None:
    with pytest.raises(ChildCrashed) as crashed:
        run_in_child(_segfault)
    assert (crashed.value.signal_number, crashed.value.exit_code) == (signal.SIGSEGV, -signal.SIGSEGV)
    assert str(crashed.value) == "the child process died of signal 11 (SIGSEGV)"
    assert run_in_child(divmod, 9, 4) == (2, 1)  # and the next child runs as before


def test_a_child_that_exits_without_an_answer_is_child_crashed() -> None:
    with pytest.raises(ChildCrashed) as crashed:
        run_in_child(_exit_with, 3)
    assert (crashed.value.signal_number, crashed.value.exit_code) == (None, 3)


def test_a_time_out_kills_the_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(ChildTimeout):
        run_in_child(_pid_then_wait, str(pid_file), timeout=0.5)  # a small one, on purpose
    # The time-out may come before the child wrote its id: then it never started waiting.
    if pid_file.exists():
        assert _gone(int(pid_file.read_text()))


class _Stopped(Exception):
    pass


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped


def test_a_signal_while_waiting_ends_the_wait_and_kills_the_child(tmp_path: Path) -> None:
    """The child signals this process once it waits (a state, not a delay): the handler's
    exception ends the wait, and the child is gone when it arrives here."""
    pid_file = tmp_path / "pid"
    previous = signal.signal(signal.SIGUSR1, _raise_stopped)
    try:
        with pytest.raises(_Stopped):
            run_in_child(_pid_then_wait, str(pid_file), os.getpid())
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert _gone(int(pid_file.read_text()))



def test_a_temporary_directory_too_long_for_the_fork_servers_socket(tmp_path: Path) -> None:
    # The fork server's socket lives in TMPDIR, and a socket path over 107 bytes is an OSError
    # ("AF_UNIX path too long"): the child is spawned instead, and answers as usual. A fresh
    # process, as this one's fork server may be running already.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    code = "import os; from rlx_onnx_amp.child import run_in_child; print(run_in_child(os.getpid) != os.getpid())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(deep)})
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr


def _after(go: Any, value: int) -> int:
    go.wait()
    return value


def test_a_started_child_runs_beside_this_process_and_waits_for_its_event() -> None:
    """`start_in_child` returns at once; a child held by `child_event` cannot answer before this
    process sets it (the written model's timed runs wait for the judgement so)."""
    go = child_event()
    with start_in_child(_after, go, 7) as pending:
        assert not pending.answered(0.5)
        go.set()
        assert pending.result() == 7
