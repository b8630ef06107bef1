"""The proof of a written model: onnx's full checker, run in a process of its own for a large
graph (`proof.CheckerRun`), says word for word what it says in this process, and leaves no
process behind; the report a conversion fills after the model is written is the one it filled
before (`rewrite.rewrite_model`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

from rlx_onnx_amp import api, proof
from rlx_onnx_amp.files import OutputSet, RunPaths
from rlx_onnx_amp.policy import policy_from_name
from rlx_onnx_amp.proof import CheckerRun, checker_failure
from rlx_onnx_amp.reports.conversion import ConversionReport
from rlx_onnx_amp.rewrite import ConvertOptions, convert_model, rewrite_model
from tests.helpers import rlx


def _chain(path: Path, blocks: int = 3, broken: str = "") -> Path:
    """x -> (MatMul W_i -> Add b_i -> Relu) * blocks -> y. `broken="types"`: the last Add reads
    an Int64 bias, which the full checker's strict shape inference refuses (its type variable
    binds two types); `broken="op"`: the last Relu is an op no schema has, which its checks
    before the inference refuse."""
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        last = i == blocks - 1
        bias_type = TensorProto.INT64 if broken == "types" and last else TensorProto.FLOAT
        inits += [h.make_tensor(f"W{i}", TensorProto.FLOAT, [4, 4], [0.1 * (k % 5) for k in range(16)]),
                  h.make_tensor(f"b{i}", bias_type, [4], [1, 2, 3, 4])]
        nodes += [h.make_node("MatMul", [x, f"W{i}"], [f"m{i}"], name=f"mm{i}"),
                  h.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  h.make_node("NoSuchOp" if broken == "op" and last else "Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    graph = h.make_graph(nodes, "chain", [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                         [h.make_tensor_value_info(x, TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("broken", ["", "types", "op"])
@pytest.mark.parametrize("separate", ["fifo", "stdout", "no-fork", ""])
def test_the_checker_says_what_it_says_in_this_process(
    tmp_path: Path, broken: str, separate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a process of its own the verdict "passed" is the FIFO's open (onnx opens its output
    only once the inference passed: were it opened before, the inference failure of "types"
    would pass here), or, with no FIFO, the process's "P". The checks before the inference
    ("op" fails them) run in that process's forked copy, or here where it cannot fork."""
    if separate == "stdout":
        monkeypatch.setattr(proof, "_make_fifo", lambda directory: None)
    if separate == "no-fork":
        monkeypatch.setattr(proof, "_OWN_GROUP", False)
    model = _chain(tmp_path / "m.onnx", broken=broken)
    here = checker_failure(model)
    assert (here is None) == (not broken), here
    assert broken != "op" or "NoSuchOp" in (here or "")
    with CheckerRun(bool(separate)) as run:
        assert run.separate == bool(separate)
        process = run._process
        run.check(model)
        assert (run._fifo is not None) == (separate in ("fifo", "no-fork"))
        assert (run._checks is not None) == (separate in ("fifo", "stdout"))
        assert run.result() == here
    # Reaped: stopped once it gave its verdict, or done already (reaped by a thread, it may
    # still be ending); the FIFO and its directory are gone.
    if process is not None:
        _wait_reaped(process)
        assert process.returncode in (0, -signal.SIGKILL)
        if Path("/proc/self/stat").exists():
            _wait_group_gone(process.pid)  # its forked copy too
    assert list(tmp_path.iterdir()) == [model]


@pytest.mark.parametrize(("version", "fifo"), [("1.23.2", True), ("1.14.0", True), ("1.24.0", False),
                                               ("2.0.0", False), ("1.13.1", False), ("main", False)])
def test_the_fifo_serves_only_the_onnx_releases_read(
    tmp_path: Path, version: str, fifo: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proof.onnx, "__version__", version)
    made = proof._make_fifo(tmp_path)
    assert (made is not None) == fifo
    if made is not None:
        proof.remove_private_dir(made.parent)
    assert list(tmp_path.iterdir()) == []


def _wait_reaped(process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until CheckerRun has reaped `process` (it leaves `proof._RUNNING` once waited for)."""
    deadline = time.monotonic() + timeout
    while process in proof._RUNNING and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process not in proof._RUNNING and process.returncode is not None


def test_close_stops_a_checker_still_running_and_reaps_it(tmp_path: Path) -> None:
    model = _chain(tmp_path / "m.onnx", blocks=2000)
    run = CheckerRun(True)
    process = run._process
    assert process is not None
    run.check(model)
    run.close()
    assert process.returncode is not None  # reaped: killed, or done already
    assert not run.separate


def _group_members(pgid: int, zombies: bool = False) -> list[int]:
    """The processes of process group `pgid` (from /proc), zombies left out unless `zombies`."""
    return _live_processes(_STAT_PGRP, pgid, zombies)


def _wait_group_gone(pgid: int, timeout: float = 10) -> None:
    """Until no process of group `pgid` is left, zombies included: a zombie whose parent died
    waits for an init that may never reap it (a container's first process often does not)."""
    deadline = time.monotonic() + timeout
    while _group_members(pgid, zombies=True) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _group_members(pgid, zombies=True) == []


def _replace_checks(monkeypatch: pytest.MonkeyPatch, code: Callable[[str], str]) -> None:
    """The checker's process with its forked copy running `code(the checks' call)` instead."""
    checks = "onnx.checker.check_model(path, full_check=False)"
    assert checks in proof._INFERENCE_PROCESS
    monkeypatch.setattr(proof, "_INFERENCE_PROCESS", proof._INFERENCE_PROCESS.replace(checks, code(checks)))


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or not proof._OWN_GROUP, reason="needs /proc and os.fork")
def test_close_stops_the_forked_checks_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks run in a copy the checker's process forks: close leaves neither running
    (they lead a process group of their own, killed as one), and it runs at a lower priority.
    Here the checks never end."""
    _replace_checks(monkeypatch, lambda checks: "signal.pause()")
    model = _chain(tmp_path / "m.onnx")
    run = CheckerRun(True)
    process = run._process
    assert process is not None
    try:
        run.check(model)
        deadline = time.monotonic() + 60
        while len(_group_members(process.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.002)
        assert _group_members(process.pid), "the checker's process did not fork its checks"
        while run._copy is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert run._copy is not None, "the copy did not say its process id"
        # The checks yield to the inference: the copy runs 5 nice levels below its process.
        assert os.getpriority(os.PRIO_PROCESS, run._copy) == os.getpriority(os.PRIO_PROCESS, process.pid) + 5
        run.close()
        _wait_group_gone(process.pid)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or not proof._OWN_GROUP, reason="needs /proc and os.fork")
def test_stop_checkers_reaps_every_checker_before_the_process_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a process about to end with os._exit runs (a watchdog's end, a stopped batch
    worker): each checker's process and its copy stopped and reaped when it returns, with
    their run not closed, so none is left, dying, to an init that may never reap it."""
    _replace_checks(monkeypatch, lambda checks: "signal.pause()")
    model = _chain(tmp_path / "m.onnx")
    runs = [CheckerRun(True), CheckerRun(True)]
    processes = [run._process for run in runs]
    assert None not in processes
    try:
        for run in runs:
            run.check(model)
        deadline = time.monotonic() + 60
        while any(run._copy is None for run in runs) and time.monotonic() < deadline:
            time.sleep(0.002)
        assert all(run._copy is not None for run in runs), "a copy did not say its process id"
        proof.stop_checkers()
        for process in processes:
            assert process is not None
            assert process.returncode is not None and process not in proof._RUNNING  # reaped
            assert _group_members(process.pid, zombies=True) == []  # the copy too, at once
    finally:
        for run in runs:
            run.close()


@pytest.mark.skipif(not proof._OWN_GROUP, reason="needs os.fork")
def test_a_checker_reaped_beside_the_run_is_reaped_before_the_command_ends(tmp_path: Path) -> None:
    """After its verdict a checker's process is reaped by a daemon thread (its end waits for its
    memory to be unmapped); the command ends with os._exit, which waits for no thread: the
    atexit handlers reap it first, or it would be left, dying, to an init that may never reap
    it. Here the reaper thread never gets to it; a handler registered before proof's runs
    after it and says whether the process was reaped."""
    model = _chain(tmp_path / "m.onnx")
    script = f"""
import atexit, os, sys, threading
seen = {{}}
atexit.register(lambda: print("reaped" if seen["process"].returncode is not None else "not reaped", flush=True))
from rlx_onnx_amp import proof
from rlx_onnx_amp.__main__ import _exit_now
proof._reap = lambda process: threading.Event().wait()  # a reaper thread that never reaps
run = proof.CheckerRun(True)
seen["process"] = run._process
run.check({str(model)!r})
assert run.result() is None and run._verdict, "the checker's process gave no verdict"
assert seen["process"].returncode is None and seen["process"] in proof._RUNNING
_exit_now(0)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "reaped"


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or not proof._OWN_GROUP, reason="needs /proc and os.fork")
@pytest.mark.parametrize("stop", ["stop_checkers", "close"])
def test_a_copy_not_named_yet_is_stopped_before_its_checker(tmp_path: Path, stop: str) -> None:
    """A checker stopped before `check` (a watchdog's end while the model converts): its
    copy has forked but its number is not read yet. It is killed and reaped while its parent
    still runs, so it cannot end an orphan, a zombie for an init that may never reap it."""
    run = CheckerRun(True)
    process = run._process
    assert process is not None
    try:
        deadline = time.monotonic() + 60
        while not _live_processes(_STAT_PPID, process.pid) and time.monotonic() < deadline:
            time.sleep(0.002)
        (copy,) = _live_processes(_STAT_PPID, process.pid)
        assert run._copy is None  # the case under test: nothing has read its number
        killed: list[int] = []
        real_kill = proof._kill

        def kill_after_the_copy(p: subprocess.Popen[bytes]) -> None:
            # the moment the group is killed: its copy must be gone already, its parent not
            killed.append(p.pid)
            assert _live_processes(_STAT_PPID, p.pid, zombies=True) == []
            assert not Path(f"/proc/{copy}").exists()
            assert Path(f"/proc/{p.pid}").exists()
            real_kill(p)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(proof, "_kill", kill_after_the_copy)
            proof.stop_checkers() if stop == "stop_checkers" else run.close()
        assert killed == [process.pid]
        _wait_reaped(process)
        assert _group_members(process.pid, zombies=True) == []
    finally:
        run.close()
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or not proof._OWN_GROUP, reason="needs /proc and os.fork")
def test_checks_that_outlast_the_inference_leave_no_zombie(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker's process waits for its forked copy before it ends: were it to end first,
    the copy would end as an orphan, a zombie until an init reaps it (a container's first
    process may never). Here the checks take a second longer than the inference."""
    _replace_checks(monkeypatch, lambda checks: f"(__import__('time').sleep(1.0), {checks})")
    model = _chain(tmp_path / "m.onnx", broken="types")
    with CheckerRun(True) as run:
        process = run._process
        assert process is not None
        run.check(model)
        deadline = time.monotonic() + 30
        while run._copy is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert run._copy is not None, "the copy did not say its process id"
        time.sleep(0.5)  # the inference has failed by now; the copy sleeps on
        assert process.poll() is None, "the checker's process ended before its copy"
        assert _live_processes(_STAT_PPID, process.pid) == [run._copy]
        assert run.result() == checker_failure(model)
    _wait_reaped(process)
    assert _group_members(process.pid, zombies=True) == []


def _wait_in_fifo_open(thread: threading.Thread, limit_s: float = 10.0) -> None:
    """Return once `thread` sleeps in a FIFO's open, as its /proc entry's wait channel says."""
    wchan = Path(f"/proc/self/task/{thread.native_id}/wchan")
    if not wchan.exists():
        pytest.skip("no /proc/self/task/*/wchan here: where a thread waits cannot be seen")
    deadline = time.monotonic() + limit_s
    while (seen := wchan.read_text().strip()) != "wait_for_partner":
        assert thread.is_alive(), "the thread ended before it waited in the FIFO's open"
        if time.monotonic() > deadline:
            # A kernel that hides wait channels reads "0" for a sleeping thread too.
            if seen in ("", "0"):
                pytest.skip("this kernel does not name wait channels (/proc/*/wchan reads 0)")
            raise AssertionError(f"the thread never waited in the FIFO's open (it waits in {seen})")
        time.sleep(0.001)


def test_close_returns_when_the_fifo_went_with_its_directory(tmp_path: Path) -> None:
    """A FIFO removed under the run (its directory deleted) cannot be opened to end the wait
    in its open: close gives up after a bounded time instead of hanging."""
    import shutil

    run = CheckerRun(True)
    assert run._process is not None and run._process.stdout is not None
    # As check() sets it up, but with no path sent: the process waits on its stdin and never
    # opens the FIFO, whose thread waits in its open.
    run._path = _chain(tmp_path / "m.onnx")
    run._fifo = fifo = proof._make_fifo(tmp_path)
    assert fifo is not None
    run._listen(proof._read_said, run._process.stdout)
    run._listen(proof._wait_opened, fifo)
    # The directory goes only once the thread waits in the FIFO's open: removed before, the
    # open fails at once and the thread ends, which is not the case this test is about.
    _wait_in_fifo_open(run._threads[1])
    shutil.rmtree(fifo.parent)
    started = time.monotonic()
    run.close()
    assert time.monotonic() - started < proof._RELEASE_S + 5
    assert not run.separate and run._threads[1].is_alive()  # left waiting, a daemon


def test_a_checker_that_ends_without_a_verdict_is_run_here(tmp_path: Path) -> None:
    model = _chain(tmp_path / "m.onnx", broken="types")
    run = CheckerRun(True)
    assert run._process is not None
    run._process.kill()  # as a crash of onnx's checker would end it
    run._process.wait()
    run.check(model)
    assert run.result() == checker_failure(model) is not None
    run.close()


def test_a_large_graph_is_proved_by_the_separate_checker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stage_conversion gives the written file to a CheckerRun started before the conversion;
    the model it proves is byte-identical to the in-process one."""
    model = _chain(tmp_path / "m.onnx")
    started: list[bool] = []
    sizes: list[int] = []
    real = proof.CheckerRun

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, separate: bool, model_bytes: int = 0) -> None:
            started.append(separate)
            sizes.append(model_bytes)
            super().__init__(separate, model_bytes)

    monkeypatch.setattr(api, "CheckerRun", Recorded)
    outputs: dict[int, bytes] = {}
    for limit in (1, 10**9):
        monkeypatch.setattr(api, "SEPARATE_CHECK_NODES", limit)
        out = tmp_path / f"out_{limit}.onnx"
        with OutputSet() as staging:
            staged = api.stage_conversion(model, out, staging, RunPaths(), "always-f16")
            assert staged.report.proof == "onnx.checker"
            outputs[limit] = staged.path.read_bytes()
    assert started == [True, False]
    assert sizes == [model.stat().st_size] * 2  # what sizes the separate checker's heap
    assert outputs[1] == outputs[10**9]


def _vm_kib(pid: int, field: str) -> int:
    """A field of /proc/PID/status in KiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


def _glibc() -> bool:
    import ctypes

    try:
        return bool(ctypes.CDLL(None).mallopt)
    except (OSError, AttributeError):
        return False


@pytest.mark.skipif(not Path("/proc/self/status").exists() or not _glibc(), reason="needs /proc and glibc's mallopt")
def test_the_checker_faults_in_its_heap_while_it_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a budget, the checker's process maps that much heap while the model is converted
    (its parse and inference then take memory already mapped); its verdicts stay its own."""
    budget = 256 << 20
    monkeypatch.setattr(proof, "_heap_budget", lambda model_bytes: budget)
    for broken in ("", "types", "op"):
        model = _chain(tmp_path / f"m{broken}.onnx", broken=broken)
        with CheckerRun(True, 1) as run:
            process = run._process
            assert process is not None
            deadline = time.monotonic() + 60
            while _vm_kib(process.pid, "VmRSS") * 1024 < budget and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _vm_kib(process.pid, "VmRSS") * 1024 >= budget, "the heap was not faulted in"
            run.check(model)
            assert run.result() == checker_failure(model)


def _peak_kib_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int) -> int:
    """VmHWM of a checker's process given its path at once, with `budget` and its inference
    replaced by a wait (so that the process is there to be measured), half a second after its
    copy was forked (after its imports)."""
    monkeypatch.setattr(proof, "_heap_budget", lambda model_bytes: budget)
    run = CheckerRun(True, 1)
    process = run._process
    assert process is not None
    try:
        run.check(_chain(tmp_path / f"m{budget}.onnx"))
        deadline = time.monotonic() + 60
        while run._copy is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert run._copy is not None
        time.sleep(0.5)  # were it faulting in, 2 GiB would be well under way
        return _vm_kib(process.pid, "VmHWM")
    finally:
        run.close()


@pytest.mark.skipif(not Path("/proc/self/status").exists() or not _glibc(), reason="needs /proc and glibc's mallopt")
def test_a_path_that_comes_first_stops_the_faulting_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The faulting-in stops as soon as the path comes: here it came before it started (the
    process was still importing onnx), so a budget of 2 GiB maps less than 64 MiB more than
    no budget does."""
    inference = "onnx.shape_inference.infer_shapes_path("
    assert inference in proof._INFERENCE_PROCESS
    monkeypatch.setattr(proof, "_INFERENCE_PROCESS",
                        proof._INFERENCE_PROCESS.replace(inference, "(lambda *a, **k: signal.pause())("))
    without = _peak_kib_waiting(tmp_path, monkeypatch, 0)
    assert _peak_kib_waiting(tmp_path, monkeypatch, 2 << 30) < without + (64 << 10)


def test_the_heap_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the checker's process takes per byte of the model, bounded by the memory available
    and 8 GiB; none for a small model, on one CPU, or off Linux."""
    if not sys.platform.startswith("linux") or not Path("/proc/meminfo").exists():
        assert proof._heap_budget(10**9) == 0
        return
    monkeypatch.setattr(proof.os, "sched_getaffinity", lambda pid: {0, 1})
    available = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemAvailable:"))
    size = 20_000_000
    assert proof._heap_budget(size) == min(size * proof.HEAP_PER_MODEL_BYTE, available // 4)
    assert proof._heap_budget(10**12) == min(8 << 30, available // 4)
    assert proof._heap_budget(100_000) == 0  # under one block of 16 MiB
    monkeypatch.setattr(proof.os, "sched_getaffinity", lambda pid: {0})
    assert proof._heap_budget(size) == 0  # one CPU: it would take it from the conversion


def test_the_cli_refuses_nothing_it_accepted_with_the_separate_checker(tmp_path: Path) -> None:
    """A 20,000-node graph (the limit) through the CLI: proved, written, exit 0."""
    model = _chain(tmp_path / "big.onnx", blocks=proof.SEPARATE_CHECK_NODES // 3 + 1)
    result = rlx(model, "--policy", "auto-mixed", "-o", tmp_path / "out.onnx", "--no-verify",
                 "--report-json", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    assert '"proof": "onnx.checker"' in (tmp_path / "r.json").read_text()
    assert checker_failure(tmp_path / "out.onnx") is None


@pytest.mark.parametrize("policy", ["always-f16", "auto-mixed"])
def test_the_report_filled_after_the_model_is_written_is_the_same(tmp_path: Path, policy: str) -> None:
    model = onnx.load(_chain(tmp_path / "m.onnx"))
    once, twice = onnx.ModelProto(), onnx.ModelProto()
    once.CopyFrom(model)
    twice.CopyFrom(model)
    report = convert_model(once, policy_from_name(policy), ConvertOptions())
    later = ConversionReport()
    with rewrite_model(twice, policy_from_name(policy), ConvertOptions(), report=later) as rewritten:
        assert later.decisions == {}  # nothing filled before finish
        saved = twice.SerializeToString()
        assert rewritten.finish() is later
    assert saved == once.SerializeToString()
    assert later.decisions == report.decisions and later.rules == report.rules
    assert (later.casts_inserted, later.changed, later.by_op) == (report.casts_inserted, report.changed, report.by_op)


#: Fields of /proc/PID/stat after the command's closing parenthesis: state 0, parent 1, group 3.
_STAT_PPID, _STAT_PGRP = 1, 3


def _live_processes(field: int, value: int, zombies: bool = False) -> list[int]:
    """The processes (zombies left out unless `zombies`) whose /proc/PID/stat `field` is `value`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[field]) == value and (zombies or fields[0] != "Z"):
            found.append(int(stat.parent.name))
    return found


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    return _live_processes(_STAT_PPID, pid)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_run_leaves_no_checker_process(tmp_path: Path, signum: int) -> None:
    """SIGTERM or SIGINT while the checker's process runs: rlx-amp exits 143 or 130, writes
    nothing, and its checker's process is gone."""
    model = _chain(tmp_path / "big.onnx", blocks=proof.SEPARATE_CHECK_NODES // 3 + 1)
    out = tmp_path / "out" / "o.onnx"
    out.parent.mkdir()
    run = subprocess.Popen([sys.executable, "-m", "rlx_onnx_amp", str(model), "--policy", "always-f16", "-o", str(out),
                            "--no-verify", "-q"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    checker: list[int] = []
    while not checker and run.poll() is None and time.monotonic() < deadline:
        checker = _children(run.pid)
        time.sleep(0.005)
    assert checker, "rlx-amp ended (or ran a minute) without starting a checker process"
    run.send_signal(signum)
    _, stderr = run.communicate(timeout=120)
    # The checker's process lives until its verdict, before the commit: the signal came first.
    assert run.returncode == (143 if signum == signal.SIGTERM else 130), stderr
    assert "Traceback" not in stderr and "nothing written" in stderr, stderr
    assert not list(out.parent.iterdir())
    with pytest.raises(ProcessLookupError):  # gone and reaped (a zombie would still take signal 0)
        os.kill(checker[0], 0)


def test_the_collector_runs_again_after_a_conversion_however_it_ends(tmp_path: Path) -> None:
    """stage_conversion pauses the garbage collector (a collection would walk the live plan)
    and restores it, after a refused input as after a written model."""
    import gc

    model = _chain(tmp_path / "m.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert gc.isenabled()
    with OutputSet() as staging:
        api.stage_conversion(model, tmp_path / "o.onnx", staging, RunPaths(), "always-f16")
    assert gc.isenabled()
    with OutputSet() as staging, pytest.raises(api.InputError, match="not a valid ONNX model"):
        api.stage_conversion(bad, tmp_path / "o2.onnx", staging, RunPaths(), "always-f16")
    assert gc.isenabled()


def test_the_separate_checker_agrees_on_what_the_fuzzer_breaks(tmp_path: Path) -> None:
    """Of the fuzzer's mutants (seed 7) the full checker refuses, the first 8 its checks pass
    (the inference in CheckerRun's process refuses them) and the first 8 its checks refuse:
    the same first line from CheckerRun (bench/checker_split.py compares 1,500 in one process)."""
    from tools.fuzz_mutants import make_mutant, write_mutant

    compared = {True: 0, False: 0}  # by whether the checks before the inference pass
    for index in range(400):
        path = write_mutant(make_mutant(7, index), tmp_path / str(index))
        here = checker_failure(path)
        if here is None:
            continue
        try:
            onnx.checker.check_model(str(path), full_check=False)
            checks_pass = True
        except Exception:
            checks_pass = False
        if compared[checks_pass] == 8:
            continue
        with CheckerRun(True) as run:
            run.check(path)
            assert run.result() == here, index
        compared[checks_pass] += 1
        if min(compared.values()) == 8:
            break
    assert compared == {True: 8, False: 8}
