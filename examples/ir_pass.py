"""rlx-amp's MixedPrecisionPass in an onnx-ir pipeline (pip install 'rlx-onnx-amp[ir,export]').

    python examples/ir_pass.py

1. A torch module exported with torch.onnx's dynamo exporter: its `ONNXProgram.model` is an
   `onnx_ir.Model`, converted in place and run with onnxruntime.
2. A model file with external data: `ir.load` → the pass → `ir.save`, the weights read, narrowed
   and written one tensor at a time. Writes mlp.onnx(.data) and mlp.f16.onnx(.data) here.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common
import onnxruntime as ort
import torch

from rlx_onnx_amp.ir import MixedPrecisionPass

# ---- 1. a dynamo export ---------------------------------------------------------------------
torch.manual_seed(0)
module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 4))
x = torch.randn(2, 16)
model = torch.onnx.export(module.eval(), (x,), dynamo=True, verbose=False).model

result = ir.passes.PassManager([MixedPrecisionPass(policy="always-f16")])(model)
session = ort.InferenceSession(ir.to_proto(result.model).SerializeToString(), providers=["CPUExecutionProvider"])
(y,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
drift = float(np.abs(y - module(x).detach().numpy()).max())
print(f"dynamo export: modified={result.modified}, max |f16 - f32| = {drift:.2e}")

# ---- 2. ir.load → pass → ir.save, with external data ----------------------------------------
rng = np.random.default_rng(0)
w1 = onnx.numpy_helper.from_array(rng.standard_normal((256, 256), dtype=np.float32) * 0.05, "w1")
w2 = onnx.numpy_helper.from_array(rng.standard_normal((256, 64), dtype=np.float32) * 0.05, "w2")
graph = onnx.helper.make_graph(
    [onnx.helper.make_node("MatMul", ["x", "w1"], ["h"]), onnx.helper.make_node("Relu", ["h"], ["r"]),
     onnx.helper.make_node("MatMul", ["r", "w2"], ["y"])],
    "mlp", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 256])],
    [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])], [w1, w2])
onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), "mlp.onnx",
          save_as_external_data=True, location="mlp.onnx.data")

model = ir.load("mlp.onnx")  # weights stay on disk (mmap'd ExternalTensors)
passes = ir.passes.PassManager([
    onnx_ir.passes.common.ShapeInferencePass(),  # the pass requires every value's type known
    MixedPrecisionPass(policy="always-f16"),
])
result = passes(model)
ir.save(result.model, "mlp.f16.onnx", external_data="mlp.f16.onnx.data")  # streams the narrowed weights
dtypes = sorted({v.dtype.name for v in result.model.graph.initializers.values() if v.dtype is not None})
print(f"external data: modified={result.modified}, weights {dtypes}")
