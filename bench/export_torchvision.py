"""Export torchvision classifiers and detectors (random weights) for bench/repair_zoo.py.

    /work/tv-venv/bin/python bench/export_torchvision.py [OUT_DIR] [--models a,b,...]

OUT_DIR defaults to /work/bench_data/torchvision. Run it with a Python that has torch,
torchvision, onnx and onnxscript (docs/benchmarks.md's bench uses a separate venv:
`python3 -m venv /work/tv-venv && /work/tv-venv/bin/pip install torch==2.14.1
torchvision==0.29.1 onnx onnxscript`), not the package's own interpreter.

No weights are downloaded: each model is built with `weights=None, weights_backbone=None`
(torchvision's default initialisation) right after `torch.manual_seed(0)`, and put in eval mode.
Each model writes OUT_DIR/NAME/model.onnx (+ model.onnx.data when the exporter writes external
data) and OUT_DIR/NAME/inputs.npz, one fixed input keyed by the ONNX graph's input name:
numpy default_rng(0), uniform in [0, 1), float32.

  classifiers  efficientnet_b0, mobilenet_v3_small, mobilenet_v3_large: input 1x3x224x224,
               dynamo exporter (torch.onnx.export(dynamo=True, external_data=True), its default
               opset); the TorchScript exporter (opset 17) only if the dynamo one fails.
  detectors    ssdlite320_mobilenet_v3_large, fasterrcnn_mobilenet_v3_large_320_fpn,
               retinanet_resnet50_fpn, maskrcnn_resnet50_fpn: input 3x320x320 (the model's
               own transform normalises and resizes it; retinanet and maskrcnn are built with
               min_size=max_size=320 instead of their default 800/1333, so the traced resize is
               the identity and the graph stays small), TorchScript exporter first
               (torch.onnx.export(dynamo=False, opset_version=17)), the dynamo exporter if it
               fails. The input is passed as the list [image] the detectors take in eval mode;
               the ONNX input is named `images`. NMS and RoiAlign come out as ONNX
               NonMaxSuppression / RoiAlign.

A model that no exporter can handle is skipped, with each exporter's error in the manifest.
OUT_DIR/manifest.json lists per model: status (ok/skipped), exporter, opset, node count, op
counts of interest, input names and shapes, output names, export seconds, errors.
The export is deterministic: fixed seeds, fixed inputs, no data-dependent shapes in the inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
import torch
import torchvision

CLASSIFIERS = ["efficientnet_b0", "mobilenet_v3_small", "mobilenet_v3_large"]
DETECTORS = [
    "ssdlite320_mobilenet_v3_large",
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    "retinanet_resnet50_fpn",
    "maskrcnn_resnet50_fpn",
]
ALL = CLASSIFIERS + DETECTORS
#: Extra constructor kwargs (transform size only; weights stay torchvision's default init).
DETECTOR_KWARGS = {
    "retinanet_resnet50_fpn": {"min_size": 320, "max_size": 320},
    "maskrcnn_resnet50_fpn": {"min_size": 320, "max_size": 320},
}
OPS_OF_INTEREST = ("NonMaxSuppression", "RoiAlign", "TopK", "Resize", "Loop", "If", "Scan")


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name in CLASSIFIERS:
        model = getattr(torchvision.models, name)(weights=None)
    else:
        model = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None,
                                                            **DETECTOR_KWARGS.get(name, {}))
    return model.eval()


def make_input(name: str) -> np.ndarray:
    shape = (1, 3, 224, 224) if name in CLASSIFIERS else (3, 320, 320)  # detectors take a list of CxHxW
    return np.random.default_rng(0).random(shape, dtype=np.float32)


def _clean(target: Path) -> None:
    for p in target.iterdir():
        if p.name.startswith("model.onnx") or p.name == "inputs.npz":
            p.unlink()


def export_torchscript(model: torch.nn.Module, x: torch.Tensor, path: Path, detector: bool) -> dict:
    args = ([x],) if detector else (x,)
    input_names = ["images"] if detector else ["input"]
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17, input_names=input_names,
                          do_constant_folding=True)
    return {"exporter": "torchscript", "opset": 17}


def export_dynamo(model: torch.nn.Module, x: torch.Tensor, path: Path, detector: bool) -> dict:
    args = ([x],) if detector else (x,)
    with torch.no_grad():
        program = torch.onnx.export(model, args, dynamo=True, optimize=True, external_data=True)
    program.save(str(path), external_data=True)
    return {"exporter": "dynamo", "opset": None}


def _count_ops(graph: onnx.GraphProto, ops: dict[str, int]) -> None:
    for node in graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
        for attr in node.attribute:
            for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _count_ops(g, ops)


def export_one(name: str, out_dir: Path) -> dict:
    detector = name in DETECTORS
    target = out_dir / name
    target.mkdir(parents=True, exist_ok=True)
    _clean(target)
    path = target / "model.onnx"
    x_np = make_input(name)
    x = torch.from_numpy(x_np)
    entry: dict = {"name": name, "status": "skipped", "errors": {}}
    order = [export_torchscript, export_dynamo] if detector else [export_dynamo, export_torchscript]
    for exporter in order:
        model = build(name)  # fresh, identically seeded model per attempt
        with torch.no_grad():
            ref = model([x] if detector else x)
        t0 = time.perf_counter()
        try:
            info = exporter(model, x, path, detector)
        except Exception as exc:  # record and try the next exporter
            key = exporter.__name__.removeprefix("export_")
            entry["errors"][key] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
            print(f"{name}: {key} export failed: {entry['errors'][key].splitlines()[0][:300]}", flush=True)
            _clean(target)
            continue
        entry.update(info, status="ok", export_s=round(time.perf_counter() - t0, 2))
        break
    if entry["status"] != "ok":
        return entry
    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in inits]
    if entry["opset"] is None:
        entry["opset"] = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    feeds = {}
    for i in inputs:
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim]
        if len(inputs) != 1 or dims != list(x_np.shape):
            print(f"{name}: input {i.name} has shape {dims}, expected one input of {list(x_np.shape)}", flush=True)
        feeds[i.name] = x_np
    np.savez(target / "inputs.npz", **feeds)
    ops: dict[str, int] = {}
    _count_ops(m.graph, ops)  # If/Loop bodies included: NonMaxSuppression sits in an If branch
    if detector:
        det = ref[1][0] if isinstance(ref, tuple) else ref[0]
        entry["torch_detections"] = {k: list(v.shape) for k, v in det.items()}
    else:
        entry["torch_logits_absmax"] = float(ref.abs().max())
    entry.update(
        nodes=len(m.graph.node),  # main graph
        nodes_with_bodies=sum(ops.values()),
        ops_of_interest={k: ops[k] for k in OPS_OF_INTEREST if k in ops},
        inputs={n: list(v.shape) for n, v in feeds.items()},
        outputs=[o.name for o in m.graph.output],
        files=sorted(p.name for p in target.iterdir()),
    )
    print(f"{name}: {entry['exporter']} opset {entry['opset']}, {entry['nodes']} nodes, "
          f"{entry['ops_of_interest']}, inputs {entry['inputs']}, outputs {entry['outputs']}, "
          f"{entry['export_s']}s", flush=True)
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", nargs="?", default="/work/bench_data/torchvision")
    ap.add_argument("--models", default=",".join(ALL), help="comma-separated subset of: " + ",".join(ALL))
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in ALL]
    if unknown:
        ap.error(f"unknown model(s): {', '.join(unknown)}")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, onnx {onnx.__version__}", flush=True)
    for name in names:
        manifest[name] = export_one(name, out_dir)
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    skipped = [n for n in names if manifest[n]["status"] != "ok"]
    if skipped:
        print(f"skipped: {', '.join(skipped)} (errors in {manifest_path})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
