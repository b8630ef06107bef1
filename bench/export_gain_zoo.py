"""Export the models of bench/gain_zoo.py (random weights; nothing is downloaded).

    python bench/export_gain_zoo.py [--data-dir bench/data/gain_zoo] [--models a,b,...] [--force]
                                    [--tv-python .venv-torchvision/bin/python]

Each model ends up as DATA_DIR/NAME/model.onnx, one file with its weights inline (every model
here is a few MB to ~50 MB), plus DATA_DIR/NAME/meta.json (where it came from). An existing
model.onnx is kept unless --force. The models, by source:

  tv_*    torchvision classifiers, built with weights=None after torch.manual_seed(0), in eval
          mode. They need torch + torchvision, which live in a separate virtual environment
          (`python3 -m venv .venv-torchvision && .venv-torchvision/bin/pip install torch==2.14.1
          torchvision==0.29.1 onnx onnxscript`), run as --tv-python:
          tv_mobilenet_v3_small, tv_efficientnet_b0  bench/export_torchvision.py as it is
                   (its dynamo exporter, input 1x3x224x224, the size that script exports);
          tv_resnet18, tv_squeezenet1_1  models that script does not list: this script run
                   under --tv-python (--tv-child), with that script's export_dynamo (then
                   export_torchscript) at input 1x3x112x112.
  hf_*    fixtures/export_transformers.py's tiny random BERT, GPT-2, Llama (grouped-query
          attention) and ViT (batch 2, sequence 8; ViT 2x3x32x32), the end-to-end test models.
  ovf_*   bench/export_repair_models.py's ConvNeXt and GPT-2, rescaled so activations overflow
          float16 while the float32 outputs stay small (plain always-f16 fails on both).
  demo_transformer  fixtures/models/demo_transformer.onnx, the project's demo block.
  skl_*   skl2onnx (scikit-learn, seeded random data, static batch 16): an MLPRegressor
          (2 hidden layers), an MLPClassifier (3 classes, zipmap off) and a LogisticRegression
          (zipmap off).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_DATA = HERE / "data" / "gain_zoo"
TV_SCRIPT = ("tv_mobilenet_v3_small", "tv_efficientnet_b0")  # through bench/export_torchvision.py
TV_OWN = {"tv_resnet18": 112, "tv_squeezenet1_1": 112}  # through --tv-child: name -> input side
HF = ("hf_bert", "hf_gpt2", "hf_llama_gqa", "hf_vit")
OVF = ("ovf_convnext", "ovf_gpt2")
SKL = ("skl_mlp_reg", "skl_mlp_clf", "skl_logreg")
MODELS = (*TV_SCRIPT, *TV_OWN, *HF, *OVF, "demo_transformer", *SKL)


def _inline(src: Path, dest: Path) -> int:
    """Save src (+ its external data) as one self-contained file; returns its node count."""
    import onnx

    model = onnx.load(str(src), load_external_data=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dest))
    return len(model.graph.node)


def _meta(target: Path, **info: object) -> None:
    (target / "meta.json").write_text(json.dumps(info, indent=2, default=str) + "\n")


# --------------------------------------------------------------------------------------------- sources

def export_torchvision_script(names: list[str], data_dir: Path, tv_python: str) -> None:
    raw = data_dir / "_torchvision"
    tv_names = [n.removeprefix("tv_") for n in names]
    subprocess.run([tv_python, str(HERE / "export_torchvision.py"), str(raw), "--models", ",".join(tv_names)],
                   check=True, cwd=REPO)
    manifest = json.loads((raw / "manifest.json").read_text())
    for name, tv in zip(names, tv_names, strict=True):
        entry = manifest[tv]
        if entry["status"] != "ok":
            print(f"{name}: export failed: {entry['errors']}", flush=True)
            continue
        nodes = _inline(raw / tv / "model.onnx", data_dir / name / "model.onnx")
        _meta(data_dir / name, source="bench/export_torchvision.py", exporter=entry["exporter"], opset=entry["opset"],
              input=entry["inputs"], nodes=nodes)


def export_torchvision_own(names: list[str], data_dir: Path, tv_python: str) -> None:
    for name in names:
        subprocess.run([tv_python, str(Path(__file__).resolve()), "--tv-child", name.removeprefix("tv_"),
                        str(TV_OWN[name]), str(data_dir / name)], check=True, cwd=REPO)


def tv_child(tv_name: str, side: int, target: Path) -> int:
    """Run under --tv-python: export one torchvision classifier with export_torchvision's exporters."""
    import numpy as np
    import torch
    import torchvision

    sys.path.insert(0, str(HERE))
    from export_torchvision import export_dynamo, export_torchscript

    raw = target / "_raw"
    raw.mkdir(parents=True, exist_ok=True)
    x = torch.from_numpy(np.random.default_rng(0).random((1, 3, side, side), dtype=np.float32))
    errors = {}
    for exporter in (export_dynamo, export_torchscript):
        torch.manual_seed(0)
        model = getattr(torchvision.models, tv_name)(weights=None).eval()
        t0 = time.perf_counter()
        try:
            info = exporter(model, x, raw / "model.onnx", False)
        except Exception as exc:  # try the next exporter
            errors[exporter.__name__] = f"{type(exc).__name__}: {exc}"[:2000]
            print(f"tv_{tv_name}: {exporter.__name__} failed: {errors[exporter.__name__][:300]}", flush=True)
            continue
        nodes = _inline(raw / "model.onnx", target / "model.onnx")
        shutil.rmtree(raw)
        _meta(target, source="torchvision " + torchvision.__version__, builder=f"torchvision.models.{tv_name}(weights=None)",
              input=[1, 3, side, side], nodes=nodes, export_s=round(time.perf_counter() - t0, 2), errors=errors, **info)
        print(f"tv_{tv_name}: {info['exporter']}, {nodes} nodes, input 1x3x{side}x{side}", flush=True)
        return 0
    return 1


def export_hf(name: str, data_dir: Path) -> None:
    sys.path.insert(0, str(REPO))
    from fixtures.export_transformers import export_model

    raw = data_dir / "_transformers"
    path, inputs = export_model(name.removeprefix("hf_"), raw)
    nodes = _inline(path, data_dir / name / "model.onnx")
    _meta(data_dir / name, source="fixtures/export_transformers.py", inputs={k: list(v.shape) for k, v in inputs.items()},
          nodes=nodes)


def export_ovf(name: str, data_dir: Path) -> None:
    raw = data_dir / "_repair"
    short = name.removeprefix("ovf_")
    subprocess.run([sys.executable, str(HERE / "export_repair_models.py"), str(raw), "--only", short], check=True, cwd=REPO)
    nodes = _inline(raw / short / "model.onnx", data_dir / name / "model.onnx")
    _meta(data_dir / name, source="bench/export_repair_models.py", nodes=nodes)


def export_demo(data_dir: Path) -> None:
    nodes = _inline(REPO / "fixtures" / "models" / "demo_transformer.onnx", data_dir / "demo_transformer" / "model.onnx")
    _meta(data_dir / "demo_transformer", source="fixtures/models/demo_transformer.onnx", nodes=nodes)


def export_skl(name: str, data_dir: Path) -> None:
    import numpy as np
    import onnx
    import sklearn
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    rng = np.random.default_rng(0)
    n_features = 16
    x = rng.uniform(-1, 1, (512, n_features)).astype(np.float32)
    w = rng.normal(size=n_features)
    options = None
    if name == "skl_mlp_reg":
        y = np.tanh(x @ w) + 0.1 * x[:, 0] ** 2
        model = MLPRegressor(hidden_layer_sizes=(64, 32), max_iter=300, random_state=0).fit(x, y)
    elif name == "skl_mlp_clf":
        y = np.digitize(x @ w, [-1.0, 1.0])
        model = MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=300, random_state=0).fit(x, y)
        options = {id(model): {"zipmap": False}}
    else:
        y = (x @ w > 0).astype(np.int64)
        model = LogisticRegression(max_iter=500, random_state=0).fit(x, y)
        options = {id(model): {"zipmap": False}}
    onx = to_onnx(model, initial_types=[("X", FloatTensorType([16, n_features]))], options=options,
                  target_opset={"": 17, "ai.onnx.ml": 3})
    target = data_dir / name
    target.mkdir(parents=True, exist_ok=True)
    onnx.save(onx, str(target / "model.onnx"))
    _meta(target, source=f"skl2onnx, scikit-learn {sklearn.__version__}", estimator=type(model).__name__,
          trained_on="512 x 16 uniform[-1,1], numpy default_rng(0)", nodes=len(onx.graph.node))


# --------------------------------------------------------------------------------------------- main

def export(names: list[str], data_dir: Path, tv_python: str, force: bool = False) -> list[str]:
    """Export the models whose DATA_DIR/NAME/model.onnx is missing (all with force); returns
    the names still missing afterwards."""
    todo = [n for n in names if force or not (data_dir / n / "model.onnx").exists()]
    data_dir.mkdir(parents=True, exist_ok=True)
    tv_script = [n for n in todo if n in TV_SCRIPT]
    tv_own = [n for n in todo if n in TV_OWN]
    if (tv_script or tv_own) and not Path(tv_python).exists():
        print(f"torchvision models {tv_script + tv_own} need {tv_python}: see this script's docstring", flush=True)
        tv_script = tv_own = []
    steps = []
    if tv_script:
        steps.append(("torchvision", lambda: export_torchvision_script(tv_script, data_dir, tv_python)))
    if tv_own:
        steps.append(("torchvision", lambda: export_torchvision_own(tv_own, data_dir, tv_python)))
    for n in todo:
        if n in HF:
            steps.append((n, lambda n=n: export_hf(n, data_dir)))
        elif n in OVF:
            steps.append((n, lambda n=n: export_ovf(n, data_dir)))
        elif n == "demo_transformer":
            steps.append((n, lambda: export_demo(data_dir)))
        elif n in SKL:
            steps.append((n, lambda n=n: export_skl(n, data_dir)))
    for label, step in steps:
        t0 = time.perf_counter()
        try:
            step()
        except Exception as exc:  # one source failing leaves the others
            print(f"{label}: export failed: {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"{label}: exported in {time.perf_counter() - t0:.1f}s", flush=True)
    return [n for n in names if not (data_dir / n / "model.onnx").exists()]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--tv-child":
        _, name, side, target = argv
        return tv_child(name, int(side), Path(target))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(DEFAULT_DATA))
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of: " + ",".join(MODELS))
    ap.add_argument("--tv-python", default=str(REPO / ".venv-torchvision" / "bin" / "python"))
    ap.add_argument("--force", action="store_true", help="export again even when model.onnx exists")
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"unknown model(s): {', '.join(unknown)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    missing = export(names, Path(args.data_dir), args.tv_python, args.force)
    if missing:
        print(f"missing after export: {', '.join(missing)}", flush=True)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
