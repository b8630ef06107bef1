"""Model-Optimizer's AutoCast for bench/gain_zoo.py, run in AutoCast's own environment.

    PY bench/autocast_child.py convert MODEL OUT RESULT.json [CALIBRATION.npz]
    PY bench/autocast_child.py check OUT FEEDS.npz RESULT.json

PY is a Python with `nvidia-modelopt` (no extras), `onnxruntime~=1.24`, `onnx-graphsurgeon`,
`polygraphy`, `onnxscript`, `onnxconverter-common` and CPU torch (modelopt's `[onnx]` extra pins
onnxruntime-gpu and cupy, so it gets a venv of its own; see bench/gain_zoo.py). Nothing here
imports rlx_onnx_amp: that environment does not have it.

convert  modelopt.onnx.autocast.convert_to_mixed_precision(onnx_path=MODEL) with every option at
         its default (fp16, keep_io_types=False, data_max=512, init_max=65504, providers=["cpu"]:
         its reference run is onnxruntime's CPU provider), plus calibration_data=CALIBRATION when
         given (without it AutoCast draws its own inputs: Polygraphy's DataLoader, values in
         [-1, 1]); saved with modelopt.onnx.utils.save_onnx, as its command line does. RESULT
         gets the versions, the seconds of modelopt's import and of the conversion, its
         "Converted X/Y nodes" line and the nodes it logged as skipped (kept f32), with the
         reason it logged, grouped.
check    whether OUT loads in onnxruntime (CPU provider) and runs on FEEDS (float feeds cast to
         the types OUT declares for its inputs: AutoCast's default makes them float16); RESULT
         gets loaded, ran, the error and per output its type and whether it is all finite.

Exit 0 when the step did what it does, 1 when it raised (the error in RESULT).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

SKIP = re.compile(r"Skipping node (?P<node>.+?): (?P<why>.*)")
# "initializer W out of range: ..." / "reference IO out of range: ..." / a rule's class name
REASON = re.compile(r"^(?:initializer \S+ (?P<init>out of range)|(?P<io>reference IO out of range)|"
                    r"(?P<depth>depth of reduction)|(?P<rule>\w+))")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _reason(why: str) -> str:
    m = REASON.match(why)
    if not m:
        return why[:60]
    if m["init"]:
        return "initializer out of range"
    return m["io"] or m["depth"] or m["rule"]


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for pkg in ("nvidia-modelopt", "onnxruntime", "onnx", "polygraphy", "onnx-graphsurgeon", "numpy", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def convert(model: str, out: str, result: str, calibration: str | None) -> int:
    res: dict[str, Any] = {"versions": _versions(), "calibration_data": calibration}
    collect = _Collect()
    t0 = time.perf_counter()
    try:
        from modelopt.onnx import utils as onnx_utils
        from modelopt.onnx.autocast.convert import convert_to_mixed_precision
        from modelopt.onnx.autocast.logging_config import logger

        logger.addHandler(collect)
        res["import_s"] = round(time.perf_counter() - t0, 3)  # modelopt's import: most of it on small models
        t0 = time.perf_counter()
        converted = convert_to_mixed_precision(onnx_path=model, calibration_data=calibration)
        res["convert_s"] = round(time.perf_counter() - t0, 3)
        onnx_utils.save_onnx(converted, out)
        res["status"] = "ok"
    except Exception as e:  # the bench records AutoCast's error as its result for this model
        res.update(status="error", error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-3000:])
    skipped = [m.groupdict() for m in map(SKIP.match, collect.lines) if m]
    res["skipped"] = dict(Counter(_reason(s["why"]) for s in skipped))
    res["skipped_nodes"] = [[s["node"], s["why"][:200]] for s in skipped[:200]]
    res["converted_line"] = next((ln for ln in collect.lines if ln.startswith("Converted ")), None)
    Path(result).write_text(json.dumps(res, indent=2) + "\n")
    return 0 if res["status"] == "ok" else 1


def check(out: str, feeds_path: str, result: str) -> int:
    import numpy as np
    import onnxruntime as ort

    res: dict[str, Any] = {"loaded": False, "ran": False, "onnxruntime": ort.__version__}
    to_np = {"tensor(float16)": np.float16, "tensor(float)": np.float32, "tensor(double)": np.float64}
    try:
        sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
        res["loaded"] = True
        with np.load(feeds_path) as npz:
            raw = {k: npz[k] for k in npz.files}
        feeds = {}
        for i in sess.get_inputs():
            v = raw[i.name]
            dtype = to_np.get(i.type)
            feeds[i.name] = v.astype(dtype) if dtype is not None and v.dtype.kind == "f" else v
        res["input_types"] = {i.name: i.type for i in sess.get_inputs()}
        outs = sess.run(None, feeds)
        res["ran"] = True
        res["outputs"] = {o.name: {"type": o.type, "all_finite": bool(np.isfinite(v).all())
                                   if isinstance(v, np.ndarray) and v.dtype.kind == "f" else None}
                          for o, v in zip(sess.get_outputs(), outs)}
    except Exception as e:  # a model onnxruntime refuses or cannot run is this check's answer
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
    Path(result).write_text(json.dumps(res, indent=2) + "\n")
    return 0 if res["ran"] else 1


def main(argv: list[str]) -> int:
    if len(argv) in (4, 5) and argv[0] == "convert":
        return convert(argv[1], argv[2], argv[3], argv[4] if len(argv) == 5 else None)
    if len(argv) == 4 and argv[0] == "check":
        return check(argv[1], argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
