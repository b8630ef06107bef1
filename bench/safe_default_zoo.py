"""What the safe default costs on a zoo of real architectures: the old plain command (the
previous release, `--verify`) against the new one (screened and verified by default), per model
and policy.

    python3 bench/safe_default_zoo.py --export /work/zoo          # export the zoo (once)
    python3 bench/safe_default_zoo.py /work/zoo --base /tmp/base  # the sweep
          [--policy auto-mixed --policy always-f16] [--target cpu] [--json bench/out/safe_default_zoo.json]

`--export DIR` writes about a dozen tiny random-weight models (torch.manual_seed(0), configs
only, nothing downloaded) with the torch dynamo exporter, static shapes, as DIR/NAME.onnx
(+ NAME.onnx.data): BERT, GPT-2, Llama (GQA), ViT and the Whisper encoder come from
fixtures/export_transformers.py; DistilBERT, RoBERTa, Qwen2, the T5 encoder, T5 (encoder and
decoder), wav2vec2, ConvNeXt, Swin and MobileViT are built here the same way. For contrast, three
models that are not healthy today: `bert_dynquant` (a 128-wide BERT through onnxruntime's
quantize_dynamic, as in tests/test_safe_default_exports.py) and bench/export_repair_models.py's
f16-overflowing ConvNeXt and GPT-2 (DIR/outlier/NAME/model.onnx, named outlier/NAME).

The sweep runs, for each DIR/*.onnx and each policy, in a scratch directory outside the
repository (and with the cwd there, so neither tree shadows the import):

  old  `PYTHONPATH=BASE python3 -m rlx_onnx_amp MODEL --policy P --target T -o OUT --verify --report-json R`
  new  `python3 -m rlx_onnx_amp MODEL --policy P --target T -o OUT --report-json R`

BASE is a checkout of the previous release (default /tmp/base). Per model it reports: old
verify passed, new verify passed, the new exit code, the low-precision nodes (report
`nodes.nodes.by_precision`, f16 + bf16) old and new and their ratio, and the new kept nodes by rule
code (report `by_rule`, the codes that are not in the old report). A model that converts healthy
today (old --verify passes) should keep at least 95% of its low-precision nodes; every such
model under 95% is listed with the nodes the new rules kept (`kept_f32[]`: node, op, code,
reason). Prints a table and writes everything as JSON. `--arg FLAG` (repeatable) is passed to
both commands, e.g. `--arg=--seed --arg=1` or `--arg=--samples --arg=16` to see how the screen
moves with the synthesized inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NEW_CODES = ("dequantize-arithmetic", "weight-range", "range-screen")
THRESHOLD = 0.95

# --------------------------------------------------------------------------------------------
# The zoo
SEED = 0
BATCH, SEQ, VOCAB = 2, 8, 128


def _text(salt: int):
    import numpy as np

    rng = np.random.default_rng(2000 + salt)
    ids = rng.integers(0, VOCAB, size=(BATCH, SEQ), dtype=np.int64)
    mask = np.ones((BATCH, SEQ), dtype=np.int64)
    mask[1, SEQ - 3:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _image(salt: int, size: int = 32):
    import numpy as np

    return {"pixel_values": np.random.default_rng(2000 + salt).standard_normal((BATCH, 3, size, size)).astype(np.float32)}


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    return DistilBertModel(DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                            max_position_embeddings=64)), _text(1), ["last_hidden_state"]


def _roberta():
    from transformers import RobertaConfig, RobertaModel

    return RobertaModel(RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=64, type_vocab_size=1,
                                      pad_token_id=1)), _text(2), ["last_hidden_state", "pooler_output"]


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        use_cache=False, tie_word_embeddings=False)), _text(3), ["logits"]


def _t5_encoder():
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=8, use_cache=False)), _text(4), ["last_hidden_state"]


def _t5():
    import numpy as np
    from transformers import T5Config, T5Model

    inputs = _text(9)
    inputs["decoder_input_ids"] = np.random.default_rng(2009).integers(0, VOCAB, size=(BATCH, 4), dtype=np.int64)
    return T5Model(T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                            num_heads=4, relative_attention_num_buckets=8, use_cache=False,
                            decoder_start_token_id=0)), inputs, ["last_hidden_state"]


def _wav2vec2():
    import numpy as np
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                         conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                         num_conv_pos_embedding_groups=4, feat_extract_norm="group", do_stable_layer_norm=False,
                         mask_time_prob=0.0)
    x = np.random.default_rng(2005).standard_normal((BATCH, 1600)).astype(np.float32)
    return Wav2Vec2Model(cfg), {"input_values": x}, ["last_hidden_state"]


def _convnext():
    from transformers import ConvNextConfig, ConvNextModel

    return ConvNextModel(ConvNextConfig(num_channels=3, depths=[1, 1, 2, 1], hidden_sizes=[8, 16, 32, 64],
                                        image_size=32)), _image(6), ["last_hidden_state", "pooler_output"]


def _swin():
    from transformers import SwinConfig, SwinModel

    return SwinModel(SwinConfig(image_size=32, patch_size=2, num_channels=3, embed_dim=16, depths=[2, 2],
                                num_heads=[2, 4], window_size=4)), _image(7), ["last_hidden_state", "pooler_output"]


def _mobilevit():
    from transformers import MobileViTConfig, MobileViTModel

    cfg = MobileViTConfig(image_size=64, num_channels=3, hidden_sizes=[16, 24, 32],
                          neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2, patch_size=2)
    return MobileViTModel(cfg), _image(8, 64), ["last_hidden_state", "pooler_output"]


LOCAL = {"distilbert": _distilbert, "roberta": _roberta, "qwen2": _qwen2, "t5_encoder": _t5_encoder, "t5": _t5,
         "wav2vec2": _wav2vec2, "convnext": _convnext, "swin": _swin, "mobilevit": _mobilevit}
FROM_FIXTURES = ("bert", "gpt2", "llama_gqa", "vit", "whisper_encoder")
#: Not healthy today, for contrast: bench/export_repair_models.py's outlier models (f16 overflows
#: by construction), in DIR/outlier/NAME/model.onnx, and a BERT 128 wide quantized by
#: onnxruntime's quantize_dynamic (QUInt8 weights, MatMul only), as in
#: tests/test_safe_default_exports.py.
OUTLIERS = ("convnext", "gpt2")
EXTRA = ("bert_dynquant", *(f"outlier/{n}" for n in OUTLIERS))


def _bert_dynquant(out_dir: Path) -> Path:
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import BertConfig, BertModel

    from fixtures import export_transformers as ft

    torch.manual_seed(SEED)
    model = BertModel(BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=512, max_position_embeddings=64, type_vocab_size=2))
    scratch = Path(tempfile.mkdtemp(prefix="rlx-amp-zoo-export-"))
    try:
        f32 = ft._export(model, ft.bert_inputs(), scratch / "bert.onnx", ["last_hidden_state", "pooler_output"])
        target = out_dir / "bert_dynquant.onnx"
        quantize_dynamic(str(f32), str(target), weight_type=QuantType.QUInt8, op_types_to_quantize=["MatMul"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def export_zoo(out_dir: Path, only: list[str] | None = None) -> None:
    sys.path.insert(0, str(REPO))
    import torch

    from fixtures import export_transformers as ft

    ft._quiet_transformers()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in [*FROM_FIXTURES, *LOCAL, *EXTRA]:
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            if name in FROM_FIXTURES:
                path, _ = ft.export_model(name, out_dir)
            elif name == "bert_dynquant":
                path = _bert_dynquant(out_dir)
            elif name.startswith("outlier/"):
                sys.path.insert(0, str(REPO / "bench"))
                import export_repair_models

                path = export_repair_models.export(name.split("/", 1)[1], out_dir / "outlier")
            else:
                torch.manual_seed(SEED)
                model, inputs, outputs = LOCAL[name]()
                path = ft._export(model, inputs, out_dir / f"{name}.onnx", outputs)
        except Exception as exc:  # one architecture failing to export skips it
            print(f"{name:16s} export failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        print(f"{name:16s} {time.perf_counter() - t0:6.1f}s  {path}", flush=True)


# --------------------------------------------------------------------------------------------
# The sweep
def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=900)
    return done.returncode, time.perf_counter() - t0, (done.stderr or "")[-1500:]


def _low(report: dict) -> int:
    by = report.get("nodes", {}).get("by_precision", {})
    return int(by.get("f16", 0)) + int(by.get("bf16", 0))


def _passed(report: dict) -> bool | None:
    v = report.get("verify")
    if isinstance(v, list):  # one entry per model in some layouts
        v = v[0] if v else None
    return None if not isinstance(v, dict) else v.get("passed")


def model_name(model: Path, root: Path) -> str:
    """DIR/bert.onnx -> bert; DIR/outlier/gpt2/model.onnx -> outlier/gpt2."""
    rel = model.relative_to(root)
    return str(rel.parent) if rel.name == "model.onnx" and rel.parent != Path(".") else str(rel.with_suffix(""))


def sweep_one(model: Path, root: Path, policy: str, target: str, base: Path, work: Path,
              both: list[str] | None = None) -> dict:
    env_new = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env_old = {**env_new, "PYTHONPATH": str(base)}
    name = model_name(model, root)
    row: dict = {"model": name, "policy": policy}
    reports = {}
    for which, env, extra in (("old", env_old, ["--verify"]), ("new", env_new, [])):
        stem = name.replace("/", "_")
        out, rep = work / f"{stem}.{policy}.{which}.onnx", work / f"{stem}.{policy}.{which}.json"
        rep.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "rlx_onnx_amp", str(model), "--policy", policy, "--target", target,
               "-o", str(out), "-q", "--report-json", str(rep), *extra, *(both or [])]
        rc, secs, err = _run(cmd, env, work)
        report = json.loads(rep.read_text()) if rep.is_file() else {}
        reports[which] = report
        row[f"{which}_exit"] = rc
        row[f"{which}_seconds"] = round(secs, 2)
        row[f"{which}_passed"] = _passed(report)
        row[f"{which}_low"] = _low(report)
        if rc not in (0, 1) or not report:
            row[f"{which}_stderr"] = err
    old_codes = Counter(k["code"] for k in reports["old"].get("kept_f32", []))
    new_kept = reports["new"].get("kept_f32", [])
    row["new_by_rule"] = {c: n for c, n in Counter(k["code"] for k in new_kept).items() if c in NEW_CODES}
    row["old_by_rule"] = dict(old_codes)
    row["ratio"] = round(row["new_low"] / row["old_low"], 4) if row["old_low"] else None
    row["new_kept"] = [k for k in new_kept if k.get("code") in NEW_CODES]
    row["new_verify"] = {k: reports["new"].get("verify", {}).get(k) for k in ("passed", "inputs", "outputs")
                         if isinstance(reports["new"].get("verify"), dict)}
    return row


def _fmt(v: object) -> str:
    return {True: "yes", False: "NO", None: "-"}.get(v, str(v)) if isinstance(v, bool) or v is None else str(v)


def print_table(rows: list[dict]) -> None:
    head = f"{'model':20s} {'policy':11s} {'old pass':>8s} {'new pass':>8s} {'new rc':>6s} {'low old→new':>13s} " \
           f"{'ratio':>6s}  kept by rule (new)"
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        rules = ", ".join(f"{c} {n}" for c, n in sorted(r["new_by_rule"].items())) or "-"
        print(f"{r['model']:20s} {r['policy']:11s} {_fmt(r['old_passed']):>8s} {_fmt(r['new_passed']):>8s} "
              f"{r['new_exit']:>6d} {str(r['old_low']) + '→' + str(r['new_low']):>13s} {ratio:>6s}  {rules}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="?", help="directory of .onnx models")
    ap.add_argument("--export", metavar="DIR", help="export the zoo to DIR and stop")
    ap.add_argument("--only", default="", help="comma-separated model names (export and sweep)")
    ap.add_argument("--base", default="/tmp/base", help="checkout of the previous release (PYTHONPATH of the old run)")
    ap.add_argument("--policy", action="append", help="repeatable; default auto-mixed and always-f16")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--arg", action="append", default=[], metavar="FLAG",
                    help="extra flag for both commands, repeatable (e.g. --arg=--seed --arg=1)")
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "safe_default_zoo.json"))
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    if args.export:
        export_zoo(Path(args.export), only or None)
        return 0
    if not args.models:
        ap.error("give a directory of models, or --export DIR")
    base = Path(args.base).resolve()
    if not (base / "rlx_onnx_amp" / "__init__.py").is_file():
        ap.error(f"--base {base}: no rlx_onnx_amp package there")
    policies = args.policy or ["auto-mixed", "always-f16"]
    root = Path(args.models).resolve()
    models = sorted((p for p in root.rglob("*.onnx") if not only or model_name(p, root) in only),
                    key=lambda p: model_name(p, root))
    work = Path(tempfile.mkdtemp(prefix="rlx-amp-zoo-"))
    rows: list[dict] = []
    try:
        for model in models:
            for policy in policies:
                rows.append(sweep_one(model, root, policy, args.target, base, work, args.arg))
                r = rows[-1]
                print(f"# {r['model']} {policy}: old rc {r['old_exit']} ({r['old_seconds']} s), "
                      f"new rc {r['new_exit']} ({r['new_seconds']} s)", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    under = [r for r in rows if r["old_passed"] and r["ratio"] is not None and r["ratio"] < THRESHOLD]
    print(f"\nhealthy today (old --verify passes) and under {THRESHOLD:.0%} of the low-precision nodes: "
          + (", ".join(f"{r['model']}/{r['policy']} ({r['ratio']:.3f})" for r in under) or "none"))
    for r in under:
        print(f"  {r['model']} {r['policy']}: kept by the new rules:")
        for k in r["new_kept"]:
            print(f"    {k.get('code'):22s} {k.get('op', k.get('op_type', '')):14s} {k.get('node', k.get('name', ''))}: "
                  f"{str(k.get('reason', ''))[:160]}")
    result = {"policies": policies, "target": args.target, "base": str(base), "threshold": THRESHOLD,
              "command": " ".join(["python3", "bench/safe_default_zoo.py", *(argv if argv is not None else sys.argv[1:])]),
              "under_threshold": [f"{r['model']}/{r['policy']}" for r in under], "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
