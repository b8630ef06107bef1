"""Gain: rlx-amp's search policy against onnxconverter-common's auto_convert_mixed_precision.

    python bench/gain_zoo.py [--data-dir bench/data/gain_zoo] [--models a,b] [--rlx-policy auto]
                             [--peer-timeout 900] [--rlx-timeout 1800] [--out bench/out/gain_zoo.json]
                             [--autocast-python /tmp/venv-autocast/bin/python]

One run, side by side on the models of bench/export_gain_zoo.py (exported first where
DATA_DIR/NAME/model.onnx is missing: torchvision classifiers, tiny transformers, the two
overflowing repair models, the demo block, skl2onnx MLPs and a logistic regression; random or
seeded-fit weights, nothing downloaded).

Per model, one fixed input set is drawn (numpy default_rng(0), a symbolic first axis taken as 1:
float inputs uniform in [-1, 1];
integer inputs named *mask* all ones, other integer inputs uniform in [0, vocab), vocab = rows of
the first Gather on an initializer, as bench/repair_bench.py draws them) and saved as
DATA_DIR/NAME/feeds.npz. Then, each in its own subprocess with wall time taken around it
(time.perf_counter; Python start-up, imports, model load and save included for every one):

  auto    rlx-amp MODEL --policy RLX_POLICY -o auto.onnx --inputs feeds.npz --provider cpu
          --report-json auto.json     (RLX_POLICY: --rlx-policy, default `auto`, split on
          spaces, so `--rlx-policy "always-f16 --repair"` gives `--policy always-f16 --repair`)
  peer    python bench/repair_bench.py --peer-child ...: auto_convert_mixed_precision(model,
          feeds, rtol=0, atol=A, keep_io_types=True), its evaluations counted (repair_bench's
          child, reused as it is); killed after --peer-timeout seconds (a timeout)
  f16     rlx-amp MODEL --policy always-f16 -o f16.onnx ... (the plain command: range screen and
          verification on, no search): what `auto` costs is reported as a multiple of its wall time
  mixed   rlx-amp MODEL --policy auto-mixed -o mixed.onnx ... (the default policy): the MAC
          share the default buys
  ac_default, ac_feeds
          Model-Optimizer's AutoCast, convert_to_mixed_precision(onnx_path=MODEL) with its
          defaults (fp16, keep_io_types=False, data_max=512, init_max=65504, providers=["cpu"]),
          without calibration data (it draws its own inputs in [-1, 1]) and with
          calibration_data=feeds.npz: bench/autocast_child.py run by --autocast-python, a venv
          of its own (`python3 -m venv /tmp/venv-autocast && /tmp/venv-autocast/bin/pip install
          nvidia-modelopt 'onnxruntime~=1.24.2' 'onnx~=1.21.0' onnx-graphsurgeon polygraphy
          onnxscript onnxconverter-common onnxslim lief cppimport ml_dtypes torch`: its `[onnx]`
          extra less onnxruntime-gpu and cupy; without onnxslim `modelopt.onnx` does not import),
          killed after --peer-timeout seconds; "not installed" where that Python is absent. Then
          the same child checks that its output loads in onnxruntime (CPU) and runs on the feeds
          (cast to the output's input types: its default makes float inputs float16)

Tolerance: rlx-amp's defaults (per output max|cand - ref| <= 1e-2 + 1e-2 * max|ref|, cosine >=
0.999, no new NaN/Inf); the peer gets rtol = 0 and atol = A = min over float outputs of
1e-2 + 1e-2 * max|ref| (ref: the float32 model on feeds.npz), i.e. rlx-amp's max_abs test (exact
for one float output, the strictest output's bound for several; see repair_bench.py).

Read per tool:
- Compute low: Compute nodes kept low (f16 or bf16) over all Compute nodes. For rlx-amp, the
  report's by_kind.compute; for the peer's output, each node classified with
  rlx_onnx_amp.taxonomy.kind_of(domain, op_type), low when any float output is float16/bfloat16
  (onnx shape inference for the types; Compute nodes without float outputs are not counted;
  inserted Casts are no Compute). The same count is made on rlx-amp's `auto` output too
  (compute_recount in the JSON) as a check of the two rules against each other.
- MAC low: the report's cost.mac_low_share; for the peer, rlx_onnx_amp.cost.estimate_cost on its
  output with the feeds' shapes (the same cost model).
- AutoCast's columns read as the peer's (Compute low recounted, MAC low, `rlx-amp verify`), plus
  whether the output loads and runs in onnxruntime, and from its log the nodes it kept f32 with
  its reason (JSON: skipped, skipped_nodes; compute.f32_ops counts the f32 Compute op types).
- verdict: rlx-amp's own verify.passed and exit code; for the peer, `rlx-amp verify MODEL
  peer.onnx --inputs feeds.npz --provider cpu` (emulated, the same criterion as rlx-amp's
  verdict), after its own allclose test passed. Peer failures: timeout, crash (non-zero exit:
  a Python error such as "validation failed for final fp16 model", or a signal), unloadable
  output (onnx cannot load it or onnxruntime cannot run it).

Needs onnxconverter-common, skl2onnx and scikit-learn beside the package, and for the tv_*
exports a torchvision environment (see bench/export_gain_zoo.py). To benchmark a fixed copy of
the package while the tree changes: PYTHONPATH=/tmp/snap python3 bench/gain_zoo.py, with
/tmp/snap/rlx_onnx_amp a copy (the JSON records the package's path and a hash of its sources).

Prints two Markdown tables (rlx-amp against the peer; AutoCast beside both) and writes JSON
(command, machine, versions, per-model figures) to --out (bench/out/ is ignored by git).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import export_gain_zoo as zoo  # noqa: E402
import repair_bench as rb  # noqa: E402

RLX_ATOL = RLX_RTOL_OF_MAX = 1e-2
RUNS = ("auto", "f16", "mixed")


# --------------------------------------------------------------------------------------------- inputs

def draw_feeds(name: str, model_path: Path, dest: Path) -> dict[str, np.ndarray]:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = tuple(d.dim_value if d.dim_value > 0 else (1 if i == 0 else 0) for i, d in enumerate(tt.shape.dim))
        if any(s <= 0 for s in shape):  # a symbolic batch axis is 1; other symbolic axes need a static export
            raise SystemExit(f"{name}: input {inp.name} has a symbolic shape {shape}; export with static shapes")
        np_type = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(np_type, np.floating):
            feeds[inp.name] = rng.uniform(-1, 1, shape).astype(np_type)
        elif np.issubdtype(np_type, np.integer) and "mask" in inp.name:
            feeds[inp.name] = np.ones(shape, np_type)
        elif np.issubdtype(np_type, np.integer):
            feeds[inp.name] = rng.integers(0, rb._embedding_rows(model), shape).astype(np_type)
        else:
            raise SystemExit(f"{name}: unsupported input type for {inp.name}")
    np.savez(dest, **feeds)
    return feeds


# --------------------------------------------------------------------------------------------- counting

def compute_low(output: Path) -> dict[str, Any]:
    """Compute nodes of a converted model, low when any float output is float16/bfloat16
    (element types from onnx shape inference, through rlx_onnx_amp.types.infer_types)."""
    import onnx

    from rlx_onnx_amp.precision import FLOAT_TYPES, LOW_TYPES
    from rlx_onnx_amp.taxonomy import OpKind, kind_of
    from rlx_onnx_amp.types import infer_types

    model = onnx.load(str(output), load_external_data=True)
    types = infer_types(model)[""]
    low = total = untyped = 0
    high: Counter[str] = Counter()  # op types of the Compute nodes left in f32: what a tool kept
    for node in model.graph.node:
        if kind_of(node.domain, node.op_type) is not OpKind.COMPUTE:
            continue
        outs = [types.get(o) for o in node.output if o]
        floats = [t for t in outs if t in FLOAT_TYPES]
        if not floats:
            untyped += any(t is None for t in outs)
            continue
        total += 1
        is_low = any(t in LOW_TYPES for t in floats)
        low += is_low
        if not is_low:
            high[node.op_type] += 1
    return {"low": low, "total": total, "share": low / total if total else None, "untyped": untyped,
            "f32_ops": dict(high)}


def mac_cost(output: Path, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    import onnx

    from rlx_onnx_amp.cost import estimate_cost

    model = onnx.load(str(output), load_external_data=True)
    c = estimate_cost(model, {k: list(v.shape) for k, v in feeds.items()}).to_json()
    return {"macs": c.get("macs"), "macs_low": c.get("macs_low"), "mac_low_share": c.get("mac_low_share")}


def read_report(path: Path) -> dict[str, Any]:
    rep = json.loads(path.read_text())
    comp = rep.get("by_kind", {}).get("compute", {})
    total = sum(comp.values())
    low = comp.get("f16", 0) + comp.get("bf16", 0)
    cost = rep.get("cost") or {}
    verify = rep.get("verify") or {}
    repair = rep.get("repair") or {}
    return {"compute": {"low": low, "total": total, "share": low / total if total else None, "by_precision": comp},
            "macs": cost.get("macs"), "mac_low_share": cost.get("mac_low_share"), "passed": verify.get("passed"),
            "emulated": verify.get("emulated"), "evaluations": repair.get("evaluations"),
            "policy": (rep.get("policy") or {}).get("name"), "nodes": (rep.get("nodes") or {}).get("total")}


# --------------------------------------------------------------------------------------------- bench

def _clean(*paths: Path) -> None:
    for p in paths:
        for q in (p, *p.parent.glob(p.name + ".*data")):
            q.unlink(missing_ok=True)


def run_rlx(key: str, policy: list[str], model: Path, feeds: Path, mdir: Path, timeout: float) -> dict[str, Any]:
    out, rep = mdir / f"{key}.onnx", mdir / f"{key}.json"
    _clean(out, rep)
    cmd = ["rlx-amp", str(model), "--policy", *policy, "-o", str(out), "--inputs", str(feeds), "--provider", "cpu",
           "--report-json", str(rep), "-q"]
    res: dict[str, Any] = rb._run(cmd, mdir / f"{key}.log", timeout)
    res["output"] = str(out)
    if rep.exists():
        res.update(read_report(rep))
    elif res["status"] != "timeout":
        res["error"] = (mdir / f"{key}.log").read_text()[-1500:]
    return res


def run_peer(model: Path, feeds: Path, mdir: Path, atol: float, timeout: float,
             feed_arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    out, prog = mdir / "peer.onnx", mdir / "peer_progress.json"
    _clean(out, prog)
    cmd = [sys.executable, str(HERE / "repair_bench.py"), "--peer-child", str(model), str(feeds), str(out),
           repr(atol), repr(0.0), str(prog)]
    res: dict[str, Any] = rb._run(cmd, mdir / "peer.log", timeout)
    res["output"] = str(out)
    if prog.exists():
        st = json.loads(prog.read_text())
        res.update(evaluations=st["evaluations"], child_status=st["status"], error=st.get("error"),
                   search_s=st.get("search_s"), blocked_per_evaluation=st["blocked"])
    if res["status"] == "timeout":
        res["failure"] = "timeout"
        return res
    if res["rc"] != 0:
        # "gave up": its search ended without a passing model; "crash": any other error or a signal
        res["failure"] = "gave up" if "validation failed" in str(res.get("error")) else "crash"
        if not res.get("error"):
            res["error"] = (mdir / "peer.log").read_text()[-1500:]
        return res
    return judge_output("peer", model, out, feeds, mdir, feed_arrays, res)


def judge_output(key: str, model: Path, out: Path, feeds: Path, mdir: Path, feed_arrays: dict[str, np.ndarray],
                 res: dict[str, Any]) -> dict[str, Any]:
    """A peer's written model, counted and judged as rlx-amp's own: Compute low, MAC low, and
    `rlx-amp verify MODEL OUT` on the feeds (files KEY_verify.json/.log); res gets the figures."""
    try:
        res["compute"] = compute_low(out)
        res.update(mac_cost(out, feed_arrays))
    except Exception as e:
        res.update(failure="unloadable output", error=f"onnx: {type(e).__name__}: {e}"[:1500])
        return res
    vrep = mdir / f"{key}_verify.json"
    vrep.unlink(missing_ok=True)
    v = rb._run(["rlx-amp", "verify", str(model), str(out), "--inputs", str(feeds), "--provider", "cpu",
                 "--report-json", str(vrep), "-q"], mdir / f"{key}_verify.log", 900)
    res["verify"] = {k: v[k] for k in ("rc", "status", "wall_s")}
    if vrep.exists():
        vv = json.loads(vrep.read_text()).get("verify", {})
        res.update(passed=vv.get("passed"), emulated=vv.get("emulated"))
        if vv.get("candidate_loaded") is False:
            res["failure"] = "unloadable output"
    else:
        res.update(failure="unloadable output", error=(mdir / f"{key}_verify.log").read_text()[-1500:])
    return res


#: the two AutoCast columns: key -> whether feeds.npz is its calibration_data
AUTOCAST = {"ac_default": False, "ac_feeds": True}


def run_autocast(key: str, python: str, model: Path, feeds: Path, mdir: Path, timeout: float,
                 feed_arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """AutoCast (bench/autocast_child.py in its own venv, `python`) with its defaults, and with
    feeds.npz as calibration_data where AUTOCAST[key]; then whether its output loads and runs in
    onnxruntime (the same child: AutoCast's onnxruntime) and judge_output's figures."""
    if not Path(python).exists():
        return {"status": "not installed", "rc": None, "wall_s": None, "failure": "not installed", "python": python}
    out, result, check = mdir / f"{key}.onnx", mdir / f"{key}_result.json", mdir / f"{key}_check.json"
    _clean(out, result, check)
    child = str(HERE / "autocast_child.py")
    cmd = [python, child, "convert", str(model), str(out), str(result), *([str(feeds)] if AUTOCAST[key] else [])]
    res: dict[str, Any] = rb._run(cmd, mdir / f"{key}.log", timeout)
    res["output"] = str(out)
    if result.exists():
        st = json.loads(result.read_text())
        res.update({k: st.get(k) for k in ("versions", "import_s", "convert_s", "error", "skipped", "skipped_nodes",
                                           "converted_line")})
    if res["status"] == "timeout":
        res["failure"] = "timeout"
        return res
    if res["rc"] != 0 or not out.exists():
        res["failure"] = "crash"
        if not res.get("error"):
            res["error"] = (mdir / f"{key}.log").read_text()[-1500:]
        return res
    c = rb._run([python, child, "check", str(out), str(feeds), str(check)], mdir / f"{key}_check.log", 900)
    res["ort"] = json.loads(check.read_text()) if check.exists() else {
        "loaded": None, "ran": None, "error": f"check {c['status']}: " + (mdir / f"{key}_check.log").read_text()[-500:]}
    return judge_output(key, model, out, feeds, mdir, feed_arrays, res)


def bench_model(name: str, data_dir: Path, policy: list[str], peer_timeout: float, rlx_timeout: float,
                autocast_python: str) -> dict[str, Any]:
    mdir = data_dir / name
    model = mdir / "model.onnx"
    feeds_path = mdir / "feeds.npz"
    feeds = draw_feeds(name, model, feeds_path)
    ref = rb.reference_outputs(model, feeds)
    max_ref = {k: float(np.max(np.abs(v[np.isfinite(v)]))) if np.isfinite(v).any() else None
               for k, v in ref.items() if np.issubdtype(v.dtype, np.floating)}
    atol = min((RLX_ATOL + RLX_RTOL_OF_MAX * m for m in max_ref.values() if m is not None), default=RLX_ATOL)
    meta = json.loads((mdir / "meta.json").read_text()) if (mdir / "meta.json").exists() else {}
    info: dict[str, Any] = {"model": name, "source": meta.get("source"), "nodes": meta.get("nodes"),
                            "feeds": {k: list(v.shape) for k, v in feeds.items()}, "max_abs_reference": max_ref,
                            "peer_tolerance": {"atol": atol, "rtol": 0.0}}
    print(f"== {name}: {info['nodes']} nodes, max|ref| {max_ref}, peer atol {atol:.6g}", flush=True)
    res: dict[str, Any] = {}
    policies = {"auto": policy, "f16": ["always-f16"], "mixed": ["auto-mixed"]}
    for key in ("auto", "f16"):
        res[key] = run_rlx(key, policies[key], model, feeds_path, mdir, rlx_timeout)
        _say(key, res[key])
    res["peer"] = run_peer(model, feeds_path, mdir, atol, peer_timeout, feeds)
    _say("peer", res["peer"])
    res["mixed"] = run_rlx("mixed", policies["mixed"], model, feeds_path, mdir, rlx_timeout)
    _say("mixed", res["mixed"])
    for key in AUTOCAST:  # AutoCast gets the peer's timeout
        res[key] = run_autocast(key, autocast_python, model, feeds_path, mdir, peer_timeout, feeds)
        _say(key, res[key])
    if Path(res["auto"]["output"]).exists():
        try:
            res["auto"]["compute_recount"] = compute_low(Path(res["auto"]["output"]))
        except Exception as e:
            res["auto"]["compute_recount"] = {"error": f"{type(e).__name__}: {e}"}
    a, f = res["auto"]["wall_s"], res["f16"]["wall_s"]
    info["auto_over_f16_wall"] = a / f if f else None
    info["results"] = res
    return info


def _say(key: str, r: dict[str, Any]) -> None:
    c = r.get("compute") or {}
    wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
    print(f"   {key:5}: {r['status']} in {wall}s, compute low {c.get('low')}/{c.get('total')}, "
          f"MAC low {_pct(r.get('mac_low_share'))}, passed {r.get('passed')}, evaluations {r.get('evaluations')}"
          + (f", {r['failure']}: {str(r.get('error'))[:200]}" if r.get("failure") else ""), flush=True)


# --------------------------------------------------------------------------------------------- output

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _low(r: dict[str, Any]) -> str:
    c = r.get("compute")
    if not c:
        return "-"
    return f"{c['low']}/{c['total']}" + (f" ({_pct(c['share'])})" if c["total"] else "")


def _verdict(r: dict[str, Any], peer: bool = False) -> str:
    if peer and r.get("failure"):
        why = r["failure"]
        err = str(r.get("error") or "").strip()
        node = re.search(r"(?:of|in) node \((\S+?)\)", err)
        if why == "crash" and "ONNXRuntimeError" in err and node:
            why += f": onnxruntime refuses its f16 model (type error at {node.group(1)})"
        elif why == "crash" and err:
            last = err.splitlines()[-1]
            why += ": " + (last[:60] + "..." if len(last) > 60 else last).replace("|", "/")
        return why
    passed = r.get("passed")
    word = {True: "pass", False: "fail", None: "?"}[passed]
    if peer:
        return word
    return f"{word} (exit {r['rc']})" if r["rc"] is not None else "timeout"


def table(rows: list[dict[str, Any]], policy: str) -> str:
    head = ["model", "compute nodes", f"auto [{policy}]: compute low", "MAC low", "evals", "wall s", "verdict",
            "peer: compute low", "MAC low", "evals", "wall s", "verdict", "always-f16: compute low", "wall s",
            "verdict", "auto / always-f16", "auto-mixed: MAC low", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for info in rows:
        r = info["results"]
        a, p, f, m = r["auto"], r["peer"], r["f16"], r["mixed"]
        total = (a.get("compute") or f.get("compute") or {}).get("total")
        ratio = info.get("auto_over_f16_wall")
        cells = [info["model"], "-" if total is None else str(total),
                 _low(a), _pct(a.get("mac_low_share")), str(a.get("evaluations") or "-"), f"{a['wall_s']:.1f}", _verdict(a),
                 _low(p), _pct(p.get("mac_low_share")), str(p.get("evaluations") or "-"), f"{p['wall_s']:.1f}",
                 _verdict(p, peer=True),
                 _low(f), f"{f['wall_s']:.1f}", _verdict(f),
                 "-" if ratio is None else f"{ratio:.2f}x",
                 _pct(m.get("mac_low_share")), _verdict(m)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _runs(r: dict[str, Any]) -> str:
    """Whether an AutoCast output loads in onnxruntime (CPU) and runs on the feeds."""
    ort = r.get("ort")
    if ort is None:
        return "-"
    if ort.get("ran"):
        bad = [k for k, o in (ort.get("outputs") or {}).items() if o.get("all_finite") is False]
        return "yes" + (f" (non-finite {', '.join(bad)})" if bad else "")
    err = str(ort.get("error") or "").splitlines()[0] if ort.get("error") else ""
    err = (err[:70] + "...") if len(err) > 70 else err
    return ("no, loads; run fails: " if ort.get("loaded") else "no, refused: ") + err.replace("|", "/")


def _ac_verdict(r: dict[str, Any]) -> str:
    if r.get("failure") in ("not installed", "timeout"):
        return r["failure"]
    if r.get("failure") == "crash":
        last = str(r.get("error") or "").strip().splitlines()
        msg = last[-1] if last else ""
        return "crash: " + ((msg[:60] + "...") if len(msg) > 60 else msg).replace("|", "/")
    return _verdict(r, peer=True)


def table_autocast(rows: list[dict[str, Any]], policy: str) -> str:
    """AutoCast beside `auto` and the peer: Compute low, MAC low, loads and runs, rlx-amp's verdict, wall s."""
    head = ["model", "Compute nodes", f"auto [{policy}]: Compute low", "verdict", "peer: Compute low", "verdict"]
    for label in ("AutoCast defaults", "AutoCast + feeds.npz"):
        head += [f"{label}: Compute low", "MAC low", "loads and runs", "rlx-amp verdict", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for info in rows:
        r = info["results"]
        a, p = r["auto"], r["peer"]
        total = (a.get("compute") or r["f16"].get("compute") or {}).get("total")
        cells = [info["model"], "-" if total is None else str(total), _low(a), _verdict(a), _low(p),
                 _verdict(p, peer=True)]
        for key in AUTOCAST:
            c = r[key]
            cells += [_low(c), _pct(c.get("mac_low_share")), _runs(c), _ac_verdict(c),
                      "-" if c["wall_s"] is None else f"{c['wall_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_autocast(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in AUTOCAST:
        rs = [(i["model"], i["results"][key]) for i in rows]
        out[key] = {
            "failures": {m: r["failure"] for m, r in rs if r.get("failure")},
            "runs_in_onnxruntime": sum(bool((r.get("ort") or {}).get("ran")) for _, r in rs),
            "passes_rlx_verify": [m for m, r in rs if r.get("passed") is True],
            "fails_rlx_verify": [m for m, r in rs if r.get("passed") is False],
            "skipped_by_reason": dict(sum((Counter(r.get("skipped") or {}) for _, r in rs), Counter())),
            "f32_compute_ops": {m: (r.get("compute") or {}).get("f32_ops") for m, r in rs
                                if (r.get("compute") or {}).get("f32_ops")},
            "wall_s": {m: r["wall_s"] for m, r in rs}}
        walls = [w for w in out[key]["wall_s"].values() if w is not None]
        out[key]["median_wall_s"] = statistics.median(walls) if walls else None
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [i["auto_over_f16_wall"] for i in rows if i.get("auto_over_f16_wall") is not None]
    out: dict[str, Any] = {"median_auto_over_f16_wall": statistics.median(ratios) if ratios else None,
                           "goal_median_auto_over_f16_wall": 3.0}
    out["goal_met"] = out["median_auto_over_f16_wall"] is not None and out["median_auto_over_f16_wall"] <= 3.0
    cmp = []
    for i in rows:
        a, p = i["results"]["auto"], i["results"]["peer"]
        ca, cp = a.get("compute") or {}, p.get("compute") or {}
        cmp.append({"model": i["model"], "auto_passed": a.get("passed"), "peer_failure": p.get("failure"),
                    "peer_passed": p.get("passed"), "auto_low": ca.get("low"), "peer_low": cp.get("low"),
                    "auto_wall_s": a["wall_s"], "peer_wall_s": p["wall_s"]})
    out["per_model"] = cmp
    out["peer_failures"] = {c["model"]: c["peer_failure"] for c in cmp if c["peer_failure"]}
    out["peer_output_fails_rlx_verify"] = [c["model"] for c in cmp if c["peer_passed"] is False]
    both = [c for c in cmp if c["auto_passed"] and c["peer_passed"] and c["auto_low"] is not None
            and c["peer_low"] is not None]
    out["both_pass"] = len(both)
    out["auto_keeps_more_low"] = [c["model"] for c in both if c["auto_low"] > c["peer_low"]]
    out["auto_keeps_fewer_low"] = [c["model"] for c in both if c["auto_low"] < c["peer_low"]]
    out["auto_faster_than_peer"] = sum(c["auto_wall_s"] < c["peer_wall_s"] for c in cmp)
    return out


def machine() -> dict[str, Any]:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    with contextlib.suppress(ValueError, OSError):
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem,
            "python": platform.python_version()}


def versions() -> dict[str, Any]:
    import onnx
    import onnxconverter_common
    import onnxruntime

    import rlx_onnx_amp

    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    pkg = Path(rlx_onnx_amp.__file__).parent
    digest = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        digest.update(f.relative_to(pkg).as_posix().encode() + b"\0" + f.read_bytes())
    return {"rlx_onnx_amp": rlx_onnx_amp.__version__, "rlx_onnx_amp_path": str(pkg),
            "rlx_onnx_amp_sources_sha256": digest.hexdigest()[:16],
            "git": rev.stdout.strip() or None,
            "git_dirty": bool(dirty.stdout.strip()), "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__, "onnxconverter_common": onnxconverter_common.__version__}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(zoo.DEFAULT_DATA))
    ap.add_argument("--models", default=",".join(zoo.MODELS), help="comma-separated subset of: " + ",".join(zoo.MODELS))
    ap.add_argument("--rlx-policy", default="auto",
                    help='rlx-amp\'s search policy, split on spaces (stand-in: "always-f16 --repair")')
    ap.add_argument("--peer-timeout", type=float, default=900.0)
    ap.add_argument("--rlx-timeout", type=float, default=1800.0)
    ap.add_argument("--tv-python", default=str(REPO / ".venv-torchvision" / "bin" / "python"),
                    help="a Python with torch + torchvision for the tv_* exports")
    ap.add_argument("--autocast-python", default="/tmp/venv-autocast/bin/python",
                    help="a Python with nvidia-modelopt for the AutoCast columns (see bench/autocast_child.py); "
                         "absent: the columns say 'not installed'")
    ap.add_argument("--out", default=str(HERE / "out" / "gain_zoo.json"))
    args = ap.parse_args(argv)
    if shutil.which("rlx-amp") is None:
        raise SystemExit("rlx-amp is not on PATH")
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(zoo.MODELS))
    if unknown:
        ap.error(f"unknown model(s): {', '.join(unknown)}")
    data_dir = Path(args.data_dir)
    ver, mach = versions(), machine()
    missing = zoo.export(names, data_dir, args.tv_python)
    if missing:
        print(f"left out (no export): {', '.join(missing)}", flush=True)
    policy = args.rlx_policy.split()
    rows = [bench_model(n, data_dir, policy, args.peer_timeout, args.rlx_timeout, args.autocast_python)
            for n in names if n not in missing]
    md, md_ac = table(rows, args.rlx_policy), table_autocast(rows, args.rlx_policy)
    sm = summary(rows)
    sm["autocast"] = summary_autocast(rows)
    print()
    print(md)
    print()
    print(f"median auto / always-f16 wall: {sm['median_auto_over_f16_wall']:.2f}x (goal <= 3x: "
          f"{'met' if sm['goal_met'] else 'NOT met'})" if sm["median_auto_over_f16_wall"] is not None else "no ratio")
    print(f"peer failures: {sm['peer_failures'] or 'none'}; peer outputs failing rlx-amp's verify: "
          f"{sm['peer_output_fails_rlx_verify'] or 'none'}")
    print(f"both pass on {sm['both_pass']}: auto keeps more Compute low on {sm['auto_keeps_more_low'] or 'none'}, "
          f"fewer on {sm['auto_keeps_fewer_low'] or 'none'}; auto faster than the peer on "
          f"{sm['auto_faster_than_peer']} of {len(rows)}")
    print()
    print(md_ac)
    print()
    for key, a in sm["autocast"].items():
        print(f"{key}: runs in onnxruntime on {a['runs_in_onnxruntime']} of {len(rows)}; passes rlx-amp's verify on "
              f"{len(a['passes_rlx_verify'])}, fails on {a['fails_rlx_verify'] or 'none'}; failures "
              f"{a['failures'] or 'none'}; kept f32 by its log: {a['skipped_by_reason'] or 'none'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": " ".join([*([f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []),
                             Path(sys.executable).name, *sys.argv]), "rlx_policy": args.rlx_policy,
        "machine": mach, "versions": ver, "peer_timeout_s": args.peer_timeout, "left_out": missing,
        "tolerance_mapping": "rlx-amp defaults (max_abs <= 1e-2 + 1e-2*max|ref|, cosine >= 0.999); peer rtol=0, "
                             "atol = min over float outputs of 1e-2 + 1e-2*max|ref|, keep_io_types=True",
        "table_markdown": md, "table_autocast_markdown": md_ac, "autocast_python": args.autocast_python,
        "autocast_versions": next((i["results"][k].get("versions") for i in rows for k in AUTOCAST
                                   if i["results"][k].get("versions")), None),
        "summary": sm, "models": rows}, indent=2, default=str) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
