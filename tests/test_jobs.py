"""`--jobs N`: a batch converted and verified in worker processes gives the reports, order,
output and exit code of `--jobs 1`; Ctrl-C (or SIGTERM) stops every worker (the pool's own
terminate) and leaves no partial output, no staging and no scratch. The signal tests wait for
a state (a line printed, a directory staged, a file written), never for a guessed delay."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY, mlp_external, write_external
from tests.helpers import rlx


def _batch(root: Path) -> list[str]:
    names = []
    for name, build in [*list(HEALTHY.items())[:3], *list(BROKEN_IN_F16.items())[:2]]:
        onnx.save(build().model, str(root / f"{name}.onnx"))
        names.append(f"{name}.onnx")
    (root / "broken.onnx").write_bytes(b"\x08\x07 not a model")
    return [*names[:2], "broken.onnx", *names[2:]]


def _same(text: str, out_dir: str) -> str:
    """The text with its output folder and its seconds (stage lines, the closing table) put aside."""
    return re.sub(r"\d+\.\d( s)?$", "SECONDS", text.replace(f"{out_dir}/", "OUT/"), flags=re.M)


def test_jobs_gives_the_reports_order_and_exit_code_of_one_job(tmp_path: Path) -> None:
    models = _batch(tmp_path)
    runs = {}
    for jobs in (1, 2, 3):
        out = f"out{jobs}"
        (tmp_path / out).mkdir()
        result = rlx(*models, "--policy", "always-f16", "--out-dir", out, "--verify", "--provider", "cpu",
                     "--report-json", f"r{jobs}.json", "--report-md", f"r{jobs}.md", "--jobs", str(jobs),
                     "--latency-runs", "0", cwd=tmp_path)  # timings differ from run to run
        runs[jobs] = (
            result.returncode,
            _same(result.stdout, out),
            _same(result.stderr, out),
            _same(json.dumps({k: v for k, v in json.loads((tmp_path / f"r{jobs}.json").read_text()).items()
                              if k != "run"}), out),  # run: when and how long, by nature per run
            _same((tmp_path / f"r{jobs}.md").read_text(), out),
            sorted(p.name for p in (tmp_path / out).iterdir()),
        )
    assert runs[1][0] == 2  # the unreadable model: the worst exit code of the batch
    assert runs[2] == runs[1] and runs[3] == runs[1]
    report = json.loads((tmp_path / "r2.json").read_text())
    assert [Path(m["model"]).name for m in report["models"]] == [m for m in models if m != "broken.onnx"]
    assert [f["model"] for f in report["failed"]] == ["broken.onnx"]


def test_jobs_zero_is_one_per_cpu_and_negative_is_refused(tmp_path: Path) -> None:
    models = _batch(tmp_path)[:2]
    (tmp_path / "out").mkdir()
    assert rlx(*models, "--out-dir", "out", "--jobs", "0", "-q", cwd=tmp_path).returncode == 0
    refused = rlx(*models, "--out-dir", "out", "--jobs", "-1", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip() == "rlx-amp: error: --jobs must be 0 (one per CPU) or more"


def _left(pids: set[int]) -> list[str]:
    """The /proc stat lines (pid, name, state, parent) of `pids` that still exist, zombies too."""
    left = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            left.append(" ".join(Path(f"/proc/{pid}/stat").read_text().split()[:4]))
    return left


def _children(pid: int) -> set[int]:
    """Every process below `pid` (from /proc)."""
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == parent and int(entry.name) not in found:
                    found.add(int(entry.name))
                    frontier.append(int(entry.name))
    return found


def _wait_for(proc: subprocess.Popen[str], state: Callable[[], bool]) -> bool:
    """Poll until `state()` holds (True) or the run has ended (False): a state, never a delay."""
    while not state():
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_a_worker_waits_for_work_ends_it_quietly(tmp_path: Path, signum: int) -> None:
    """One long model and two tiny ones on three workers: the tiny ones are committed while
    the long one converts, and the two other workers then wait in the pool's queue (one
    reading it, one waiting for its lock). A signal then ends the batch without a traceback
    from a waiting worker (one once raised Terminated inside the pool's own code)."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    out.mkdir()
    long_model = write_external(mlp_external(width=5120), inp / "long.onnx")  # 2 x 100 MiB: seconds
    tiny = []
    for k in range(2):
        path = inp / f"tiny{k}.onnx"
        onnx.save(HEALTHY["conv_net"]().model, str(path))
        tiny.append(path)
    # The long model last in input order: the parent prints each tiny one's table once its
    # worker handed it back (unbuffered), the state in which both workers are idle again.
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlx_onnx_amp", *map(str, tiny), str(long_model), "--policy", "always-f16",
         "--out-dir", str(out), "--verify", "--provider", "cpu", "--jobs", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    printed = ""
    while not all(p.name in printed for p in tiny):
        line = proc.stdout.readline()
        assert line, f"the batch ended before both tiny models were handed back: {proc.wait()}"
        printed += line
    assert proc.poll() is None and not (out / "long.onnx").exists(), "the long model finished first: nothing tested"
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=600)  # a hang guard, not a measure
    assert proc.returncode == (130 if signum == signal.SIGINT else 143), (proc.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    assert not (out / "long.onnx").exists() and not [p.name for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the worker processes")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_every_worker_and_leaves_no_partial_output(tmp_path: Path, signum: int) -> None:
    inp, out, tmp = tmp_path / "in", tmp_path / "out", tmp_path / "tmp"
    for d in (inp, out, tmp):
        d.mkdir()
    models = []
    for k in range(4):  # 2 x 64 MiB of weights each: converting and verifying takes seconds
        path = inp / f"long{k}.onnx"
        write_external(mlp_external(width=4096), path)
        models.append(path)
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlx_onnx_amp", *map(str, models), "--policy", "always-f16", "--out-dir", str(out),
         "--verify", "--provider", "cpu", "--jobs", "2", "--report-json", str(out / "r.json")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    # A state: a model staged in the output directory, so the workers are converting.
    staged = lambda: any(p.name.startswith(".rlx-amp-stage-") for p in out.iterdir())  # noqa: E731
    seen = _wait_for(proc, staged)
    workers = _children(proc.pid)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=600)  # a hang guard, not a measure
    assert seen, f"the batch ended before a model was staged: {proc.returncode} {stderr}"
    assert proc.returncode in (0, 130 if signum == signal.SIGINT else 143), (proc.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    # The pool joined its workers before the parent ended: none is left, not even a zombie.
    assert not _left(workers), f"a worker outlived the batch: {_left(workers)}"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "staging left in the output directory"
    assert [p.name for p in tmp.iterdir() if p.name != ".ses"] == [], "scratch left in TMPDIR"
    if proc.returncode != 0:
        assert stderr.strip().splitlines()[-1].endswith(
            "the models converted before it are written whole, the others not at all; no batch report written"
        ), stderr
        assert not (out / "r.json").exists()  # the batch report is written only when the batch ends
    for model in out.glob("*.onnx"):  # each model a worker committed is whole: it loads and runs
        onnx.checker.check_model(str(model), full_check=True)


class _StuckJob:
    """A batch job inside what stands for a long C call (onnxruntime opening a large model): its
    scratch made, the stop signals blocked (no handler runs), until the test makes a file."""

    def convert_own(self, src: str, dst: str, position: str = "") -> None:
        from rlx_onnx_amp.files import private_dir

        scratch = private_dir("rlx-amp-stuck-")
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        Path(src).write_text(str(scratch))  # the state the test waits for
        while not Path(dst).exists():
            time.sleep(0.002)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _run_stuck_worker(ready: str, go: str) -> None:
    from rlx_onnx_amp import batch

    batch._worker_start()
    batch._worker_convert((0, _StuckJob(), ready, go, ""))  # type: ignore[arg-type]


@pytest.mark.skipif("fork" not in __import__("multiprocessing").get_all_start_methods(), reason="needs fork")
def test_a_worker_inside_a_long_c_call_ends_once_it_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM (the pool's terminate) reaches a worker whose handler cannot run yet: once the
    call returns the worker removes its scratch and ends with 143, so the batch ends."""
    import multiprocessing

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)
    (tmp_path / "tmp").mkdir()
    ready, go = tmp_path / "ready", tmp_path / "go"
    child = multiprocessing.get_context("fork").Process(target=_run_stuck_worker, args=(str(ready), str(go)))
    child.start()
    while not ready.exists() or not ready.read_text():  # a state: the scratch made, the call begun
        assert child.exitcode is None, f"the worker ended first: {child.exitcode}"
        time.sleep(0.002)
    assert Path(ready.read_text()).is_dir()
    child.terminate()
    go.touch()  # the call returns
    child.join(timeout=600)  # a hang guard, not a measure
    assert child.exitcode == 143
    assert list((tmp_path / "tmp").iterdir()) == []


def test_shards_merged_equal_one_batch(tmp_path: Path) -> None:
    """docs/recipes.md's sharded CI recipe, run locally: the batch split into two shards (each its own run and
    JSON report), merged, gives the models, failures and exit code of one run over the whole
    batch; the Markdown summary names every model."""
    models = _batch(tmp_path)
    (tmp_path / "all").mkdir()
    whole = rlx(*models, "--policy", "always-f16", "--out-dir", "all", "--verify", "--provider", "cpu",
                "--report-json", "all.json", "-q", cwd=tmp_path)
    shards = [models[0::2], models[1::2]]
    for k, shard in enumerate(shards):
        (tmp_path / f"s{k}").mkdir()
        args = [*shard, "--policy", "always-f16", "--out-dir", f"s{k}", "--verify", "--provider", "cpu",
                "--report-json", f"shard{k}.json", "-q"]
        rlx(*(args if len(shard) > 1 else [*args[:1], "-o", f"s{k}/{shard[0]}", *args[3:]]), cwd=tmp_path)
    merged = rlx("merge-reports", "shard0.json", "shard1.json", "--report-json", "merged.json", "--report-md",
                 "merged.md", cwd=tmp_path)
    assert merged.returncode == whole.returncode == 2, merged.stderr  # the unreadable model decides
    one = json.loads((tmp_path / "all.json").read_text())
    got = json.loads((tmp_path / "merged.json").read_text())
    assert got["shards"] == ["shard0.json", "shard1.json"] and got["exit_code"] == one["exit_code"]
    name = lambda m: Path(m["model"]).name  # noqa: E731
    assert sorted(map(name, got["models"])) == sorted(map(name, one["models"]))
    assert [f["model"] for f in got["failed"]] == [f["model"] for f in one["failed"]] == ["broken.onnx"]
    by_model = {name(m): m["verify"]["passed"] for m in one["models"]}
    assert {name(m): m["verify"]["passed"] for m in got["models"]} == by_model
    md = (tmp_path / "merged.md").read_text()
    assert md.startswith("# rlx-amp drift report: ❌ failed") and "**ERROR** (exit 2)" in md
    assert all(m in md for m in models)
    printed = rlx("merge-reports", "shard0.json", cwd=tmp_path)  # no --report-md: the summary is printed
    assert printed.stdout.startswith("# rlx-amp drift report") and printed.returncode in (0, 1, 2)
    bad = rlx("merge-reports", "missing.json", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip() == "rlx-amp: error: missing.json: no such file"


class _LostStopJob:
    """A batch job whose conversion lost its SIGTERM: the handler ran (the stop is recorded)
    but its exception vanished, as one raised inside a `__del__` does, and convert_own returned."""

    def convert_own(self, src: str, dst: str, position: str = "") -> None:
        from rlx_onnx_amp.stops import request_stop

        request_stop()


def _run_lost_stop_task(queue: object) -> None:
    from rlx_onnx_amp.batch import _worker_convert

    _worker_convert((0, _LostStopJob(), "in.onnx", "out.onnx", ""))  # type: ignore[arg-type]
    queue.put("returned to the pool")  # type: ignore[attr-defined]


@pytest.mark.skipif("fork" not in __import__("multiprocessing").get_all_start_methods(), reason="needs fork")
def test_a_worker_whose_stop_was_lost_never_takes_another_model() -> None:
    """Once a stop is recorded the worker leaves after its model instead of returning to the
    pool's queue, whose lock the stopping parent holds (a batch once hung there in CI)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()
    child = context.Process(target=_run_lost_stop_task, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 143 and queue.empty()


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, None)])
def test_no_commit_after_a_lost_stop(tmp_path: Path, signum: int, raised: type[BaseException] | None) -> None:
    """A signal whose exception was lost still stops the commit, with that signal's exception."""
    from rlx_onnx_amp.files import OutputSet
    from rlx_onnx_amp.stops import Terminated, request_stop

    final = tmp_path / "out.onnx"
    try:
        with OutputSet() as out:
            out.write_bytes(final, b"model")
            request_stop(signum)
            with pytest.raises(raised or Terminated):
                out.commit()
    finally:
        request_stop(None)
    assert list(tmp_path.iterdir()) == []  # nothing moved, the staging removed


def test_sessions_opened_inside_session_threads_get_that_many_threads(tmp_path: Path) -> None:
    """A batch worker's share of the CPUs reaches every onnxruntime session it opens, and only
    inside the block: the count is the job's (`JobSettings.session_threads`), no module global."""
    from rlx_onnx_amp.verification.compare import Session, session_threads

    path = tmp_path / "m.onnx"
    onnx.save(HEALTHY["conv_net"]().model, str(path))
    threads = lambda: Session(str(path), "cpu", "m").session.get_session_options().intra_op_num_threads  # noqa: E731
    with session_threads(1):
        assert threads() == 1
    assert threads() == 0  # onnxruntime's own choice, as a run in one process has it


def test_a_new_run_forgets_a_signal_an_earlier_run_held_during_its_commit() -> None:
    """stop_handlers starts a run: a SIGTERM that the commit of an earlier run in this process
    held must not make this run say its outputs are complete."""
    from rlx_onnx_amp import stops

    with stops.stop_handlers(), pytest.raises(stops.Terminated), stops.signals_deferred(committing=True):
        signal.raise_signal(signal.SIGTERM)  # held until the commit is done, then raised
    assert stops.signal_held_during_commit()
    with stops.stop_handlers():
        assert not stops.signal_held_during_commit() and not stops.stop_requested()
