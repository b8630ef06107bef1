"""Export a ~0.85B-parameter Llama-shaped model with random weights to ONNX (external data).

No weights are downloaded: the model is built from a LlamaConfig and randomly initialised.
The export uses torch's dynamo exporter with use_cache=False (no past key values), float32,
under torch.no_grad(), and writes OUT_DIR/llama.onnx + OUT_DIR/llama.onnx.data.

    python bench/export_llama.py /work/bench_data/llama [--layers 16]

Defaults: hidden 2048, 16 layers, 32 heads / 8 kv heads (GQA), intermediate 5632, vocab 32000,
untied embeddings: 852.7M parameters, ~3.41 GB of float32 weights.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import sys
import time
from pathlib import Path


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=16, help="example sequence length (dynamic in the export)")
    ap.add_argument("--no-optimize", action="store_true", help="skip onnxscript's graph optimisation")
    args = ap.parse_args(argv)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "llama.onnx"

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        use_cache=False,
        torch_dtype="float32",
    )
    with contextlib.suppress(Exception):
        config._attn_implementation = "eager"  # sdpa also exports; eager gives the plain op pattern

    t0 = time.perf_counter()
    with torch.no_grad():
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())
    t_build = time.perf_counter() - t0
    print(f"built LlamaForCausalLM: {n_params / 1e6:.1f}M params, {n_params * 4 / 1e9:.2f} GB f32 "
          f"in {t_build:.1f}s (peak RSS {_rss_mb():.0f} MB)", flush=True)

    seq = torch.export.Dim("seq", min=2, max=2048)
    batch = torch.export.Dim("batch", min=1, max=64)
    input_ids = torch.randint(0, args.vocab, (2, args.seq), dtype=torch.int64)
    attention_mask = torch.ones((2, args.seq), dtype=torch.int64)

    class Wrapper(torch.nn.Module):
        """input_ids, attention_mask -> logits; no cache."""

        def __init__(self, m: torch.nn.Module) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    wrapped = Wrapper(model).eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        program = torch.onnx.export(
            wrapped,
            (input_ids, attention_mask),
            dynamo=True,
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
            optimize=not args.no_optimize,
            external_data=True,
        )
    t_export = time.perf_counter() - t0
    print(f"dynamo export (trace + translate{' + optimize' if not args.no_optimize else ''}): {t_export:.1f}s "
          f"(peak RSS {_rss_mb():.0f} MB)", flush=True)

    t0 = time.perf_counter()
    for p in (out, out.with_name(out.name + ".data")):
        p.unlink(missing_ok=True)
    program.save(str(out), external_data=True)
    t_save = time.perf_counter() - t0
    del program
    gc.collect()
    data = out.with_name(out.name + ".data")
    size_model = out.stat().st_size
    size_data = data.stat().st_size if data.exists() else 0
    print(f"saved {out} ({size_model / 1e6:.2f} MB) + {data.name} ({size_data / 1e9:.3f} GB) in {t_save:.1f}s", flush=True)

    import onnx

    m = onnx.load(str(out), load_external_data=False)
    ops: dict[str, int] = {}
    for node in m.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    n_init = sum(1 for _ in m.graph.initializer)
    print(f"graph: {len(m.graph.node)} nodes, {n_init} initializers, opset "
          f"{[(o.domain or 'ai.onnx', o.version) for o in m.opset_import]}")
    print("ops:", ", ".join(f"{k}={v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])))
    print(f"TOTAL export time (build + export + save): {t_build + t_export + t_save:.1f}s; "
          f"peak RSS {_rss_mb():.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
