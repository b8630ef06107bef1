"""rlx-amp --repair against onnxconverter-common's auto_convert_mixed_precision.

    python bench/repair_bench.py [--data-dir /work/bench_data/repair] [--models convnext,convnext_dw,gpt2]
                                 [--peer-timeout 1200] [--external] [--out bench/out/repair_bench.json]

Models: bench/export_repair_models.py's ConvNeXt and GPT-2 (random weights, rescaled so some
activations overflow float16; exported first when DATA_DIR/NAME/model.onnx is missing). By
default both tools get DATA_DIR/NAME/model_inline.onnx, the export with its external data loaded
into the file (the models are a few MB); --external benchmarks the exported model.onnx (+ .data)
as it is (docs/benchmarks.md's figures come from an --external run).

Per model, one fixed input set is drawn (numpy default_rng(0): float inputs uniform in [-1, 1],
input_ids uniform in [0, vocab)) and saved as DATA_DIR/NAME/feeds.npz. Then, each in its own
subprocess with wall time taken around it (perf_counter; Python start-up, imports, model load and
save included for both):

  rlx   rlx-amp MODEL --policy always-f16 -o rlx.onnx --repair --inputs feeds.npz --provider cpu
        --report-json rlx_report.json          (default budget, default f16 tolerances)
  peer  python bench/repair_bench.py --peer-child ...: onnx.load(MODEL) (external data loaded
        into memory), auto_convert_mixed_precision(model, feeds, rtol=0, atol=A, keep_io_types=True),
        onnx.save. Its evaluations are counted by wrapping float16.convert_float_to_float16 as the
        module sees it: each attempt converts once and runs onnxruntime once (the final
        re-conversion that returns the model included). Killed after --peer-timeout seconds
        (default 1200 = 20 min) and recorded as a timeout.

Tolerance mapping. rlx-amp's f16 criterion per output is max|cand - ref| <= atol + rtol_of_max *
max|ref| (atol = rtol_of_max = 1e-2), cosine >= 0.999, and no new NaN/Inf. The peer checks
np.allclose(ref, cand, rtol, atol), i.e. |ref_i - cand_i| <= atol + rtol * |cand_i| for every i
(NaN fails). With rtol = 0 and atol = A = 1e-2 + 1e-2 * max|ref| (ref: the float32 model's
output on feeds.npz; each model has one output) the peer's test is exactly rlx-amp's max_abs
test; the peer has no cosine test (rlx-amp is the stricter of the two there), and the peer judges
the real float16 model run by onnxruntime's CPU provider while rlx-amp's repair judges an emulated
candidate.

Measuring the outputs alike: `rlx-amp verify MODEL OUT --inputs feeds.npz --provider cpu
--no-emulate --report-json` on both outputs (real float16 execution on the CPU provider), plus the
same with --emulate for both (the figure rlx-amp's repair optimizes).

--minimality: for each node rlx-amp kept in f32, convert again with all the others kept
(--keep-f32-node with exact names) and verify emulated and real; a node whose removal still
passes both was not needed given the others.

Node counting rule (same function for both outputs): onnx.shape_inference on the output; every
node of the output whose name is a node name of the input model (converter-inserted Casts are not)
and that has at least one float output is counted; it is "f32" when all its float outputs are
float32, "f16" when any is float16/bfloat16. Nodes with only integer/bool outputs are not counted.
Inserted Cast nodes are counted separately.

JSON goes to bench/out/ (gitignored).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODELS = ("convnext", "convnext_dw", "gpt2")
RLX_ATOL = RLX_RTOL = 1e-2
RLX_MIN_COSINE = 0.999
KNOWN_ISSUES: list[str] = []


# --------------------------------------------------------------------------------------------- peer child

def peer_child(model_path: str, feeds_path: str, out_path: str, atol: float, rtol: float, progress_path: str) -> int:
    import onnx
    from onnxconverter_common import auto_mixed_precision as amp

    t0 = time.perf_counter()
    model = onnx.load(model_path, load_external_data=True)
    feeds = dict(np.load(feeds_path))
    state: dict[str, Any] = {"evaluations": 0, "blocked": [], "load_s": time.perf_counter() - t0, "status": "running"}
    original = amp.float16.convert_float_to_float16

    def _dump() -> None:
        Path(progress_path).write_text(json.dumps(state))

    def counted(*args: Any, **kwargs: Any) -> Any:
        state["evaluations"] += 1
        state["blocked"].append(len(kwargs.get("node_block_list") or []))
        _dump()
        return original(*args, **kwargs)

    amp.float16.convert_float_to_float16 = counted  # the attribute auto_convert_mixed_precision calls through
    _dump()
    t1 = time.perf_counter()
    try:
        result = amp.auto_convert_mixed_precision(model, feeds, rtol=rtol, atol=atol, keep_io_types=True)
    except Exception as e:
        state.update(status="error", error=f"{type(e).__name__}: {e}", search_s=time.perf_counter() - t1)
        _dump()
        return 1
    state["search_s"] = time.perf_counter() - t1
    onnx.save(result, out_path)
    state["status"] = "ok"
    _dump()
    return 0


# --------------------------------------------------------------------------------------------- helpers

def _run(cmd: list[str], log: Path, timeout: float) -> dict[str, Any]:
    """Run cmd in its own process group; wall time around it; kill the group on timeout."""
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        try:
            rc = proc.wait(timeout=timeout)
            status = "ok" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc, status = None, "timeout"
    return {"cmd": cmd, "rc": rc, "status": status, "wall_s": round(time.perf_counter() - t0, 3), "log": str(log)}


def make_feeds(name: str, model_path: Path, dest: Path) -> dict[str, np.ndarray]:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        tt = inp.type.tensor_type
        shape = tuple(d.dim_value for d in tt.shape.dim)
        if any(s <= 0 for s in shape):
            raise SystemExit(f"{name}: input {inp.name} has a symbolic shape {shape}; export with static shapes")
        if tt.elem_type == onnx.TensorProto.FLOAT:
            feeds[inp.name] = rng.uniform(-1, 1, shape).astype(np.float32)
        elif tt.elem_type == onnx.TensorProto.INT64:
            vocab = _embedding_rows(model)
            feeds[inp.name] = rng.integers(0, vocab, shape).astype(np.int64)
        else:
            raise SystemExit(f"{name}: unsupported input type for {inp.name}")
    np.savez(dest, **feeds)
    return feeds


def _embedding_rows(model: Any) -> int:
    """Rows of the first Gather on an initializer (the token embedding)."""
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[0] in inits:
            return int(inits[node.input[0]].dims[0])
    return 2


def reference_outputs(model_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def count_nodes(original: Path, output: Path) -> dict[str, Any]:
    """The node counting rule of the module docstring."""
    import onnx

    orig = onnx.load(str(original), load_external_data=False)
    names = {n.name for n in orig.graph.node}
    model = onnx.load(str(output), load_external_data=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.input, *g.output)}
    types.update({t.name: t.data_type for t in g.initializer})
    low_types = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    float_types = low_types | {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE}
    f32: list[str] = []
    f16 = unknown = casts_added = 0
    seen = set()
    for node in g.node:
        if node.name not in names:
            casts_added += node.op_type == "Cast"
            continue
        seen.add(node.name)
        outs = [types.get(o) for o in node.output if o]
        if any(t is None or t == 0 for t in outs):
            unknown += 1
        floats = [t for t in outs if t in float_types]
        if not floats:
            continue
        if any(t in low_types for t in floats):
            f16 += 1
        else:
            f32.append(node.name)
    return {"f32": len(f32), "f16": f16, "total": len(f32) + f16, "f32_nodes": f32, "unknown_type_nodes": unknown,
            "casts_added": casts_added, "original_nodes_missing": len(names - seen),
            "nodes_in_output": len(model.graph.node)}


def verify_output(original: Path, output: Path, feeds: Path, emulate: bool, report: Path, log: Path) -> dict[str, Any]:
    cmd = ["rlx-amp", "verify", str(original), str(output), "--inputs", str(feeds), "--provider", "cpu",
           "--emulate" if emulate else "--no-emulate", "--report-json", str(report), "-q"]
    run = _run(cmd, log, 600)
    res: dict[str, Any] = {"rc": run["rc"], "status": run["status"]}
    if report.exists() and run["rc"] in (0, 1):
        v = json.loads(report.read_text())["verify"]
        res.update(passed=v["passed"], emulated=v.get("emulated"), outputs=[
            {k: o.get(k) for k in ("name", "max_abs", "cosine", "passed", "nan_cand", "inf_cand", "failures")}
            for o in v["outputs"]])
    else:
        res["error"] = log.read_text()[-2000:]
    return res


# --------------------------------------------------------------------------------------------- bench

def bench_model(name: str, data_dir: Path, external: bool, peer_timeout: float, rlx_timeout: float,
                minimality: bool) -> dict[str, Any]:
    import onnx

    mdir = data_dir / name
    exported = mdir / "model.onnx"
    if not exported.exists():
        subprocess.run([sys.executable, str(HERE / "export_repair_models.py"), str(data_dir), "--only", name], check=True)
    if external:
        model_path = exported
    else:
        model_path = mdir / "model_inline.onnx"
        onnx.save(onnx.load(str(exported), load_external_data=True), str(model_path))
    feeds_path = mdir / "feeds.npz"
    feeds = make_feeds(name, model_path, feeds_path)
    ref = reference_outputs(model_path, feeds)
    max_ref = {k: float(np.max(np.abs(v[np.isfinite(v)]))) for k, v in ref.items()}
    peer_atol = min(RLX_ATOL + RLX_RTOL * m for m in max_ref.values())  # one output per model: exact
    peer_rtol = 0.0
    info: dict[str, Any] = {"model": name, "model_path": str(model_path), "external_data": external,
                            "nodes": len(onnx.load(str(model_path), load_external_data=False).graph.node),
                            "feeds": {k: list(v.shape) for k, v in feeds.items()}, "max_abs_reference": max_ref,
                            "tolerance": {"rlx": {"atol": RLX_ATOL, "rtol": RLX_RTOL, "min_cosine": RLX_MIN_COSINE},
                                          "peer": {"atol": peer_atol, "rtol": peer_rtol}}}
    print(f"== {name}: {info['nodes']} nodes, max|ref| {max_ref}, peer atol {peer_atol:.6g} rtol 0", flush=True)

    results: dict[str, Any] = {}
    # rlx-amp --repair
    out = mdir / "rlx.onnx"
    rep = mdir / "rlx_report.json"
    for p in (out, out.with_name(out.name + ".data"), *mdir.glob("rlx.onnx.*.data"), rep):
        p.unlink(missing_ok=True)
    run = _run(["rlx-amp", str(model_path), "--policy", "always-f16", "-o", str(out), "--repair", "--inputs",
                str(feeds_path), "--provider", "cpu", "--report-json", str(rep)], mdir / "rlx.log", rlx_timeout)
    r: dict[str, Any] = {"tool": "rlx-amp --repair", **run, "output": str(out)}
    if rep.exists():
        report = json.loads(rep.read_text())
        rr = report.get("repair", {})
        r.update(evaluations=rr.get("evaluations"), search_passed=rr.get("passed"),
                 kept_f32_reported=[f"{k['node']} ({k['op']}, {k['reason']})" for k in rr.get("kept_f32", [])],
                 compute_low_share=rr.get("compute_low_share"), history=rr.get("history"),
                 nodes_by_precision=report.get("nodes", {}).get("by_precision"))
    print(f"   rlx : {run['status']} in {run['wall_s']:.1f}s, {r.get('evaluations')} evaluations", flush=True)
    results["rlx"] = r

    # peer
    pout = mdir / "peer.onnx"
    prog = mdir / "peer_progress.json"
    for p in (pout, prog):
        p.unlink(missing_ok=True)
    run = _run([sys.executable, str(Path(__file__).resolve()), "--peer-child", str(model_path), str(feeds_path), str(pout),
                repr(peer_atol), repr(peer_rtol), str(prog)], mdir / "peer.log", peer_timeout)
    p: dict[str, Any] = {"tool": "onnxconverter-common auto_convert_mixed_precision", **run, "output": str(pout)}
    if prog.exists():
        st = json.loads(prog.read_text())
        p.update(evaluations=st["evaluations"], child_status=st["status"], search_s=st.get("search_s"),
                 error=st.get("error"), final_blocked=st["blocked"][-1] if st["blocked"] else None)
    print(f"   peer: {run['status']} in {run['wall_s']:.1f}s, {p.get('evaluations')} evaluations", flush=True)
    results["peer"] = p

    for key, res in results.items():
        o = Path(res["output"])
        if not o.exists() or res["status"] == "timeout":
            continue
        res["count"] = count_nodes(model_path, o)
        for emulate in (False, True):
            tag = "emulated" if emulate else "real_f16"
            res[f"verify_{tag}"] = verify_output(model_path, o, feeds_path, emulate, mdir / f"{key}_verify_{tag}.json",
                                                 mdir / f"{key}_verify_{tag}.log")
    info["results"] = results
    if minimality and results["rlx"].get("count"):
        info["rlx_minimality"] = minimality_check(model_path, feeds_path, results["rlx"]["count"]["f32_nodes"], mdir)
    return info


def minimality_check(model_path: Path, feeds: Path, kept: list[str], mdir: Path) -> dict[str, Any]:
    """Drop each node rlx-amp kept in f32, one at a time (the others stay kept, through
    --keep-f32-node with exact names), and verify the always-f16 conversion emulated and real:
    a kept node whose removal still passes both was not needed (given the others)."""
    import re

    def attempt(names: list[str], tag: str) -> dict[str, Any]:
        out = mdir / f"min_{tag}.onnx"
        cmd = ["rlx-amp", str(model_path), "--policy", "always-f16", "-o", str(out), "-q"]
        for n in names:
            cmd += ["--keep-f32-node", f"^{re.escape(n)}$"]
        conv = _run(cmd, mdir / f"min_{tag}.log", 600)
        if conv["rc"] != 0:
            return {"status": conv["status"]}
        res = {}
        for emulate in (True, False):
            v = verify_output(model_path, out, feeds, emulate, mdir / f"min_{tag}_{emulate}.json", mdir / f"min_{tag}_{emulate}.log")
            res["emulated" if emulate else "real_f16"] = v.get("passed")
        return res

    per_node = {n: attempt([k for k in kept if k != n], f"drop{i}") for i, n in enumerate(kept)}
    removable = [n for n, r in per_node.items() if r.get("emulated") and r.get("real_f16")]
    together = attempt([k for k in kept if k not in removable], "needed") if removable else None
    print(f"   rlx minimality: {len(removable)} of {len(kept)} kept nodes individually removable: {removable}"
          + (f"; all removed together passes {together}" if together else ""), flush=True)
    return {"per_node": per_node, "individually_removable": removable, "all_removable_dropped": together}


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _abs(o: dict[str, Any]) -> str:
    bad = (o.get("nan_cand") or 0) + (o.get("inf_cand") or 0)
    return f"NaN/Inf x{bad}" if bad else _fmt(o.get("max_abs"))


def table(rows: list[dict[str, Any]]) -> str:
    head = ["model", "tool", "evals", "wall s", "status", "f32/total", "casts+", "output", "max_abs (real f16)",
            "cosine (real)", "pass (real)", "max_abs (emul)", "cosine (emul)", "pass (emul)"]
    lines = []
    for info in rows:
        for key in ("rlx", "peer"):
            r = info["results"][key]
            c = r.get("count", {})
            vr, ve = r.get("verify_real_f16", {}), r.get("verify_emulated", {})
            outs = {o["name"]: o for o in vr.get("outputs", [])}
            oute = {o["name"]: o for o in ve.get("outputs", [])}
            for name in (outs or oute or {"-": {}}):
                o, e = outs.get(name, {}), oute.get(name, {})
                lines.append([info["model"], "rlx-amp" if key == "rlx" else "onnxconverter-common",
                              _fmt(r.get("evaluations"), "d"), f"{r['wall_s']:.1f}",
                              r["status"] if not r.get("error") else f"{r['status']}: {r['error'][:48]}",
                              f"{c['f32']}/{c['total']}" if c else "-", _fmt(c.get("casts_added"), "d") if c else "-",
                              name, _abs(o), _fmt(o.get("cosine"), ".6f"), str(o.get("passed", "-")),
                              _abs(e), _fmt(e.get("cosine"), ".6f"), str(e.get("passed", "-"))])
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*row) for row in lines)])


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for info in rows:
        r, p = info["results"]["rlx"], info["results"]["peer"]
        ratio = r["wall_s"] / p["wall_s"] if p["wall_s"] else None
        peer_f32 = p.get("count", {}).get("f32")
        rlx_f32 = r.get("count", {}).get("f32")
        # A peer model that fails under float16 arithmetic (emulated: what a GPU computes; the
        # CPU provider runs f16 ops in f32 and hides it) is no valid point of comparison.
        peer_valid = p.get("verify_emulated", {}).get("passed")
        out.append({
            "model": info["model"],
            "wall_ratio_rlx_over_peer": ratio,
            "peer_timed_out": p["status"] == "timeout",
            "peer_output_passes_f16_arithmetic": peer_valid,
            "wall_target_met(<=10%)": ratio is not None and ratio <= 0.10,
            "rlx_f32_nodes": rlx_f32, "peer_f32_nodes": peer_f32,
            "nodes_target_met(rlx<=peer)": None if peer_f32 is None or rlx_f32 is None else rlx_f32 <= peer_f32,
        })
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--peer-child":
        _, model, feeds, out, atol, rtol, progress = argv
        return peer_child(model, feeds, out, float(atol), float(rtol), progress)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/work/bench_data/repair")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--peer-timeout", type=float, default=1200.0)
    ap.add_argument("--rlx-timeout", type=float, default=1200.0)
    ap.add_argument("--external", action="store_true", help="benchmark the exported model.onnx + .data as is")
    ap.add_argument("--minimality", action="store_true",
                    help="also drop each node rlx-amp kept in f32, one at a time, and verify (is each one needed?)")
    ap.add_argument("--out", default=str(HERE / "out" / "repair_bench.json"))
    args = ap.parse_args(argv)
    if shutil.which("rlx-amp") is None:
        raise SystemExit("rlx-amp is not on PATH")
    import onnxconverter_common
    import onnxruntime

    rows = [bench_model(m, Path(args.data_dir), args.external, args.peer_timeout, args.rlx_timeout, args.minimality)
            for m in args.models.split(",")]
    print()
    print(table(rows))
    tg = targets(rows)
    print()
    for t in tg:
        print(f"{t['model']}: rlx/peer wall {_fmt(t['wall_ratio_rlx_over_peer'])} (target <= 0.10: "
              f"{'met' if t['wall_target_met(<=10%)'] else 'NOT met'}); f32 nodes rlx {t['rlx_f32_nodes']} vs peer "
              f"{t['peer_f32_nodes']} (target rlx <= peer: {t['nodes_target_met(rlx<=peer)']})"
              + ("; the peer's output FAILS under f16 arithmetic (emulated), so its figures are no valid comparison"
                 if t["peer_output_passes_f16_arithmetic"] is False else ""))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "host": {"python": platform.python_version(), "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__,
                 "onnxconverter_common": onnxconverter_common.__version__},
        "tolerance_mapping": "peer rtol=0, atol=1e-2+1e-2*max|ref| == rlx max_abs bound; rlx adds cosine>=0.999",
        "known_issues": KNOWN_ISSUES, "models": rows, "targets": tg}, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
