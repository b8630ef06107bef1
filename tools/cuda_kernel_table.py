"""Regenerate rlx_onnx_amp/data/onnxruntime_cuda_kernels.json from onnxruntime's kernel table.

    python tools/cuda_kernel_table.py OperatorKernels.md --commit SHA [-o rlx_onnx_amp/data/onnxruntime_cuda_kernels.json]

OperatorKernels.md is onnxruntime's generated list of registered kernels per execution provider
(docs/OperatorKernels.md in microsoft/onnxruntime, written by tools/python/gen_opkernel_doc.py).
Only the CUDAExecutionProvider section is read. Each table row gives an op, a version range
(`13+`, `[9, 12]` or `11`) and per type constraint its types; continuation rows (empty op name)
belong to the op above. The JSON keeps, per row, the float element types of each constraint.
The converter uses this snapshot only when the installed onnxruntime has no CUDA kernels of its
own (onnxruntime-gpu's registry is read directly).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

FLOAT_TYPES = ("float", "float16", "bfloat16", "double")
_SECTION = re.compile(r"^## Operators implemented by (\w+)", re.M)
_DOMAIN = re.compile(r"^\|\*\*Operator Domain:\*\* \*([^*]+)\*\|")
_VERSION = re.compile(r"^(?:(\d+)\+|\[(\d+), (\d+)\]|(\d+))$")
_CONSTRAINT = re.compile(r"\*\*([^*]+)\*\* = (.*)")


def parse(text: str, provider: str = "CUDAExecutionProvider") -> list[dict[str, object]]:
    starts = [(m.start(), m.group(1)) for m in _SECTION.finditer(text)]
    bounds = {name: (pos, next((p for p, _ in starts if p > pos), len(text))) for pos, name in starts}
    if provider not in bounds:
        raise SystemExit(f"no section for {provider}")
    begin, end = bounds[provider]
    rows: list[dict[str, object]] = []
    domain: str | None = None
    op: str | None = None
    for line in text[begin:end].splitlines():
        if m := _DOMAIN.match(line):
            domain, op = ("" if m.group(1) == "ai.onnx" else m.group(1)), None
            continue
        cells = line.split("|")
        if len(cells) != 6 or domain is None or not (m := _VERSION.match(cells[3].strip())):
            continue
        op = cells[1].strip() or op
        since = int(m.group(1) or m.group(2) or m.group(4))
        until = None if m.group(1) else int(m.group(3) or m.group(4))
        types = {}
        for part in cells[4].split("<br/>"):
            if c := _CONSTRAINT.search(part):
                names = re.findall(r"(?<!seq\()tensor\((\w+)\)", c.group(2))
                types[c.group(1)] = [t for t in names if t in FLOAT_TYPES]
        rows.append({"domain": domain, "op": op, "since": since, "until": until, "types": types})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("markdown", help="a copy of onnxruntime's docs/OperatorKernels.md")
    ap.add_argument("--commit", required=True, help="the onnxruntime commit the copy was taken at")
    ap.add_argument("-o", "--out", default=str(Path(__file__).resolve().parents[1] / "rlx_onnx_amp/data/onnxruntime_cuda_kernels.json"))
    args = ap.parse_args(argv)
    rows = parse(Path(args.markdown).read_text())
    data = {"source": {"repo": "microsoft/onnxruntime", "path": "docs/OperatorKernels.md", "commit": args.commit},
            "provider": "CUDAExecutionProvider", "kernels": rows}
    text = json.dumps(data, separators=(",", ":")).replace('{"domain"', '\n{"domain"')
    Path(args.out).write_text(text + "\n")
    print(f"{len(rows)} kernel rows, {len({(r['domain'], r['op']) for r in rows})} ops -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
