"""An export directory as one unit (`rlx-amp EXPORT_DIR -o OUT_DIR`): every model converted,
every other file copied, written whole or not at all, the caches' types one across files; and
the clients users load such directories with, run on what rlx-amp wrote: onnxruntime-genai on
the committed builder folder (fixtures/models/genai-llama, made by fixtures/export_genai.py),
optimum's ORTModelFor* on folders fixtures/export_optimum.py exports in its own environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp.directory import scan_export_dir
from tests.helpers import rlx, write_wav

REPO = Path(__file__).resolve().parent.parent
GENAI = REPO / "fixtures" / "models" / "genai-llama"
F, H = TensorProto.FLOAT, TensorProto.FLOAT16
#: The genai Llama's cache head size (2 KV heads of 16) is a symbolic axis: given, with 4 past
#: positions; its attention_mask and the new positions are then synthesized coherent.
GENAI_SHAPES = [f"--shape=past_key_values.{i}.{kv}:1x2x4x16" for i in (0, 1) for kv in ("key", "value")]


def _decoder() -> onnx.ModelProto:
    """A toy decoder step: logits from x, present.0.key = Concat(past_key_values.0.key, k)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["k"]), helper.make_node("Relu", ["k"], ["logits"]),
             helper.make_node("Mul", ["past_key_values.0.key", "half"], ["past_half"]),
             helper.make_node("Concat", ["past_half", "k"], ["present.0.key"], axis=0)]
    graph = helper.make_graph(
        nodes, "decoder",
        [helper.make_tensor_value_info("x", F, [1, 64]), helper.make_tensor_value_info("past_key_values.0.key", F, [2, 64])],
        [helper.make_tensor_value_info("logits", F, [1, 64]), helper.make_tensor_value_info("present.0.key", F, [3, 64])],
        [w, numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _export_dir(tmp_path: Path) -> Path:
    export = tmp_path / "export"
    (export / "onnx").mkdir(parents=True)
    onnx.save(_decoder(), str(export / "decoder_model.onnx"), save_as_external_data=True,
              location="decoder_model.onnx_data", size_threshold=0)
    encoder = _decoder()
    onnx.save(encoder, str(export / "onnx" / "encoder_model.onnx"))
    (export / "config.json").write_text('{"model_type": "toy"}\n')
    (export / "tokenizer.json").write_text('{"version": "1.0"}\n')
    return export


def test_a_directory_converts_as_a_unit(tmp_path: Path) -> None:
    export = _export_dir(tmp_path)
    scanned = scan_export_dir(export)
    assert scanned.models == [Path("decoder_model.onnx"), Path("onnx/encoder_model.onnx")]
    assert scanned.data == {Path("decoder_model.onnx_data")}
    out = tmp_path / "out"
    result = rlx(export, "-p", "always-f16", "-o", out, "--report-json", tmp_path / "r.json", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    data = [f for f in files if f.startswith("decoder_model.onnx.") and f.endswith(".data")]
    assert files == sorted(["config.json", "tokenizer.json", "decoder_model.onnx", "onnx/encoder_model.onnx", *data])
    assert len(data) == 1  # the converted weights under their own content name, not the input's data file
    for name in ("config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (export / name).read_bytes()
    for rel in ("decoder_model.onnx", "onnx/encoder_model.onnx"):
        onnx.checker.check_model(str(out / rel), full_check=True)
        model = onnx.load(str(out / rel), load_external_data=False)
        assert any(t.data_type == H for t in model.graph.initializer)
    batch = json.loads((tmp_path / "r.json").read_text())
    assert [Path(m["output"]).relative_to(out).as_posix() for m in batch["models"]] == ["decoder_model.onnx",
                                                                                         "onnx/encoder_model.onnx"]
    assert batch["exit_code"] == 0 and all(m["verify"]["passed"] for m in batch["models"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rlx-amp-")]  # no staging left


def test_a_directory_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    export = _export_dir(tmp_path)
    out = tmp_path / "out"
    assert rlx(export, "-p", "always-f16", "-o", out, "-q").returncode == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (export / "onnx" / "encoder_model.onnx").write_bytes(b"not a model")
    failed = rlx(export, "-p", "auto-mixed", "-o", out, "-q")
    assert failed.returncode == 2 and "encoder_model.onnx" in failed.stderr
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # untouched
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rlx-amp-")]


def test_cache_types_must_agree_across_a_directory(tmp_path: Path) -> None:
    """With --no-keep-io-types under auto-mixed the past input is read by an f16 Mul and the
    present output made by an f32 Concat: a generator feeding one back as the other would
    break, so the directory is refused, naming the pair, and nothing is written."""
    export = _export_dir(tmp_path)
    out = tmp_path / "out"
    result = rlx(export, "-p", "auto-mixed", "--no-keep-io-types", "-o", out, "-q")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "past_key_values.0.key" in result.stderr and "present.0.key" in result.stderr
    assert not out.exists()
    assert rlx(export, "-p", "auto-mixed", "-o", out, "-q").returncode == 0  # kept I/O types agree


def _seq2seq_decoders(export: Path) -> None:
    """optimum's two decoders of a seq2seq export, in small: decoder_model.onnx computes the
    encoder cache (present.0.encoder.key = Transpose(encoder states @ W)); decoder_model_merged.onnx
    holds the same step under an If whose with-past branch gives that output a placeholder
    Constant (as optimum's merge writes it) and whose other branch computes it."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.2).astype(np.float32), "w")

    def step(logits: str, present: str) -> list[onnx.NodeProto]:
        return [helper.make_node("MatMul", ["enc", "w"], [f"{logits}_k"]),
                helper.make_node("Transpose", [f"{logits}_k"], [present], perm=[1, 0]),
                helper.make_node("Relu", [f"{logits}_k"], [logits])]

    enc = helper.make_tensor_value_info("enc", F, [4, 16])
    outs = [helper.make_tensor_value_info("logits", F, [4, 16]),
            helper.make_tensor_value_info("present.0.encoder.key", F, [16, 4])]
    plain = helper.make_graph(step("logits", "present.0.encoder.key"), "decoder", [enc], outs, [w])
    onnx.save(helper.make_model(plain, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(export / "decoder_model.onnx"))
    placeholder = numpy_helper.from_array(np.zeros((16, 4), np.float32))
    with_past = helper.make_graph(
        [helper.make_node("Relu", ["past_key_values.0.encoder.key"], ["past_r"]),
         helper.make_node("Transpose", ["past_r"], ["logits_t"], perm=[1, 0]),
         helper.make_node("Identity", ["logits_t"], ["logits_b"]),
         helper.make_node("Constant", [], ["present_b"], value=placeholder)],
        "with_past", [],
        [helper.make_tensor_value_info("logits_b", F, [4, 16]), helper.make_tensor_value_info("present_b", F, [16, 4])])
    first = helper.make_graph(
        step("logits_a", "present_a"), "first", [],
        [helper.make_tensor_value_info("logits_a", F, [4, 16]), helper.make_tensor_value_info("present_a", F, [16, 4])])
    merged = helper.make_graph(
        [helper.make_node("If", ["use_cache_branch"], ["logits", "present.0.encoder.key"],
                          then_branch=with_past, else_branch=first)],
        "decoder_merged",
        [enc, helper.make_tensor_value_info("past_key_values.0.encoder.key", F, [16, 4]),
         helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])],
        outs, [w])
    model = helper.make_model(merged, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(export / "decoder_model_merged.onnx"))


def test_a_merged_decoders_placeholder_cache_follows_the_plain_decoders_type(tmp_path: Path) -> None:
    """--no-keep-io-types on a seq2seq export: the merged decoder's encoder cache comes out f16
    like the plain decoder's (its placeholder branch agrees with any type), where it came out
    f32 and the directory was refused (exit 2); the merged decoder still runs both branches."""
    export, out = tmp_path / "export", tmp_path / "out"
    export.mkdir()
    _seq2seq_decoders(export)
    result = rlx(export, "-p", "always-f16", "--no-keep-io-types", "-o", out, "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    types = {}
    for name in ("decoder_model.onnx", "decoder_model_merged.onnx"):
        model = onnx.load(str(out / name))
        types[name] = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
        onnx.checker.check_model(model, full_check=True)
    assert types["decoder_model.onnx"]["present.0.encoder.key"] == H
    assert types["decoder_model_merged.onnx"]["present.0.encoder.key"] == H
    import onnxruntime as ort

    session = ort.InferenceSession(str(out / "decoder_model_merged.onnx"), providers=["CPUExecutionProvider"])
    enc = np.random.default_rng(8).standard_normal((4, 16)).astype(np.float16)
    past = np.ones((16, 4), np.float16)
    for branch in (False, True):
        got = session.run(None, {"enc": enc, "past_key_values.0.encoder.key": past,
                                 "use_cache_branch": np.array([branch])})
        assert [g.dtype for g in got] == [np.float16, np.float16] and all(np.isfinite(g).all() for g in got)


def _image_classifier(export: Path) -> None:
    """An optimum image-classification folder in small: every axis of pixel_values symbolic, and
    a head that needs 3x16x16 images (Flatten -> MatMul with a 768x10 weight)."""
    w = numpy_helper.from_array((np.random.default_rng(9).standard_normal((768, 10)) * 0.05).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["pixel_values"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["logits"])],
        "classifier",
        [helper.make_tensor_value_info("pixel_values", F, ["batch_size", "num_channels", "height", "width"])],
        [helper.make_tensor_value_info("logits", F, ["batch_size", 10])], [w])
    export.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(export / "model.onnx"))


@pytest.mark.parametrize("configs", [
    {"config.json": {"num_channels": 3, "image_size": 16}},
    {"config.json": {"image_size": 224},  # the preprocessor's crop wins over the model config
     "preprocessor_config.json": {"do_center_crop": True, "crop_size": {"height": 16, "width": 16},
                                  "size": {"shortest_edge": 20}}},
])
def test_an_image_folder_is_verified_at_its_configs_image_size(tmp_path: Path, configs: dict) -> None:
    """optimum leaves pixel_values' axes symbolic: guessed (1x8x8x8) the f32 model cannot run and
    the folder is written unverified (exit 4); its configs give 1x3x16x16 and it verifies."""
    export, out = tmp_path / "export", tmp_path / "out"
    _image_classifier(export)
    guessed = rlx(export, "-p", "always-f16", "-o", out, "-q")
    assert guessed.returncode == 4, guessed.stderr
    for name, content in configs.items():
        (export / name).write_text(json.dumps(content))
    result = rlx(export, "-p", "always-f16", "-o", out, "--report-json", tmp_path / "r.json", "-q")
    assert result.returncode == 0, result.stderr
    [model] = json.loads((tmp_path / "r.json").read_text())["models"]
    assert model["verify"]["passed"] and model["verify"]["inputs"] == {"pixel_values": [1, 3, 16, 16]}
    given = rlx(export, "-p", "always-f16", "-o", out, "--shape", "pixel_values:2x3x16x16",
                "--report-json", tmp_path / "g.json", "-q")  # --shape comes first
    assert given.returncode == 0
    assert json.loads((tmp_path / "g.json").read_text())["models"][0]["verify"]["inputs"]["pixel_values"][0] == 2


def _genai_client(directory: Path) -> dict:
    result = subprocess.run([sys.executable, str(REPO / "fixtures" / "genai_client.py"), str(directory)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("policy", ["always-f16", "auto-mixed"])
def test_onnxruntime_genai_loads_the_converted_builder_folder(tmp_path: Path, policy: str) -> None:
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (the test extra has it)")
    out = tmp_path / "genai"
    result = rlx(GENAI, "-p", policy, "-o", out, "--report-json", tmp_path / "r.json", "-q", *GENAI_SHAPES)
    assert result.returncode == 0, result.stdout + result.stderr
    (model,) = json.loads((tmp_path / "r.json").read_text())["models"]
    assert model["verify"]["passed"] and model["proof"].startswith("onnxruntime loads it")  # builder ops
    assert model["verify"]["inputs"]["past_key_values.0.key"] == [1, 2, 4, 16]  # --shape wins over the config
    assert (out / "genai_config.json").read_bytes() == (GENAI / "genai_config.json").read_bytes()
    want, got = _genai_client(GENAI), _genai_client(out)
    assert got["tokens"] == want["tokens"]
    a, b = np.asarray(want["first_logits"]).ravel(), np.asarray(got["first_logits"]).ravel()
    assert float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) >= 0.999


@pytest.mark.parametrize(("shapes", "past"), [((), 8), (GENAI_SHAPES, 4)], ids=["config", "shape-wins"])
def test_a_genai_folder_is_verified_at_its_configs_cache_sizes(tmp_path: Path, shapes: list[str], past: int) -> None:
    # The builder's cache head size is a symbolic axis no guess fits (8 for 16: onnxruntime
    # refuses the run, and the plain command said exit 4); genai_config.json holds it.
    out = tmp_path / "genai"
    result = rlx(GENAI, "-p", "always-f16", "-o", out, "--report-json", tmp_path / "r.json", "-q", *shapes)
    assert result.returncode == 0, result.stdout + result.stderr
    (model,) = json.loads((tmp_path / "r.json").read_text())["models"]
    inputs = model["verify"]["inputs"]
    # 128 and 64 new tokens pass the model's rotary cache (cos_cache): the retry settles on 32
    assert model["verify"]["passed"] and inputs["input_ids"] == [1, 32] and inputs["attention_mask"] == [1, 32 + past]
    caches = {name: shape for name, shape in inputs.items() if name.startswith("past_key_values.")}
    assert len(caches) == 4 and all(shape == [1, 2, past, 16] for shape in caches.values())
    assert all(o["cosine"] > 0.999 for o in model["verify"]["outputs"])


def test_a_genai_decoder_alone_finds_its_cache_sizes(tmp_path: Path) -> None:
    # Converted as a single file the run reads no genai_config.json: the cache's head size
    # (`kv_cache_dim`, 16) is guessed, 64 and 32 fail, 16 runs (one reference run each), and the
    # report says the sizes it ran. The folder command reads them from the config instead.
    result = rlx(GENAI / "model.onnx", "-p", "always-f16", "-o", tmp_path / "m.onnx", "--report-json",
                 tmp_path / "r.json", "-q")
    assert result.returncode == 0, result.stderr
    verify = json.loads((tmp_path / "r.json").read_text())["verify"]
    assert verify["inputs"]["past_key_values.0.key"][-1] == 16
    assert "default axis 16" in verify["inputs_why"]["past_key_values.0.key"]
    verified = rlx("verify", GENAI / "model.onnx", tmp_path / "m.onnx", "-q")
    assert verified.returncode == 0, verified.stderr


def _cache_model(path: Path, dims: list[int | str]) -> None:
    cache = [helper.make_tensor_value_info(f"past_key_values.0.{kv}", F, dims) for kv in ("key", "value")]
    out = helper.make_tensor_value_info("present.0.key", F, None)
    graph = helper.make_graph([helper.make_node("Add", [c.name for c in cache], ["present.0.key"])], "g", cache, [out])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_genai_cache_shapes_fill_only_symbolic_axes(tmp_path: Path) -> None:
    from rlx_onnx_amp.directory import GENAI_CONFIG, genai_cache_shapes

    config = json.loads((GENAI / GENAI_CONFIG).read_text())
    config["model"]["decoder"]["num_hidden_layers"] = 1
    (tmp_path / GENAI_CONFIG).write_text(json.dumps(config))
    _cache_model(tmp_path / "model.onnx", ["batch", 2, "past", "kv_cache_dim"])
    want = (1, 2, 8, 16)  # batch 1, the config's 2 heads, DEFAULT_DIM past positions, its head size 16
    assert genai_cache_shapes(tmp_path) == {Path("model.onnx"): {f"past_key_values.0.{kv}": want for kv in ("key", "value")}}
    _cache_model(tmp_path / "model.onnx", [1, 2, 4, 16])  # nothing symbolic the config fills: nothing to say
    assert genai_cache_shapes(tmp_path) == {}
    _cache_model(tmp_path / "model.onnx", ["batch", 2, 6, "kv_cache_dim"])  # a declared past length stays
    assert genai_cache_shapes(tmp_path)[Path("model.onnx")]["past_key_values.0.key"] == (1, 2, 6, 16)
    del config["model"]["decoder"]["head_size"]  # another schema: the axes are guessed, as without a config
    (tmp_path / GENAI_CONFIG).write_text(json.dumps(config))
    assert genai_cache_shapes(tmp_path) == {}
    (tmp_path / GENAI_CONFIG).write_text("{not json")
    assert genai_cache_shapes(tmp_path) == {}
    (tmp_path / GENAI_CONFIG).unlink()
    assert genai_cache_shapes(tmp_path) == {}


OPTIMUM_PYTHON = os.environ.get("RLX_AMP_OPTIMUM_PYTHON", "")


_NO_OPTIMUM = ("RLX_AMP_OPTIMUM_PYTHON names no python with optimum-onnx 0.1.0 (it needs transformers 4.57, this "
               "environment has 5.x for torch exports; .ci/run builds one)")


@pytest.fixture(scope="module")
def optimum_exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fixtures/export_optimum.py's folders, exported once in optimum's own environment."""
    exports = tmp_path_factory.mktemp("optimum") / "exports"
    built = subprocess.run([OPTIMUM_PYTHON, str(REPO / "fixtures" / "export_optimum.py"), str(exports)],
                           capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert built.returncode == 0, built.stderr[-3000:]
    return exports


#: The task `--task auto` picks for each file of fixtures/export_optimum.py's folders.
TASK_OF_FILE = {
    "t5": {"encoder_model.onnx": "embed", "decoder_model.onnx": "generate", "decoder_model_merged.onnx": "generate",
           "decoder_with_past_model.onnx": "generate"},
    "bert": {"model.onnx": "embed"},
    "llama-external": {"model.onnx": "generate"},
    "vit": {"model.onnx": "classify"},
    "resnet": {"model.onnx": "classify"},
    "sentence-transformers": {"model.onnx": "embed"},
    "whisper": {"encoder_model.onnx": "embed", "decoder_model.onnx": "generate",
                "decoder_model_merged.onnx": "generate", "decoder_with_past_model.onnx": "generate"},
}


@pytest.mark.slow
@pytest.mark.skipif(not OPTIMUM_PYTHON, reason=_NO_OPTIMUM)
@pytest.mark.parametrize(("folder", "kind", "policy", "args"), [
    ("t5", "seq2seq", "always-f16", []),  # whisper's auto-mixed row: a merged decoder under a search
    ("bert", "feature-extraction", "auto-mixed", []),
    ("llama-external", "causal-lm", "always-f16", []),  # 64 positions (config.json): its sequence within
    ("vit", "image-classification", "always-f16", []),  # pixel_values' symbolic axes: sizes from preprocessor_config.json
    ("resnet", "image-classification", "auto-mixed", []),
    ("whisper", "speech-seq2seq", "always-f16", []),
    ("whisper", "speech-seq2seq", "auto-mixed", ["--inputs", "speech.wav"]),  # decoders through the encoder
    ("sentence-transformers", "sentence-embedding", "always-f16", []),  # onnx/model.onnx in a sub-folder
])
def test_optimum_loads_the_converted_export(optimum_exports: Path, tmp_path: Path, folder: str, kind: str,
                                            policy: str, args: list[str]) -> None:
    """The converted folder loads in ORTModelForSeq2SeqLM / ORTModelForFeatureExtraction /
    ORTModelForCausalLM / ORTModelForImageClassification / ORTModelForSpeechSeq2Seq, and
    sentence-transformers' SentenceTransformer(backend="onnx") as written
    (the T5 and whisper ones hold the merged decoder, verified on both of its branches), and
    generates the f32 export's greedy tokens (a classifier: its class). With no option, each
    file's verdict is on the task its interface names, and says so."""
    if not (optimum_exports / folder).is_dir():
        pytest.skip(f"fixtures/export_optimum.py wrote no {folder}/: the optimum venv has no sentence-transformers")
    out = tmp_path / "out"
    if "speech.wav" in args:  # two seconds of a decaying tone, the samples of a user's recording
        args = [str(_tone(tmp_path / "speech.wav")) if a == "speech.wav" else a for a in args]
    result = rlx(optimum_exports / folder, "-p", policy, "-o", out, "-q", "--report-json", tmp_path / "r.json", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    if args:  # the decoders start from the wav: its encoder's states, the start token
        froms = {Path(m["output"]).name: m["verify"].get("inputs_from", "")
                 for m in json.loads((tmp_path / "r.json").read_text())["models"]}
        assert "through encoder_model.onnx; input_ids the start token" in froms["decoder_model_merged.onnx"], froms
    # With no --task, each file's verdict is on the task its outputs name (issue 39).
    tasks = {Path(m["output"]).name: (m["verify"]["task"]["task"], m["verify"]["task"]["passed"])
             for m in json.loads((tmp_path / "r.json").read_text())["models"]}
    assert tasks == {name: (task, True) for name, task in TASK_OF_FILE[folder].items()}

    # the f32 export and its conversion in one client process (torch and optimum imported once)
    ran = subprocess.run([OPTIMUM_PYTHON, str(REPO / "fixtures" / "optimum_client.py"), kind,
                          str(optimum_exports / folder), str(out)], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    want, got = (json.loads(line) for line in ran.stdout.splitlines())
    if kind == "sentence-embedding":  # every sentence's embedding, row by row
        a, b = (np.asarray(r["embeddings"], dtype=np.float64) for r in (want, got))
        assert a.shape == b.shape == (3, 32)
        cosines = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        assert cosines.min() >= 0.999, cosines
        return
    if kind == "feature-extraction":
        a, b = (np.asarray(r["last_hidden_state_head"], dtype=np.float64) for r in (want, got))
    else:
        assert got["tokens"] == want["tokens"]
        a, b = (np.asarray(r["first_logits"], dtype=np.float64).ravel() for r in (want, got))
    assert float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) >= 0.999


def _tone(path: Path) -> Path:
    t = np.arange(32000) / 16000
    return write_wav(path, 16000, 1, np.sin(2 * np.pi * 440 * t) * np.exp(-t) * 12000)


def test_an_empty_sub_folder_is_made_again(tmp_path: Path) -> None:
    """A sentence-transformers export holds an empty `2_Normalize/`: its loader wants it there."""
    export = _export_dir(tmp_path)
    (export / "2_Normalize").mkdir()
    out = tmp_path / "out"
    result = rlx(export, "-p", "always-f16", "-o", out, "-q", "--provider", "cpu")
    assert result.returncode == 0, result.stderr
    assert (out / "2_Normalize").is_dir() and not list((out / "2_Normalize").iterdir())
    assert (out / "decoder_model.onnx").is_file()
