"""Time rlx-amp against a floor and two peer float16 converters, each in its own subprocess.

Two modes:

    # weights: a model with external data (e.g. bench/export_llama.py's output)
    python bench/scale.py --model /work/bench_data/llama/llama.onnx

    # graph size: synthetic graphs of N nodes, rlx-amp --policy auto-mixed on each
    python bench/scale.py --nodes 10000,50000,200000

Contenders (--contenders, comma separated):
  floor  reads every float tensor of the external data once (np.fromfile per tensor) and
         writes its float16 copy once (ndarray.tofile) to a new file; no graph work
  rlx    `rlx-amp MODEL --policy P -o OUT -q` (always-f16 for --model, auto-mixed for --nodes)
  occ    onnxconverter_common.float16.convert_float_to_float16_model_path(MODEL, keep_io_types=True)
         then onnx.save(..., save_as_external_data=True) when the input has external data
  ort    onnxruntime.transformers.float16.convert_float_to_float16(MODEL path, keep_io_types=True)
         then onnx.save likewise

Measurement: each contender runs as
    /usr/bin/time -v -o TIMEFILE prlimit --as=MEM -- timeout -s KILL T  CMD...
Wall time is taken around that subprocess (perf_counter); peak RSS is /usr/bin/time's
"Maximum resident set size" (the largest single process of the tree, from wait4 rusage).
The process tree is also sampled from /proc every 0.1 s (`TreeSampler`): the peak RSS of CMD's
own process (main), of the largest of its descendants (child: the verification's run of the
written model in a process of its own, the fork server), and of their sum at one instant
(tree; pages two processes share, a mapped data file, count twice there).
A contender that exceeds the address-space limit, crashes or times out is recorded with that
status, not retried.

Page cache: the cache cannot be dropped here (no permission on /proc/sys/vm/drop_caches), so
every contender gets the same warm-up instead: previous outputs are deleted, `sync` runs, then
the input model and its data file are read once (cat > /dev/null) so each contender starts with
the input in the page cache. Output writes land in the page cache; the `sync` that follows each
contender is timed separately (sync_s) and not included in wall_s.

Baseline (--baseline-rev REV, --repeat K): adds the contender rlx@REV, the same rlx-amp command
run with the code of git revision REV (`git worktree add` into a temporary directory, removed
afterwards). Both rlx and rlx@REV then run as `python3 -m rlx_onnx_amp` with PYTHONPATH set to their
checkout, from a directory outside the repo (the module each imports is printed at start-up), K
times each, alternating, and report their median wall. A line per graph size gives the ratio
rlx / rlx@REV. This is how a refactor is shown to be no slower:

    python3 bench/scale.py --nodes 200000 --contenders rlx --baseline-rev a27eb95 --repeat 3

Policies (--policies, comma separated; --model mode): the rlx contender once per entry, in one
session, each row named `rlx POLICY` (`rlx POLICY --no-verify`). An entry is POLICY, the plain
command (it screens and verifies; `auto` searches, verifying each candidate), or
POLICY:no-verify, the conversion alone. Without --policies, rlx runs `--policy P --no-verify`.
The plain command's report goes to a JSON file (--report-json), and the row gives its verdict
and, for a search, its evaluations:

    python3 bench/scale.py --model bench/data/llama/llama.onnx --contenders rlx \
        --policies always-f16:no-verify,always-f16,auto

With --nodes the peers (occ, ort) join the rounds too, K times each, and a line per graph size
and peer gives rlx / peer of the medians: the converter against onnxruntime's, side by side in
one run. With --model the peers run once (they take minutes on a large model's weights).

    python3 bench/scale.py --nodes 200000 --contenders rlx,ort --peers-max-nodes 200000 --repeat 5

JSON goes to bench/out/ (gitignored).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from baseline import worktree  # bench/ is on sys.path: the scripts run as bench/NAME.py

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT_JSON_DIR = HERE / "out"
DEFAULT_WORK = Path("/work/bench_data")


# ---------------------------------------------------------------------------------------------
# workers (run in the child process)
# ---------------------------------------------------------------------------------------------
def _has_external(model) -> bool:
    import onnx

    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def worker_floor(inp: str, out: str) -> None:
    import numpy as np
    import onnx

    src = Path(inp)
    model = onnx.load(str(src), load_external_data=False)
    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                tensors.append(a.t)
    n = nbytes_in = nbytes_out = 0
    with open(out + ".data", "wb") as f:
        for t in tensors:
            if t.data_location != onnx.TensorProto.EXTERNAL or t.data_type != onnx.TensorProto.FLOAT:
                continue
            info = {e.key: e.value for e in t.external_data}
            count = 1
            for d in t.dims:
                count *= d
            a = np.fromfile(src.parent / info["location"], dtype=np.float32, count=count, offset=int(info.get("offset", 0)))
            h = a.astype(np.float16)
            h.tofile(f)
            n += 1
            nbytes_in += a.nbytes
            nbytes_out += h.nbytes
    print(json.dumps({"tensors": n, "bytes_in": nbytes_in, "bytes_out": nbytes_out}))


def _save(model, inp: str, out: str) -> None:
    import onnx

    src = onnx.load(inp, load_external_data=False)
    if _has_external(src) or model.ByteSize() > 1_800_000_000:
        onnx.save(model, out, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=Path(out).name + ".data", size_threshold=1024)
    else:
        onnx.save(model, out)


def worker_occ(inp: str, out: str) -> None:
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16_model_path(inp, keep_io_types=True)
    _save(model, inp, out)


def worker_ort(inp: str, out: str) -> None:
    from onnxruntime.transformers import float16

    model = float16.convert_float_to_float16(inp, keep_io_types=True)
    _save(model, inp, out)


WORKERS = {"floor": worker_floor, "occ": worker_occ, "ort": worker_ort}


# ---------------------------------------------------------------------------------------------
# synthetic graphs
# ---------------------------------------------------------------------------------------------
BLOCK_OPS = ["Constant", "Reshape", "MatMul", "Add", "Relu", "LayerNormalization", "Softmax", "Constant", "Mul", "Add"]


def build_chain(n_nodes: int, path: Path, width: int = 8) -> dict:
    """A chain of blocks of 10 nodes on [1, width] tensors:
    Constant(shape) -> Reshape -> MatMul(W_i) -> Add(b_i) -> Relu -> LayerNormalization ->
    Softmax -> Mul(Constant scalar) -> Add(residual). Each block has its own W_i and b_i."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = max(1, n_nodes // len(BLOCK_OPS))
    nodes, inits = [], []
    gamma = numpy_helper.from_array(np.ones(width, np.float32), "gamma")
    beta = numpy_helper.from_array(np.zeros(width, np.float32), "beta")
    inits += [gamma, beta]
    shape = numpy_helper.from_array(np.array([1, width], np.int64), "shape_value")
    x = "x"
    for i in range(blocks):
        p = f"b{i}_"
        w = numpy_helper.from_array((rng.standard_normal((width, width)) * 0.1).astype(np.float32), p + "W")
        b = numpy_helper.from_array((rng.standard_normal(width) * 0.1).astype(np.float32), p + "bias")
        inits += [w, b]
        nodes += [
            helper.make_node("Constant", [], [p + "shape"], name=p + "shape_const", value=shape),
            helper.make_node("Reshape", [x, p + "shape"], [p + "r"], name=p + "reshape"),
            helper.make_node("MatMul", [p + "r", p + "W"], [p + "mm"], name=p + "matmul"),
            helper.make_node("Add", [p + "mm", p + "bias"], [p + "add"], name=p + "add"),
            helper.make_node("Relu", [p + "add"], [p + "relu"], name=p + "relu"),
            helper.make_node("LayerNormalization", [p + "relu", "gamma", "beta"], [p + "ln"], name=p + "ln", axis=-1, epsilon=1e-5),
            helper.make_node("Softmax", [p + "ln"], [p + "sm"], name=p + "softmax", axis=-1),
            helper.make_node("Constant", [], [p + "scale"], name=p + "scale_const", value_float=0.5),
            helper.make_node("Mul", [p + "sm", p + "scale"], [p + "mul"], name=p + "mul"),
            helper.make_node("Add", [p + "mul", x], [p + "out"], name=p + "residual"),
        ]
        x = p + "out"
    graph = helper.make_graph(
        nodes, f"chain_{n_nodes}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="rlx-bench")
    model.ir_version = 8
    onnx.save(model, str(path))
    return {"nodes": len(nodes), "initializers": len(inits), "bytes": path.stat().st_size}


# ---------------------------------------------------------------------------------------------
# runner
# ---------------------------------------------------------------------------------------------
def _parse_time_v(text: str) -> dict:
    out: dict = {}
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    out["peak_rss_mb"] = int(m.group(1)) / 1024 if m else None
    u = re.search(r"User time \(seconds\): ([\d.]+)", text)
    s = re.search(r"System time \(seconds\): ([\d.]+)", text)
    out["cpu_s"] = float(u.group(1)) + float(s.group(1)) if u and s else None
    m = re.search(r"Exit status: (\d+)", text)
    out["exit"] = int(m.group(1)) if m else None
    m = re.search(r"Command terminated by signal (\d+)", text)
    out["signal"] = int(m.group(1)) if m else None
    return out


def _warm(paths: list[Path]) -> float:
    subprocess.run(["sync"], check=False)
    t0 = time.perf_counter()
    for p in paths:
        if p.exists():
            subprocess.run(["cat", str(p)], stdout=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def _data_files(out: Path) -> list[Path]:
    """The data files beside `out` that belong to it: the peers' OUT.data, rlx-amp's
    content-named OUT.<hash>.data."""
    return [p for p in (out.with_name(out.name + ".data"), *out.parent.glob(glob.escape(out.name) + ".*.data")) if p.exists()]


def _outputs(out: Path) -> list[Path]:
    return [out, *_data_files(out)]


def _summarize_output(out: Path) -> dict:
    """Sizes and element types of what a contender wrote (graph proto only, no weights)."""
    import onnx

    info: dict = {"model_mb": None, "data_mb": None}
    data = _data_files(out)
    if data:
        info["data_mb"] = round(sum(p.stat().st_size for p in data) / 1e6, 1)
    if not out.exists():
        return info
    info["model_mb"] = round(out.stat().st_size / 1e6, 2)
    try:
        m = onnx.load(str(out), load_external_data=False)
    except Exception as e:
        info["load_error"] = str(e)[:200]
        return info
    by_type: dict[str, int] = {}
    for t in m.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        name = onnx.TensorProto.DataType.Name(t.data_type)
        by_type[name] = by_type.get(name, 0) + n
    info["init_elems_by_type"] = by_type
    info["nodes"] = len(m.graph.node)
    info["casts"] = sum(1 for n in m.graph.node if n.op_type == "Cast")
    return info


def run_one(name: str, cmd: list[str], out: Path, warm_paths: list[Path], mem_gb: float, timeout: int, log_dir: Path,
            env: dict[str, str] | None = None, cwd: Path | None = None) -> dict:
    for p in _outputs(out):
        p.unlink(missing_ok=True)
    warm_s = _warm(warm_paths)
    time_file = log_dir / f"{name}.time"
    full = ["/usr/bin/time", "-v", "-o", str(time_file),
            "prlimit", f"--as={int(mem_gb * (1 << 30))}", "--",
            "timeout", "-s", "KILL", str(timeout), *cmd]
    print(f"  [{name}] {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    with subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd) as popen, \
            TreeSampler(popen.pid) as tree:
        stdout, stderr = popen.communicate()
    proc = subprocess.CompletedProcess(full, popen.returncode, stdout, stderr)
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    subprocess.run(["sync"], check=False)
    sync_s = time.perf_counter() - t1
    tv = _parse_time_v(time_file.read_text() if time_file.exists() else "")
    (log_dir / f"{name}.stdout").write_text(proc.stdout)
    (log_dir / f"{name}.stderr").write_text(proc.stderr)
    status = "ok"
    if proc.returncode != 0:
        err = proc.stderr
        if tv.get("signal") == 9 or proc.returncode in (137, -9):
            status = "killed (timeout or OOM)" if wall < timeout - 1 else f"timeout {timeout}s"
        elif "MemoryError" in err or "std::bad_alloc" in err or "Cannot allocate memory" in err:
            status = f"out of memory under {mem_gb:g} GiB address-space limit"
        else:
            last = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or [f"exit {proc.returncode}"]
            status = f"failed (exit {proc.returncode}): {last[0][:160]}"
    res = {"name": name, "cmd": cmd, "status": status, "wall_s": round(wall, 2), "sync_s": round(sync_s, 2),
           "warm_s": round(warm_s, 2), "peak_rss_mb": tv.get("peak_rss_mb"), "cpu_s": tv.get("cpu_s"),
           "returncode": proc.returncode, **tree.peaks()}
    if status == "ok":
        res["output"] = _summarize_output(out)
        if proc.stdout.strip().startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                res["worker"] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  [{name}] {status}: wall {wall:.1f}s, peak RSS {tv.get('peak_rss_mb') or 0:.0f} MB "
          f"(sampled: main {res['main_peak_rss_mb'] or 0:.0f}, child {res['child_peak_rss_mb'] or 0:.0f}, "
          f"tree {res['tree_peak_rss_mb'] or 0:.0f}), sync {sync_s:.1f}s", flush=True)
    return res


#: The processes between /usr/bin/time and the contender's command (`run_one`).
_WRAPPERS = frozenset({"time", "prlimit", "timeout"})


class TreeSampler:
    """Samples the resident set of a process tree from /proc every `interval` seconds, in a
    thread, while the `with` block runs: the peak of the contender's own process (the first one
    below the wrappers of `run_one`), of its largest descendant, and of the sum of both kinds at
    one instant. A process that lives less than `interval` may be missed."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        import threading

        self.root, self.interval = root, interval
        self.main = self.child = self.tree = 0  # bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peaks(self) -> dict:
        return {f"{kind}_peak_rss_mb": round(v / (1 << 20), 1) if v else None
                for kind, v in (("main", self.main), ("child", self.child), ("tree", self.tree))}

    def _loop(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            parents: dict[int, list[int]] = {}
            names: dict[int, str] = {}
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = Path(entry.path, "stat").read_text()
                    name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
                    parents.setdefault(int(rest[1]), []).append(int(entry.name))
                    names[int(entry.name)] = name
            pid = self.root
            while names.get(pid) in _WRAPPERS and len(parents.get(pid, [])) == 1:
                pid = parents[pid][0]
            if names.get(pid) not in _WRAPPERS and pid in names:
                below, stack = [], list(parents.get(pid, []))
                while stack:
                    p = stack.pop()
                    below.append(p)
                    stack.extend(parents.get(p, []))
                main = self._rss(pid, page)
                rest = [self._rss(p, page) for p in below]
                self.main = max(self.main, main)
                self.child = max(self.child, *rest, 0)
                self.tree = max(self.tree, main + sum(rest))
            self._stop.wait(self.interval)

    @staticmethod
    def _rss(pid: int, page: int) -> int:
        try:
            return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            return 0


def _cmd(name: str, model: Path, out: Path, policy: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", name, str(model), str(out)]


class Tree(NamedTuple):
    """How one rlx contender starts: `label` is its contender name (rlx, rlx@REV), `base` the command
    before the model path; env and cwd None: this process's. `module`: the rlx_onnx_amp/__init__.py
    that env and cwd import (checked at start-up), when known."""

    label: str
    base: list[str]
    env: dict[str, str] | None = None
    cwd: Path | None = None
    module: str | None = None


def _installed_tree() -> Tree:
    """The `rlx-amp` script installed beside this interpreter, as the peers run on it (a PATH
    lookup may find a version manager's shim instead: pyenv's runs bash scripts first, about
    0.05 s, which the peers, started as sys.executable, do not pay), its package byte-compiled."""
    script = Path(sys.executable).with_name("rlx-amp")
    _byte_compile()
    return Tree("rlx", [str(script)] if script.is_file() else [sys.executable, "-m", "rlx_onnx_amp"])


def _byte_compile(env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """Byte-compile the rlx_onnx_amp that `env` and `cwd` import, before the timed runs: a fresh
    worktree has no __pycache__, and an editable install's modules edited since their last .pyc
    (where nothing writes one: PYTHONDONTWRITEBYTECODE=1) would be compiled again in every run."""
    subprocess.run([sys.executable, "-c", "import compileall, os, rlx_onnx_amp; "
                    "compileall.compile_dir(os.path.dirname(rlx_onnx_amp.__file__), quiet=1)"],
                   env=env, cwd=cwd, capture_output=True, check=False)


def _tree_at(label: str, root: Path, cwd: Path) -> Tree:
    """`python3 -m rlx_onnx_amp` with PYTHONPATH=root, started in `cwd` (outside the repo, so the
    current directory on sys.path imports nothing); fails unless it imports root's package,
    byte-compiled first (`_byte_compile`)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    _byte_compile(env, cwd)
    proc = subprocess.run([sys.executable, "-c", "import rlx_onnx_amp; print(rlx_onnx_amp.__file__)"], env=env,
                          cwd=cwd, capture_output=True, text=True)
    module = Path(proc.stdout.strip()).resolve() if proc.returncode == 0 else None
    if module is None or not module.is_relative_to(root.resolve()):
        raise SystemExit(f"{label}: PYTHONPATH={root} imports rlx_onnx_amp from "
                         f"{module or proc.stderr.strip()[-500:]}, not from {root}")
    print(f"{label}: rlx_onnx_amp from {module}", flush=True)
    return Tree(label, [sys.executable, "-m", "rlx_onnx_amp"], env, cwd, str(module))


def _safe(label: str) -> str:
    """`label` as part of a file name (REV may hold / or ~)."""
    return re.sub(r"[^\w.@+-]", "_", label)


def _median_row(runs: list[dict]) -> dict:
    """One row for the --repeat runs of one contender: median wall and cpu of the runs that
    succeeded, the largest peak RSS, the first failure's status if any failed; every run under "runs"."""
    if len(runs) == 1:
        return runs[0]
    ok = [r for r in runs if r["status"] == "ok"]
    row = dict(ok[-1] if ok else runs[-1])
    row["status"] = next((r["status"] for r in runs if r["status"] != "ok"), "ok")
    if ok:
        row["wall_s"] = round(statistics.median(r["wall_s"] for r in ok), 2)
        cpu = [r["cpu_s"] for r in ok if r["cpu_s"] is not None]
        row["cpu_s"] = round(statistics.median(cpu), 2) if cpu else None
    rss = [r["peak_rss_mb"] for r in runs if r["peak_rss_mb"] is not None]
    row["peak_rss_mb"] = max(rss) if rss else None
    row["runs"] = [{k: r[k] for k in ("status", "wall_s", "cpu_s", "peak_rss_mb", "sync_s")} for r in runs]
    return row


def _verifies_by_default(t: Tree) -> bool:
    """Whether the tree's CLI has --no-verify (its plain command verifies)."""
    shown = subprocess.run([*t.base, "convert", "--help"], capture_output=True, text=True, env=t.env, cwd=t.cwd)
    return "--no-verify" in shown.stdout


class Slot(NamedTuple):
    """One rlx command of a round: a tree, the policy it runs and whether it verifies."""

    label: str
    tree: Tree
    policy: str
    verify: bool  # the plain command (screen and verify; `auto` searches)
    no_verify_flag: bool  # the command says --no-verify (the tree verifies by default)


def _slots(trees: list[Tree], args: argparse.Namespace) -> list[Slot]:
    """Each tree once with `--policy P --no-verify` (the conversion alone; a tree whose plain
    command does not verify runs it plain), or, with --policies, once per entry (`_policies`)."""
    slots = []
    for t in trees:
        verifies = _verifies_by_default(t)
        if args.policies is None:
            slots.append(Slot(t.label, t, args.policy, False, verifies))
            continue
        for policy, verify in _policies(args.policies):
            label = f"{t.label} {policy}" + ("" if verify else " --no-verify")
            slots.append(Slot(label, t, policy, verify, verifies and not verify))
    return slots


def _policies(spec: str) -> list[tuple[str, bool]]:
    """--policies: (policy, whether the plain command verifies) per entry, POLICY or POLICY:no-verify."""
    out = []
    for entry in spec.split(","):
        policy, _, mode = entry.strip().partition(":")
        if not policy or mode not in ("", "no-verify"):
            raise SystemExit(f"--policies: {entry!r} is not POLICY or POLICY:no-verify")
        out.append((policy, mode != "no-verify"))
    return out


def _report_summary(path: Path) -> dict | None:
    """The verdict of a plain command's JSON report, and its search's evaluations where it searched."""
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    repair = report.get("repair") or {}
    cost = report.get("cost") or {}
    return {"passed": (report.get("verify") or {}).get("passed"), "evaluations": repair.get("evaluations"),
            "kept_f32": len(repair.get("kept_f32") or []) if repair else None,
            "mac_low_share": cost.get("mac_low_share"), "seconds": (report.get("run") or {}).get("seconds")}


def run_rlx(trees: list[Tree], model: Path, work: Path, prefix: str, tag: str, warm_paths: list[Path],
            args: argparse.Namespace, log_dir: Path, peers: list[str] = ()) -> list[dict]:
    """rlx (and rlx@REV), then each of `peers`, --repeat times each, alternating (each round runs
    every one once, so that a drift of the machine's speed meets all alike), writing
    work/<prefix><label>.onnx; one row per tree, then per peer (`_median_row`), named label + tag."""
    slots = _slots(trees, args)
    runs: dict[str, list[dict]] = {label: [] for label in [*(s.label for s in slots), *peers]}
    for i in range(args.repeat):
        suffix = f"_r{i + 1}" if args.repeat > 1 else ""
        for slot in slots:
            t = slot.tree
            out = work / f"{prefix}{_safe(slot.label)}.onnx"
            report = out.with_name(out.name + ".report.json")
            extra = ["--report-json", str(report)] if slot.verify else ["--no-verify"] if slot.no_verify_flag else []
            cmd = [*t.base, str(model), "--policy", slot.policy, "-o", str(out), "-q", *extra]
            name = _safe(slot.label) + tag + suffix
            res = run_one(name, cmd, out, warm_paths, args.mem_gb, args.timeout, log_dir, t.env, t.cwd)
            if slot.verify:
                res["report"] = _report_summary(report)
                report.unlink(missing_ok=True)
            runs[slot.label].append(res)
            if not args.keep:
                for p in _outputs(out):
                    p.unlink(missing_ok=True)
        for peer in peers:
            out = work / f"{prefix}{peer}.onnx"
            runs[peer].append(run_one(peer + tag + suffix, _cmd(peer, model, out, args.policy), out, warm_paths,
                                      args.mem_gb, args.peer_timeout, log_dir))
            if not args.keep:
                for p in _outputs(out):
                    p.unlink(missing_ok=True)
    rows = [_median_row(runs[label]) for label in runs]
    for label, row in zip(runs, rows):
        row["name"] = label + tag
    return rows


def _ratio(rows: list[dict]) -> dict:
    """rlx / rlx@REV of wall time, from run_rlx's two rows."""
    cur, base = rows
    ok = cur["status"] == "ok" and base["status"] == "ok" and base["wall_s"] > 0
    return {"rlx_s": cur["wall_s"], "baseline_s": base["wall_s"],
            "ratio": round(cur["wall_s"] / base["wall_s"], 3) if ok else None}


def _peer_ratio(rlx: dict, peer: dict) -> dict:
    """rlx / a peer converter of wall time, from their rows."""
    ok = rlx["status"] == "ok" and peer["status"] == "ok" and peer["wall_s"] > 0
    return {"rlx_s": rlx["wall_s"], "peer_s": peer["wall_s"],
            "ratio": round(rlx["wall_s"] / peer["wall_s"], 3) if ok else None}


def _print_ratio(ratio: dict, trees: list[Tree], where: str, repeat: int) -> None:
    what = f"median of {repeat} alternating runs each" if repeat > 1 else "one run each"
    print(f"rlx / {trees[1].label}{where}: {_fmt(ratio['ratio'], '.3f')} "
          f"({ratio['rlx_s']:.2f} s / {ratio['baseline_s']:.2f} s, {what})")


def _machine() -> dict:
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    versions = {}
    for mod in ("numpy", "onnx", "onnxruntime", "onnxconverter_common", "rlx_onnx_amp"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    return {"cpus": os.cpu_count(), "mem_gib": mem, "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions}


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def mode_model(args: argparse.Namespace, trees: list[Tree]) -> dict:
    model = Path(args.model).resolve()
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    data_files = sorted({(model.parent / e.value) for t in proto.graph.initializer for e in t.external_data if e.key == "location"})
    f32_bytes = sum(p.stat().st_size for p in data_files)
    print(f"model {model}: {len(proto.graph.node)} nodes, {len(proto.graph.initializer)} initializers, "
          f"external data {f32_bytes / 1e9:.3f} GB in {[p.name for p in data_files]}", flush=True)
    del proto
    work = Path(args.work) / "scale_out"
    work.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="logs_", dir=work))
    results = []
    ratio = None
    for name in args.contenders.split(","):
        if name == "rlx":
            rows = run_rlx(trees, model, work, "", "", [model, *data_files], args, log_dir)
            results += rows
            ratio = _ratio(rows) if len(trees) > 1 else None
            continue
        out = work / f"{name}.onnx"
        res = run_one(name, _cmd(name, model, out, args.policy), out, [model, *data_files], args.mem_gb, args.timeout, log_dir)
        results.append(res)
        if not args.keep:
            for p in _outputs(out):
                p.unlink(missing_ok=True)
    floor = next((r for r in results if r["name"] == "floor" and r["status"] == "ok"), None)
    for r in results:
        r["x_floor"] = round(r["wall_s"] / floor["wall_s"], 2) if floor and r["status"] == "ok" else None
        r["rss_frac_of_f32"] = round(r["peak_rss_mb"] * (1 << 20) / f32_bytes, 3) if r.get("peak_rss_mb") else None
        r["tree_frac_of_f32"] = round(r["tree_peak_rss_mb"] * (1 << 20) / f32_bytes, 3) if r.get("tree_peak_rss_mb") else None
    print()
    print(f"f32 external data: {f32_bytes / 1e9:.3f} GB ({f32_bytes / (1 << 20):.0f} MiB); memory limit {args.mem_gb:g} GiB "
          f"(address space), timeout {args.timeout}s")
    cw = max(8, *(len(r["name"]) for r in results))
    hdr = (f"{'contender':<{cw}} {'status':<10} {'wall s':>8} {'x floor':>8} {'peak RSS MB':>12} {'RSS/f32':>8} "
           f"{'main MB':>8} {'child MB':>9} {'tree MB':>8} {'tree/f32':>9} {'cpu s':>8} {'sync s':>7} {'out data MB':>12}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        st = "ok" if r["status"] == "ok" else "FAILED"
        data_mb = (r.get("output") or {}).get("data_mb")
        print(f"{r['name']:<{cw}} {st:<10} {r['wall_s']:>8.1f} {_fmt(r['x_floor'], '.2f'):>8} {_fmt(r['peak_rss_mb'], '.0f'):>12} "
              f"{_fmt(r['rss_frac_of_f32'], '.2f'):>8} {_fmt(r.get('main_peak_rss_mb'), '.0f'):>8} "
              f"{_fmt(r.get('child_peak_rss_mb'), '.0f'):>9} {_fmt(r.get('tree_peak_rss_mb'), '.0f'):>8} "
              f"{_fmt(r.get('tree_frac_of_f32'), '.2f'):>9} {_fmt(r['cpu_s'], '.1f'):>8} {r['sync_s']:>7.1f} {_fmt(data_mb, '.1f'):>12}")
    for r in results:
        if r.get("report"):
            print(f"  {r['name']}: report {r['report']}")
    for r in results:
        if r["status"] != "ok":
            print(f"  {r['name']}: {r['status']}")
    for r in results:
        o = r.get("output") or {}
        if "init_elems_by_type" in o:
            print(f"  {r['name']}: initializer elements by type {o['init_elems_by_type']}, {o.get('nodes')} nodes, {o.get('casts')} Cast")
    if ratio:
        _print_ratio(ratio, trees, "", args.repeat)
    print(f"logs: {log_dir}")
    return {"mode": "model", "model": str(model), "f32_bytes": f32_bytes, "policy": args.policy, "mem_gb": args.mem_gb,
            "timeout_s": args.timeout, "results": results, **({"ratios": [ratio]} if ratio else {})}


def _per_node(res: dict, nodes: int, startup_s: float | None = None) -> dict:
    """Adds nodes and microseconds per node (also after the CLI's start-up, when given) to a row."""
    ok = res["status"] == "ok"
    res["nodes"] = nodes
    res["us_per_node"] = round(res["wall_s"] / nodes * 1e6, 1) if ok else None
    if ok and startup_s is not None:
        res["us_per_node_after_startup"] = round((res["wall_s"] - startup_s) / nodes * 1e6, 1)
    return res


def mode_nodes(args: argparse.Namespace, trees: list[Tree]) -> dict:
    work = Path(args.work) / "node_scaling"
    work.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="logs_", dir=work))
    rows = []
    peer_limit = args.peers_max_nodes
    ratios = []
    peer_ratios = []  # rlx / each peer, per graph size
    # Fixed cost of starting the CLI (interpreter + imports), to separate from per-node cost.
    startups = {t.label: run_one(f"{_safe(t.label)}_startup", [*t.base, "--version"], work / "none.onnx", [], args.mem_gb,
                                 60, log_dir, t.env, t.cwd) for t in trees}
    startup_s = {label: s["wall_s"] if s["status"] == "ok" else 0.0 for label, s in startups.items()}
    for n in [int(s) for s in args.nodes.split(",")]:
        path = work / f"chain_{n}.onnx"
        t0 = time.perf_counter()
        meta = build_chain(n, path)
        print(f"built {path.name}: {meta['nodes']} nodes, {meta['initializers']} initializers, "
              f"{meta['bytes'] / 1e6:.1f} MB in {time.perf_counter() - t0:.1f}s", flush=True)
        names = [c for c in args.contenders.split(",") if c != "floor"]
        peers = [c for c in names if c != "rlx"] if n <= peer_limit else []
        contenders = trees if "rlx" in names else []
        found = run_rlx(contenders, path, work, f"chain_{n}.", f"_{n}", [path], args, log_dir, peers)
        for label, res in zip([*(t.label for t in contenders), *peers], found):
            res["contender"] = label
            _per_node(res, meta["nodes"], startup_s.get(label))
        rows += found
        if len(contenders) > 1:
            ratios.append({"nodes": meta["nodes"], **_ratio(found[:2])})
        for peer, res in zip(peers, found[len(contenders):]):
            if contenders:
                peer_ratios.append({"nodes": meta["nodes"], "peer": peer, **_peer_ratio(found[0], res)})
    print()
    for label, startup in startups.items():
        print(f"{'rlx-amp' if label == 'rlx' else label} --version (interpreter + imports): {startup_s[label]:.2f}s, "
              f"peak RSS {_fmt(startup.get('peak_rss_mb'), '.0f')} MB")
    cw = max(8, *(len(r["contender"]) for r in rows)) if rows else 8
    hdr = (f"{'contender':<{cw}} {'nodes':>8} {'status':<8} {'wall s':>8} {'us/node':>9} {'us/node-startup':>16} "
           f"{'peak RSS MB':>12} {'cpu s':>8}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        st = "ok" if r["status"] == "ok" else "FAILED"
        print(f"{r['contender']:<{cw}} {r['nodes']:>8} {st:<8} {r['wall_s']:>8.2f} {_fmt(r['us_per_node'], '.1f'):>9} "
              f"{_fmt(r.get('us_per_node_after_startup'), '.1f'):>16} {_fmt(r['peak_rss_mb'], '.0f'):>12} {_fmt(r['cpu_s'], '.2f'):>8}")
    for r in rows:
        if r["status"] != "ok":
            print(f"  {r['name']}: {r['status']}")
    for ratio in ratios:
        _print_ratio(ratio, trees, f" at {ratio['nodes']} nodes", args.repeat)
    what = f"median of {args.repeat} alternating runs each" if args.repeat > 1 else "one run each"
    for ratio in peer_ratios:
        print(f"rlx / {ratio['peer']} at {ratio['nodes']} nodes: {_fmt(ratio['ratio'], '.3f')} "
              f"({_fmt(ratio['rlx_s'], '.2f')} s / {_fmt(ratio['peer_s'], '.2f')} s, {what})")
    print(f"logs: {log_dir}")
    result = {"mode": "nodes", "policy": args.policy, "startup": startups["rlx"], "rows": rows,
              "peer_ratios": peer_ratios}
    if len(trees) > 1:
        result.update({"baseline_startup": startups[trees[1].label], "ratios": ratios})
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model with external data")
    ap.add_argument("--nodes", help="comma-separated node counts for synthetic graphs")
    ap.add_argument("--contenders", default=None, help="default floor,rlx,occ,ort (--nodes: rlx,occ,ort)")
    ap.add_argument("--policy", default=None, help="rlx policy (default always-f16 with --model, auto-mixed with --nodes)")
    ap.add_argument("--policies", metavar="LIST",
                    help="--model: run rlx once per entry, POLICY (the plain command: it verifies) or POLICY:no-verify")
    ap.add_argument("--mem-gb", type=float, default=20.0, help="address-space limit per contender (GiB)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per contender")
    ap.add_argument("--peer-timeout", type=int, default=300, help="--nodes: seconds per peer run")
    ap.add_argument("--peers-max-nodes", type=int, default=10000, help="--nodes: run peers only on graphs up to this size")
    ap.add_argument("--work", default=str(DEFAULT_WORK), help="scratch directory (outside the repo)")
    ap.add_argument("--keep", action="store_true", help="keep converted outputs")
    ap.add_argument("--json", help="JSON path (default bench/out/scale_<mode>.json)")
    ap.add_argument("--baseline-rev", metavar="REV", help="also run rlx@REV: rlx-amp with the code of git revision REV")
    ap.add_argument("--repeat", type=int, default=1, metavar="K",
                    help="run rlx (and rlx@REV; with --nodes the peers too) K times each, alternating, "
                         "and report the median wall")
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "IN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, inp, out = args.worker
        WORKERS[kind](inp, out)
        return 0
    if bool(args.model) == bool(args.nodes):
        ap.error("give --model or --nodes")
    if args.model:
        args.contenders = args.contenders or "floor,rlx,occ,ort"
        args.policy = args.policy or "always-f16"
    else:
        args.contenders = args.contenders or "rlx,occ,ort"
        args.policy = args.policy or "auto-mixed"
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.policies is not None and (args.nodes or args.baseline_rev):
        ap.error("--policies goes with --model, without --baseline-rev")
    if args.policies is not None:
        _policies(args.policies)  # a bad entry is refused before anything runs
    if args.baseline_rev and "rlx" not in args.contenders.split(","):
        ap.error("--baseline-rev needs rlx among --contenders")
    t0 = time.perf_counter()
    if args.baseline_rev:
        # SIGTERM ends the run through SystemExit, so the worktree is removed as on any error.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        with worktree(args.baseline_rev) as (root, commit), tempfile.TemporaryDirectory(prefix="rlx-amp-cwd-") as cwd:
            # Both run alike (python3 -m, PYTHONPATH, same cwd outside the repo) so only the code differs.
            trees = [_tree_at("rlx", REPO, Path(cwd)), _tree_at(f"rlx@{args.baseline_rev}", root, Path(cwd))]
            result = mode_model(args, trees) if args.model else mode_nodes(args, trees)
        result["baseline"] = {"rev": args.baseline_rev, "commit": commit, "modules": {t.label: t.module for t in trees}}
    else:
        trees = [_installed_tree()]
        result = mode_model(args, trees) if args.model else mode_nodes(args, trees)
    result["repeat"] = args.repeat
    result["machine"] = _machine()
    result["total_s"] = round(time.perf_counter() - t0, 1)
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    OUT_JSON_DIR.mkdir(exist_ok=True)
    path = Path(args.json) if args.json else OUT_JSON_DIR / f"scale_{result['mode']}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
