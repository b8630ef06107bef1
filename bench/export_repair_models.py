"""Export the two models of bench/repair_bench.py: random weights, made to overflow float16.

    python bench/export_repair_models.py /work/bench_data/repair [--only convnext,gpt2]

No weights are downloaded: each model is built from a transformers config object after
torch.manual_seed(0), then a few weights are rescaled so that some intermediate activations
exceed float16's largest finite value (65504) while the float32 outputs stay well-behaved, the
way real checkpoints with outlier features fail a plain float16 conversion:

convnext  ConvNextForImageClassification, depths [2, 2, 4, 2], hidden sizes [24, 48, 96, 192],
          layer_scale_init_value 0.5 (trained ConvNeXt layer scales are O(0.1-1); the default
          1e-6 would mute every block), input 1x3x64x64, 10 labels -> `logits`. In stage 2,
          block 1 (an inverted-bottleneck MLP: Linear pwconv1 -> GELU -> Linear pwconv2 ->
          layer scale) pwconv1's weight and bias are multiplied by K = CONVNEXT_SCALE (3e5),
          pwconv2's weight and the layer scale are each divided by sqrt(K). GELU is ~identity
          for large positive inputs and ~0 for large negative ones, so the block's float32
          output is roughly unchanged, but the 4x-wide hidden activation (pwconv1's output and
          the GELU internals) reaches ~2.2e5, past 65504: inf in float16.
convnext_dw  the same ConvNeXt family, larger (depths [2, 2, 6, 2], hidden sizes [32, 64, 128, 256]),
          with the overflow where onnxruntime's CPU provider keeps float16 storage: in stage 2,
          block 1, the depthwise conv's weight and bias are multiplied by CONVNEXT_DW_SCALE
          (1e7), so the block's LayerNormalization input passes 65504 (inf in float16, NaN
          after the LayerNorm) while the LayerNorm itself makes the float32 result scale-free.
          A plain CPU check of the float16 model sees this one.
gpt2      GPT2LMHeadModel, 4 layers, n_embd 128, 4 heads, vocab 1000, 64 positions, eager
          attention, use_cache False, input_ids 1x32 -> `logits`. In block 1's MLP, c_fc (weight
          and bias) is multiplied by GPT2_FC_SCALE (40) and c_proj's weight by GPT2_PROJ_SCALE
          (4e4): the residual stream after block 1 carries components ~1.6e5 (the "massive
          activation" outliers of real LLMs). Every later LayerNorm is scale-invariant, so the
          float32 logits stay sane (max |logits| ~1.1), but in float16 the residual Adds and
          the LayerNorm inputs overflow to inf.

Both export with torch.onnx.export(dynamo=True, optimize=True, external_data=True) and static
shapes; each writes NAME/model.onnx (+ model.onnx.data) and prints the largest |activation|
measured in torch (forward hooks) so the overflow is visible before any ONNX run.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

CONVNEXT_SCALE = 3e5
CONVNEXT_DW_SCALE = 1e7
GPT2_FC_SCALE = 40.0
GPT2_PROJ_SCALE = 4e4


def _max_abs_hook(store: dict[str, float], name: str):
    def hook(_m, _i, out):
        t = out[0] if isinstance(out, tuple) else out
        if hasattr(t, "abs"):
            store[name] = max(store.get(name, 0.0), float(t.detach().abs().max()))
    return hook


def _convnext(depths: list[int], hidden_sizes: list[int], rescale):
    """A ConvNeXt classifier from config (seed 0); `rescale(block)` edits stage 2, block 1."""
    import torch
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(0)
    config = ConvNextConfig(num_channels=3, depths=depths, hidden_sizes=hidden_sizes, num_labels=10,
                            image_size=64, layer_scale_init_value=0.5)
    model = ConvNextForImageClassification(config).eval()
    if rescale is not None:
        with torch.no_grad():
            rescale(model.convnext.encoder.stages[2].layers[1])
    torch.manual_seed(1)
    example = (torch.rand(1, 3, 64, 64) * 2 - 1,)
    return model, example, ["pixel_values"], ["logits"], lambda m, x: m(pixel_values=x).logits


def _scale_mlp(layer) -> None:
    layer.pwconv1.weight.mul_(CONVNEXT_SCALE)
    layer.pwconv1.bias.mul_(CONVNEXT_SCALE)
    layer.pwconv2.weight.div_(CONVNEXT_SCALE ** 0.5)
    layer.layer_scale_parameter.div_(CONVNEXT_SCALE ** 0.5)


def _scale_dwconv(layer) -> None:
    layer.dwconv.weight.mul_(CONVNEXT_DW_SCALE)
    layer.dwconv.bias.mul_(CONVNEXT_DW_SCALE)


def build_convnext(scale: bool = True):
    return _convnext([2, 2, 4, 2], [24, 48, 96, 192], _scale_mlp if scale else None)


def build_convnext_dw(scale: bool = True):
    return _convnext([2, 2, 6, 2], [32, 64, 128, 256], _scale_dwconv if scale else None)


def build_gpt2(scale: bool = True):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=4, n_head=4, use_cache=False)
    with contextlib.suppress(Exception):
        config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config).eval()
    if scale:
        with torch.no_grad():
            mlp = model.transformer.h[1].mlp
            mlp.c_fc.weight.mul_(GPT2_FC_SCALE)
            mlp.c_fc.bias.mul_(GPT2_FC_SCALE)
            mlp.c_proj.weight.mul_(GPT2_PROJ_SCALE)
    torch.manual_seed(1)
    example = (torch.randint(0, 1000, (1, 32), dtype=torch.int64),)
    return model, example, ["input_ids"], ["logits"], lambda m, x: m(input_ids=x, use_cache=False).logits


BUILDERS = {"convnext": build_convnext, "convnext_dw": build_convnext_dw, "gpt2": build_gpt2}


def export(name: str, out_dir: Path, control: bool = False) -> Path:
    import torch

    model, example, input_names, output_names, call = BUILDERS[name](scale=not control)

    class Wrapper(torch.nn.Module):
        def __init__(self, m: torch.nn.Module) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return call(self.m, x)

    wrapped = Wrapper(model).eval()
    stats: dict[str, float] = {}
    handles = [m.register_forward_hook(_max_abs_hook(stats, n)) for n, m in model.named_modules() if n]
    with torch.no_grad():
        ref = wrapped(*example)
    for h in handles:
        h.remove()
    top = max((v, k) for k, v in stats.items())
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params; "
          f"{sum(v > 65504 for v in stats.values())} modules with |output| > 65504, largest {top[0]:.3g} ({top[1]}); "
          f"max |logits| {float(ref.abs().max()):.3g}", flush=True)
    target = out_dir / (name + "_control" if control else name)
    target.mkdir(parents=True, exist_ok=True)
    path = target / "model.onnx"
    for p in (path, path.with_name(path.name + ".data")):
        p.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with torch.no_grad():
        program = torch.onnx.export(wrapped, example, dynamo=True, input_names=input_names, output_names=output_names,
                                    optimize=True, external_data=True)
    program.save(str(path), external_data=True)
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    ops: dict[str, int] = {}
    for node in m.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    print(f"{name}: exported {path} in {time.perf_counter() - t0:.1f}s: {len(m.graph.node)} nodes; "
          + ", ".join(f"{k}={v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])), flush=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--only", default="convnext,convnext_dw,gpt2")
    ap.add_argument("--control", action="store_true",
                    help="export without the rescaling, to NAME_control/ (shows the f16 failure comes from it)")
    args = ap.parse_args(argv)
    for name in args.only.split(","):
        export(name, Path(args.out_dir), control=args.control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
