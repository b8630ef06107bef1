"""Inputs that fit and exercise the model (issue 50): one size per axis name across inputs, an
RNN's state sized from its X, indices drawn within the axis they index, image sides a multiple of
the model's stride or from ultralytics' metadata_props, defaults a user sends (128 tokens, a 224
image side) and a second size that shows drift growing with length."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp.verification.inputs import InputSpec, synthesized_sets
from rlx_onnx_amp.verification.sizes import model_stride, plan_sizes
from tests.helpers import rlx, run

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(50)


def _model(nodes: list, inputs: list, outputs: list, inits: list, opset: int = 17) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _w(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def lstm_batch_first() -> onnx.ModelProto:
    """A torch batch-first LSTM's export: x [batch, seq, 4] transposed into the LSTM, its states
    h0, c0 [1, batch, 8]: `batch` at axis 0 of one input and axis 1 of the others."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["xt", "W", "R", "B", "", "h0", "c0"], ["", "hn", ""], hidden_size=8),
        helper.make_node("Squeeze", ["hn", "zero"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, ["batch", "seq", 4]),
              helper.make_tensor_value_info("h0", F, [1, "batch", 8]),
              helper.make_tensor_value_info("c0", F, [1, "batch", 8])]
    inits = [_w("W", 1, 32, 4), _w("R", 1, 32, 8), _w("B", 1, 64),
             numpy_helper.from_array(np.array([0], np.int64), "zero")]
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", F, ["batch", 8])], inits)


def gnn() -> onnx.ModelProto:
    """A message-passing layer: node features x [num_nodes, 4], edge_index [2, num_edges] whose
    rows index the rows of h = x @ W (a value, not an input: its rows are x's)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Gather", ["edge_index", "zero"], ["src"], axis=0),
        helper.make_node("Gather", ["edge_index", "one"], ["dst"], axis=0),
        helper.make_node("Gather", ["h", "src"], ["hs"], axis=0),
        helper.make_node("Gather", ["h", "dst"], ["hd"], axis=0),
        helper.make_node("Mul", ["hs", "hd"], ["m"]),
        helper.make_node("ReduceSum", ["m", "axes"], ["score"], keepdims=0),
    ]
    inputs = [helper.make_tensor_value_info("x", F, ["num_nodes", 4]),
              helper.make_tensor_value_info("edge_index", I64, [2, "num_edges"])]
    inits = [_w("W", 4, 8), numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array([1], np.int64), "axes")]
    return _model(nodes, inputs, [helper.make_tensor_value_info("score", F, ["num_edges"])], inits)


def stride32(metadata: dict[str, str] | None = None) -> onnx.ModelProto:
    """A detector's neck in miniature: five stride-2 convs (stride 32), upsampled x32 and
    concatenated with the image: the Concat needs sides that are multiples of 32."""
    nodes, prev = [], "images"
    inits = [numpy_helper.from_array(np.array([1, 1, 32, 32], np.float32), "scales"),
             numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
    for k in range(5):
        inits.append(_w(f"w{k}", 3, 3, 3, 3))
        nodes.append(helper.make_node("Conv", [prev, f"w{k}"], [f"c{k}"], strides=[2, 2], pads=[1, 1, 1, 1]))
        prev = f"c{k}"
    nodes += [helper.make_node("Resize", [prev, "roi", "scales"], ["up"], mode="nearest"),
              helper.make_node("Concat", ["images", "up"], ["out"], axis=1)]
    model = _model(nodes, [helper.make_tensor_value_info("images", F, ["batch", 3, "height", "width"])],
                   [helper.make_tensor_value_info("out", F, ["batch", 6, "height", "width"])], inits)
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    return model


def pooled_score() -> onnx.ModelProto:
    """A score from a sum over the sequence: 300 * sum(x + 1.5) reaches about 58000 at 128
    tokens, within float16 (65504), and about 115000 at 256, past it."""
    nodes = [helper.make_node("Add", ["x", "shift"], ["xs"]),
             helper.make_node("ReduceSum", ["xs", "axes"], ["s"], keepdims=1),
             helper.make_node("Mul", ["s", "k"], ["big"]),
             helper.make_node("Mul", ["big", "small"], ["score"])]
    inits = [numpy_helper.from_array(np.array(1.5, np.float32), "shift"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(np.array(300, np.float32), "k"),
             numpy_helper.from_array(np.array(1e-4, np.float32), "small")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", "sequence"])],
                  [helper.make_tensor_value_info("score", F, ["batch", 1])], inits)


def _convert(tmp_path: Path, model: onnx.ModelProto, *args: str) -> tuple[int, dict, str]:
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(model, str(src))
    result = rlx(src, "-o", out, "--provider", "cpu", "--report-json", report, *args)
    data = json.loads(report.read_text()) if report.exists() else {}
    return result.returncode, data, result.stdout + result.stderr


def test_one_size_per_axis_name_and_rnn_states_follow_x(tmp_path: Path) -> None:
    plan = plan_sizes(lstm_batch_first(), {})
    assert plan.shapes == {"x": (1, 128, 4), "h0": (1, 1, 8), "c0": (1, 1, 8)}
    assert plan.grown == {"x": (1, 256, 4)} and plan.why["x"] == "default batch 1, default sequence 128"
    code, report, text = _convert(tmp_path, lstm_batch_first())
    assert code == 0, text
    verify = report["verify"]
    assert verify["inputs"] == {"x": [1, 128, 4], "h0": [1, 1, 8], "c0": [1, 1, 8]}
    assert verify["inputs_second"]["x"] == [1, 256, 4] and verify["samples"] == 2
    assert "inputs: x 1x128x4 (default batch 1, default sequence 128)" in text and "second size: x 1x256x4" in text


def test_an_rnn_reads_its_states_batch_from_x() -> None:
    """X [seq, unk_x, 4] straight into an LSTM, its states [d, unk_s, h] named otherwise: the
    states take X's batch (the LSTM's layout says which axis), its direction count and hidden_size."""
    model = lstm_batch_first()
    del model.graph.node[0]
    model.graph.node[0].input[0] = "x"
    for vi, names in zip(model.graph.input, (("steps_x", "unk_x", None), ("d", "unk_s", "h"), ("d", "unk_s", "h"))):
        for d, name in zip(vi.type.tensor_type.shape.dim, names):
            if name:
                d.dim_param = name
    plan = plan_sizes(model, {})
    assert plan.shapes == {"x": (128, 1, 4), "h0": (1, 1, 8), "c0": (1, 1, 8)}
    assert synthesized_sets(model, InputSpec())[1]["x"].shape == (256, 1, 4)
    assert np.isfinite(run(model, synthesized_sets(model, InputSpec())[0])[0]).all()


def test_edge_indices_are_drawn_within_the_node_rows(tmp_path: Path) -> None:
    model = gnn()
    first, second = synthesized_sets(model, InputSpec())
    assert first["x"].shape == (64, 4) and first["edge_index"].shape == (2, 64)
    assert second["x"].shape == (128, 4) and second["edge_index"].shape == (2, 128)
    for feeds in (first, second):
        rows = feeds["x"].shape[0]
        assert feeds["edge_index"].min() >= 0 and feeds["edge_index"].max() < rows
        assert feeds["edge_index"].max() >= rows // 2  # the whole range, not {0, 1}
        assert np.isfinite(run(model, feeds)[0]).all()
    code, report, text = _convert(tmp_path, model)
    assert code == 0, text
    assert report["verify"]["inputs"] == {"x": [64, 4], "edge_index": [2, 64]}


def test_image_sides_are_a_multiple_of_the_models_stride(tmp_path: Path) -> None:
    model = stride32()
    assert model_stride(model) == 32
    code, report, text = _convert(tmp_path, model, "-p", "always-f16")
    assert code == 0, text
    verify = report["verify"]
    assert verify["inputs"]["images"] == [1, 3, 224, 224]
    assert verify["inputs_second"]["images"] == [1, 3, 448, 448]
    assert "default image side 224, a multiple of stride 32" in verify["inputs_why"]["images"]
    # 8x8, the guess before: the Concat of the upsampled map (32x32) and the image refuses it
    code, _, text = _convert(tmp_path, model, "-p", "always-f16", "--shape", "images:1x3x8x8")
    assert code == 4 and "onnxruntime" in text


def test_ultralytics_metadata_sizes_the_image(tmp_path: Path) -> None:
    meta = {"imgsz": "[320, 320]", "stride": "32", "task": "detect", "batch": "1"}
    code, report, text = _convert(tmp_path, stride32(meta), "-p", "always-f16")
    assert code == 0, text
    verify = report["verify"]
    assert verify["inputs"]["images"] == [1, 3, 320, 320] and "inputs_second" not in verify
    assert verify["inputs_why"]["images"] == "metadata batch, metadata imgsz"
    assert "images 1x3x320x320 (metadata batch, metadata imgsz)" in text


def test_sizes_that_do_not_run_are_retried(tmp_path: Path) -> None:
    """An image model whose Reshape takes 320x320 only: 224 fails, 320 runs (one reference run
    each); the report says the size chosen."""
    shape = numpy_helper.from_array(np.array([1, 3 * 320 * 320], np.int64), "flat")
    model = _model([helper.make_node("Reshape", ["images", "flat"], ["y"])],
                   [helper.make_tensor_value_info("images", F, ["batch", 3, "height", "width"])],
                   [helper.make_tensor_value_info("y", F, [1, 3 * 320 * 320])], [shape])
    code, report, text = _convert(tmp_path, model, "-p", "always-f16")
    assert code == 0, text
    assert report["verify"]["inputs"]["images"] == [1, 3, 320, 320] and "inputs_second" not in report["verify"]


def test_a_second_size_shows_what_grows_with_length(tmp_path: Path) -> None:
    """The literal f16 conversion of a sum over the sequence: within float16 at 8 and 128 tokens,
    inf at 256, the second size: the plain command's verdict sees it."""
    model = pooled_score()
    literal = ("-p", "always-f16", "--no-screen")
    assert _convert(tmp_path, model, *literal, "--shape", "x:1x8")[0] == 0
    assert _convert(tmp_path, model, *literal, "--shape", "x:1x128")[0] == 0
    code, report, text = _convert(tmp_path, model, *literal)
    assert code == 1, text
    verify = report["verify"]
    assert verify["inputs"]["x"] == [1, 128] and verify["inputs_second"]["x"] == [1, 256]
    assert sum(o["new_inf"] for o in verify["outputs"]) > 0
    # The range screen reads the same two sizes: it keeps the sum in f32.
    code, report, text = _convert(tmp_path, model, "-p", "always-f16")
    assert code == 0, text
    assert {k["code"] for k in report["kept_f32"]} == {"range-screen"}


def test_auto_and_repair_on_inputs_that_cannot_run_exit_as_the_plain_command(tmp_path: Path) -> None:
    """A Conv wider than every length tried: the plain command writes the model unverified (exit
    4) and says to give --shape; `--policy auto` and `--repair` do the same, not exit 2."""
    weight = numpy_helper.from_array(np.full((1, 1, 600), 0.1, np.float32), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", F, [1, 1, "T"])],
                   [helper.make_tensor_value_info("y", F, [1, 1, "U"])], [weight])
    for flags in ((), ("-p", "auto"), ("--repair",)):
        (tmp_path / "o.onnx").unlink(missing_ok=True)
        code, report, text = _convert(tmp_path, model, *flags)
        assert code == 4, (flags, text)
        assert (tmp_path / "o.onnx").exists() and "verify" not in report
        assert "x 1x1x64; x also tried at 1x1x32, 1x1x16, 1x1x8, 1x1x256, 1x1x512" in report["unverified"]
        assert "rlx-amp: next: " in text and "--shape NAME:1x128" in text
    assert _convert(tmp_path, model, "-p", "auto", "--verify")[0] == 2


def voice_activity(with_rate: bool = True) -> onnx.ModelProto:
    """silero-vad's interface in miniature: `input` [?, ?] (no axis names) takes one chunk of 512
    samples (its Reshape), `state` [2, ?, 128] has the chunk's batch in the middle (a Reshape to
    [2, 128] needs it 1), and `sr` is an integer scalar."""
    inputs = [helper.make_tensor_value_info("input", F, [None, None]),
              helper.make_tensor_value_info("state", F, [2, None, 128])]
    nodes = [helper.make_node("Reshape", ["input", "chunk"], ["x"]),
             helper.make_node("Reshape", ["state", "flat_state"], ["s"]),
             helper.make_node("ReduceSum", ["x", "last"], ["xs"]),
             helper.make_node("ReduceSum", ["s", "last"], ["ss"]),
             helper.make_node("Concat", ["xs", "ss"], ["y"], axis=0)]
    inits = [numpy_helper.from_array(np.array([1, 512], np.int64), "chunk"),
             numpy_helper.from_array(np.array([2, 128], np.int64), "flat_state"),
             numpy_helper.from_array(np.array([1], np.int64), "last")]
    if with_rate:
        inputs.append(helper.make_tensor_value_info("sr", I64, []))
        nodes += [helper.make_node("Cast", ["sr"], ["srf"], to=F), helper.make_node("Mul", ["srf", "zero"], ["z"]),
                  helper.make_node("Add", ["y", "z"], ["out"])]
        inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
    else:
        nodes.append(helper.make_node("Identity", ["y"], ["out"]))
    return _model(nodes, inputs, [helper.make_tensor_value_info("out", F, [3, 1])], inits)


def test_a_voice_models_chunk_and_state_fit(tmp_path: Path) -> None:
    """The sweep's silero-vad exports (5 of 60 trained models could not run): with `sr`, the
    waveform is audio (16000 fails, 512 runs) and the state's middle axis is the batch; without
    `sr`, an unnamed axis's retries reach 512 after 64, 32, 16, 8 and 256 fail."""
    for with_rate, why in ((True, "default batch 1, default audio 512"), (False, "default batch 1, default axis 512")):
        code, report, text = _convert(tmp_path, voice_activity(with_rate), "-p", "always-f16")
        assert code == 0, text
        verify = report["verify"]
        assert verify["inputs"]["input"] == [1, 512] and verify["inputs"]["state"] == [2, 1, 128]
        assert verify["inputs_why"]["input"] == why


def test_a_side_under_the_stride_estimate_is_tried_as_it_is() -> None:
    """A text recognizer whose height must stay under 64 while its Conv strides multiply to 64:
    the last retry tries a 32-pixel side as it is, not rounded up to 64."""
    nodes, prev, inits = [], "x", []
    for k in range(6):
        inits.append(_w(f"w{k}", 3, 3, 1, 1))
        nodes.append(helper.make_node("Conv", [prev, f"w{k}"], [f"c{k}"], strides=[2, 2]))
        prev = f"c{k}"
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 3, "height", "width"])],
                   [helper.make_tensor_value_info(prev, F, ["batch", 3, "h", "w"])], inits)
    assert model_stride(model) == 64
    sides = [plan_sizes(model, {}, attempt=k).shapes["x"][2] for k in range(plan_sizes(model, {}).attempts)]
    assert sides == [256, 320, 640, 128, 64, 32]


def test_a_model_past_a_gib_of_weights_takes_one_size() -> None:
    """Past sizes.SECOND_SIZE_WEIGHT_LIMIT of weights (an initializer's dims say so; its data
    is not read) the inputs take one size, and the reason says why: each run at twice the
    tokens would cost more than the conversion (the 3.4 GB Llama-shaped model)."""
    from rlx_onnx_amp.verification.sizes import SECOND_SIZE_WEIGHT_LIMIT

    def ids_model(rows: int) -> onnx.ModelProto:
        table = helper.make_tensor_value_info("table", F, [rows, 4])
        graph = helper.make_graph([helper.make_node("Gather", ["table", "input_ids"], ["y"])], "m",
                                  [helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"]), table],
                                  [helper.make_tensor_value_info("y", F, ["batch", "seq", 4])])
        weights = onnx.TensorProto(name="table", data_type=F, dims=[rows, 4], data_location=onnx.TensorProto.EXTERNAL)
        weights.external_data.add(key="location", value="absent.bin")
        graph.initializer.append(weights)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    light = plan_sizes(ids_model(1000), {})
    assert light.grown == {"input_ids": (1, 256)} and "one size" not in light.why["input_ids"]
    heavy = plan_sizes(ids_model(SECOND_SIZE_WEIGHT_LIMIT // 16 + 1), {})
    assert heavy.shapes == {"input_ids": (1, 128)} and heavy.grown == {}
    assert heavy.why["input_ids"] == "default batch 1, default sequence 128, one size (1.0 GiB of weights)"


def position_table_step() -> onnx.ModelProto:
    """A decoder step whose positions P .. P+S-1 (P past, S new tokens) index a 64-row position
    table, as a learned-position decoder's (Whisper's, GPT-2's) do: it runs only while P + S <= 64."""
    scalar = {n: numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("two", 2), ("one", 1))}
    nodes = [
        helper.make_node("Shape", ["past_key_values.0.key"], ["past_shape"]),
        helper.make_node("Gather", ["past_shape", "two"], ["past"]),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Gather", ["ids_shape", "one"], ["new"]),
        helper.make_node("Add", ["past", "new"], ["end"]),
        helper.make_node("Range", ["past", "end", "one"], ["positions"]),
        helper.make_node("Gather", ["position_table", "positions"], ["pe"]),
        helper.make_node("Gather", ["embedding", "input_ids"], ["te"]),
        helper.make_node("Add", ["te", "pe"], ["h"]),
        helper.make_node("Unsqueeze", ["h", "axis1"], ["hu"]),
        helper.make_node("Concat", ["past_key_values.0.key", "hu"], ["present.0.key"], axis=2),
        helper.make_node("MatMul", ["h", "head"], ["logits"]),
    ]
    inputs = [helper.make_tensor_value_info("input_ids", I64, ["batch", "sequence_length"]),
              helper.make_tensor_value_info("past_key_values.0.key", F, ["batch", 1, "past_sequence_length", 4])]
    outputs = [helper.make_tensor_value_info("logits", F, ["batch", "sequence_length", 100]),
               helper.make_tensor_value_info("present.0.key", F, ["batch", 1, "total_sequence_length", 4])]
    inits = [*scalar.values(), _w("position_table", 64, 4), _w("embedding", 100, 4), _w("head", 4, 100),
             numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    return _model(nodes, inputs, outputs, inits)


def test_a_folders_position_count_bounds_the_guessed_sequence(tmp_path: Path) -> None:
    """The folder's config.json holds 64 positions: the new tokens and the past take 14 each, 28
    at the second size (56 in all, and 8 greedy steps), the task is generate, and the report says
    where the bound came from. Without the config, 128 and 64 fail, 32 runs at one size only (its
    second, 64 + 64, does not), and the greedy loop, past the table, cannot go on: classify."""
    folder = tmp_path / "with-config"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    code, report, text = _convert(folder, position_table_step(), "-p", "always-f16")
    assert code == 0, text
    verify = report["verify"]
    assert verify["inputs"] == {"input_ids": [1, 14], "past_key_values.0.key": [1, 1, 14, 4]}
    assert verify["inputs_second"] == {"input_ids": [1, 28], "past_key_values.0.key": [1, 1, 28, 4]}
    assert "default sequence 14 (within config.json max_position_embeddings 64)" in text
    assert verify["task"]["task"] == "generate" and verify["task"]["passed"], verify["task"]
    code, report, text = _convert(tmp_path, position_table_step(), "-p", "always-f16")
    assert code == 0, text
    verify = report["verify"]
    assert verify["inputs"]["input_ids"] == [1, 32] and "inputs_second" not in verify
    assert verify["task"]["task"] == "classify" and "cannot run" in verify["task"]["chosen_by"], verify["task"]


def test_folder_positions_reads_the_decoders_own_key_beside_or_above_the_model(tmp_path: Path) -> None:
    """Whisper's config holds the decoder's 448 target positions beside the encoder's 1500 source
    ones: the decoder takes the first; a hub repository's onnx/ folder reads its parent's config;
    a model without token ids takes no bound; an unreadable config is no bound either."""
    from rlx_onnx_amp.verification.samples import folder_positions

    (tmp_path / "onnx").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"max_source_positions": 1500, "max_target_positions": 448,
                                                      "max_position_embeddings": 1024}))
    assert folder_positions(position_table_step(), tmp_path / "onnx") == (448, "config.json max_target_positions 448")
    assert folder_positions(lstm_batch_first(), tmp_path) is None
    (tmp_path / "config.json").write_text("{not json")
    assert folder_positions(position_table_step(), tmp_path) is None


def test_an_attention_mask_is_a_tokenizers_padding_not_noise() -> None:
    """`attention_mask [batch, seq]` drawn as a tokenizer pads a batch of prompts: the first set
    all ones, the next with its first quarter padding (and so on, alternating), never a row
    without a token; the ids are drawn as before. An --input-range on it still draws {0, 1}."""
    model = _model([helper.make_node("Gather", ["table", "input_ids"], ["e"]),
                    helper.make_node("Cast", ["attention_mask"], ["m"], to=F),
                    helper.make_node("Unsqueeze", ["m", "last"], ["mu"]),
                    helper.make_node("Mul", ["e", "mu"], ["y"])],
                   [helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"]),
                    helper.make_tensor_value_info("attention_mask", I64, ["batch", "seq"])],
                   [helper.make_tensor_value_info("y", F, ["batch", "seq", 4])],
                   [_w("table", 50, 4), numpy_helper.from_array(np.array([-1], np.int64), "last")])
    first, second = synthesized_sets(model, InputSpec(samples=2, shapes={"input_ids": (1, 16)}))[:2]
    assert first["attention_mask"].tolist() == [[1] * 16]
    assert second["attention_mask"].tolist() == [[0] * 4 + [1] * 12]
    assert first["input_ids"].max() < 50 and not np.array_equal(first["input_ids"], second["input_ids"])
    ranged = synthesized_sets(model, InputSpec(samples=1, ranges={"attention_mask": (0, 2)}))[0]["attention_mask"]
    assert set(np.unique(ranged)) == {0, 1}
