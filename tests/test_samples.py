"""`--inputs` takes samples in the user's terms (issue 50): images, wav audio and text prompts,
made into the model's inputs by its folder's preprocessing (preprocessor_config.json,
tokenizer.json), ultralytics metadata or the documented defaults; a sample the model cannot
take is one line and exit 2. Every model is built here, seeded; every sample drawn here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers

from rlx_onnx_amp.verification.inputs import InputSpec, load_inputs
from rlx_onnx_amp.verification.samples import SampleSets, parse_preprocess
from tests.helpers import rlx, write_wav

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
CLIP_CONFIG = {
    "image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": 32},
    "do_center_crop": True, "crop_size": {"height": 28, "width": 28}, "resample": 2, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": MEAN, "image_std": STD,
}  # fmt: skip


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto], meta: dict[str, str] | None = None) -> onnx.ModelProto:
    model = h.make_model(h.make_graph(nodes, "m", inputs, outputs, inits), opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    for key, value in (meta or {}).items():
        model.metadata_props.add(key=key, value=value)
    return model


def classifier(shape: list[int | str], channels: int = 3, meta: dict[str, str] | None = None) -> onnx.ModelProto:
    """pixel_values -> Conv(k3) -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> logits [N, 5]."""
    rng = np.random.default_rng(50)
    inits = [nh.from_array((rng.standard_normal((4, channels, 3, 3)) * 0.3).astype(np.float32), "cw"),
             nh.from_array((rng.standard_normal((5, 4)) * 0.5).astype(np.float32), "fw"),
             nh.from_array((rng.standard_normal(5) * 0.1).astype(np.float32), "fb")]
    nodes = [h.make_node("Conv", ["pixel_values", "cw"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c"], ["r"]), h.make_node("GlobalAveragePool", ["r"], ["p"]),
             h.make_node("Flatten", ["p"], ["f"]), h.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1)]
    return _model(nodes, [h.make_tensor_value_info("pixel_values", T.FLOAT, shape)],
                  [h.make_tensor_value_info("logits", T.FLOAT, [shape[0], 5])], inits, meta)


def _png(path: Path, width: int, height: int, seed: int, mode: str = "RGB") -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).convert(mode).save(path)
    return path


def _clip_by_hand(path: Path) -> np.ndarray:
    """CLIP's steps in numpy: shortest edge to 32 (40x30 -> 42x32), center crop 28, /255, mean/std."""
    img = Image.open(path).convert("RGB")
    assert img.size == (40, 30)
    img = img.resize((42, 32), Image.Resampling.BILINEAR).crop((7, 2, 35, 30))
    x: np.ndarray = np.asarray(img).astype(np.float32) * np.float32(1 / 255)
    x = (x - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
    return x.transpose(2, 0, 1)[None]


def _ort(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.disable_prepacking", "1")  # as the verifier opens them
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_images_in_a_folder_with_a_preprocessor_config(tmp_path: Path) -> None:
    folder = tmp_path / "vit"
    folder.mkdir()
    src = folder / "model.onnx"
    onnx.save(classifier(["batch", 3, "height", "width"]), str(src))
    (folder / "preprocessor_config.json").write_text(json.dumps(CLIP_CONFIG))
    photos = tmp_path / "photos"
    photos.mkdir()
    second, first = _png(photos / "img_10.png", 40, 30, 1), _png(photos / "img_2.png", 40, 30, 2)
    (photos / "notes.md").write_text("not a sample")
    out, used, report = tmp_path / "out.onnx", tmp_path / "s.npz", tmp_path / "r.json"
    result = rlx(src, "-p", "always-f16", "-o", out, "--provider", "cpu", "--no-emulate", "--inputs", photos,
                 "--save-inputs", used, "--report-json", report)
    assert result.returncode == 0, result.stderr
    saved = np.load(used)
    assert sorted(saved.files) == ["pixel_values", "pixel_values#1"]
    # exact: the same steps in the same float32 arithmetic, in name order (img_2 before img_10)
    assert np.array_equal(saved["pixel_values"], _clip_by_hand(first))
    assert np.array_equal(saved["pixel_values#1"], _clip_by_hand(second))
    v = json.loads(report.read_text())["verify"]
    assert v["inputs_from"] == (
        "samples: 2 images (preprocessor_config.json: resize shortest edge 32, crop 28x28, /255, mean/std)"
    )
    assert "inputs: samples: 2 images (preprocessor_config.json" in result.stdout + result.stderr
    assert v["samples"] == 2 and v["inputs"] == {"pixel_values": [1, 3, 28, 28]} and "inputs_why" not in v
    ref = np.stack([_ort(src, {"pixel_values": saved[k]}) for k in saved.files]).astype(np.float64)
    cand = np.stack([_ort(out, {"pixel_values": saved[k]}) for k in saved.files]).astype(np.float64)
    assert v["outputs"][0]["max_abs"] == pytest.approx(np.max(np.abs(ref - cand)), rel=1e-9)
    assert 0 < v["outputs"][0]["max_abs"] < 1e-2
    # verify and --policy auto take the same samples (auto: chooses on the first, confirms on the second)
    again, searched = tmp_path / "v.json", tmp_path / "a.json"
    assert rlx("verify", src, out, "--provider", "cpu", "--inputs", photos, "--report-json", again).returncode == 0
    assert json.loads(again.read_text())["verify"]["inputs_from"] == v["inputs_from"]
    result = rlx(src, "--policy", "auto", "-o", tmp_path / "auto.onnx", "--provider", "cpu", "--inputs", photos,
                 "--report-json", searched)
    assert result.returncode == 0, result.stderr
    assert json.loads(searched.read_text())["verify"]["inputs_from"] == v["inputs_from"]


@pytest.mark.slow  # importing transformers' image processors takes torch: 7 s and more
def test_the_clip_steps_are_transformers_own(tmp_path: Path) -> None:
    """The preprocessor_config's steps as transformers' own Pillow CLIP image processor takes them."""
    transformers = pytest.importorskip("transformers")
    model = classifier(["batch", 3, "height", "width"])
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(CLIP_CONFIG))
    photo = _png(tmp_path / "p.png", 40, 30, 3)
    ours = load_inputs(photo, model, InputSpec(), tmp_path)[0]["pixel_values"]
    processor = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)(**CLIP_CONFIG)
    theirs = processor(Image.open(photo), return_tensors="np")["pixel_values"]
    assert ours.shape == theirs.shape == (1, 3, 28, 28)
    assert np.abs(ours - theirs).max() < 1e-5


def test_convnext_resizes_by_crop_pct_and_crops_back(tmp_path: Path) -> None:
    """transformers' ConvNext processor: shortest edge 24 / crop_pct 0.75 = 32 (40x30 -> 42x32), crop 24."""
    config = {"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 24}, "crop_pct": 0.75,
              "do_normalize": False}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    photo = _png(tmp_path / "p.png", 40, 30, 7)
    sets = load_inputs(photo, classifier(["batch", 3, "height", "width"]), InputSpec(), tmp_path)
    img = Image.open(photo).convert("RGB").resize((42, 32), Image.Resampling.BILINEAR).crop((9, 4, 33, 28))
    want = (np.asarray(img).astype(np.float32) * np.float32(1 / 255)).transpose(2, 0, 1)[None]
    assert np.array_equal(sets[0]["pixel_values"], want)
    assert isinstance(sets, SampleSets) and "resize shortest edge 32, crop 24x24, /255)" in sets.source


def test_a_bare_image_takes_metadata_or_the_defaults(tmp_path: Path) -> None:
    photo = _png(tmp_path / "wide.png", 40, 20, 4)
    img = Image.open(photo).convert("RGB")
    # ultralytics: letterboxed into imgsz 32x32 (40x20 -> 32x16, 8 rows of gray 114 above and below), /255
    yolo = classifier([1, 3, 32, 32], meta={"imgsz": "[32, 32]", "stride": "32"})
    sets = load_inputs(photo, yolo, InputSpec(), tmp_path)
    canvas = np.full((32, 32, 3), 114, np.uint8)
    canvas[8:24] = np.asarray(img.resize((32, 16), Image.Resampling.BILINEAR))
    want = (canvas.astype(np.float32) * np.float32(1 / 255)).transpose(2, 0, 1)[None]
    assert np.array_equal(sets[0]["pixel_values"], want)
    assert isinstance(sets, SampleSets) and sets.source == "samples: 1 image (letterbox 32x32 (ultralytics imgsz), /255)"
    # no config, no metadata: the input's fixed 16x16, /255, ImageNet mean/std
    plain = load_inputs(photo, classifier([1, 3, 16, 16]), InputSpec(), tmp_path)
    x: np.ndarray = np.asarray(img.resize((16, 16), Image.Resampling.BILINEAR)).astype(np.float32) * np.float32(1 / 255)
    x = (x - np.asarray((0.485, 0.456, 0.406), np.float32)) / np.asarray((0.229, 0.224, 0.225), np.float32)
    assert np.array_equal(plain[0]["pixel_values"], x.transpose(2, 0, 1)[None])
    assert isinstance(plain, SampleSets) and plain.source == "samples: 1 image (resize 16x16, /255, ImageNet mean/std)"
    # one channel, NHWC: grayscale; --preprocess size/mean/std override
    gray = classifier([1, "h", "w", 1])
    gray.graph.node.insert(0, h.make_node("Transpose", ["pixel_values"], ["nchw"], perm=[0, 3, 1, 2]))
    gray.graph.node[1].input[0] = "nchw"
    spec = InputSpec(preprocess=parse_preprocess(["size=8x12", "mean=0.5", "std=0.25"]))
    got = load_inputs(photo, gray, spec, tmp_path)[0]["pixel_values"]
    g = np.asarray(Image.open(photo).convert("L").resize((12, 8), Image.Resampling.BILINEAR)).astype(np.float32)
    assert np.array_equal(got, ((g * np.float32(1 / 255) - np.float32(0.5)) / np.float32(0.25))[None, :, :, None])


def audio_model() -> onnx.ModelProto:
    """audio [1, samples] -> Conv1d(k 8, stride 4) -> Tanh -> ReduceMean -> score, negated unless
    Equal(sr, 16000): the rate the model was trained at."""
    rng = np.random.default_rng(51)
    inits = [nh.from_array((rng.standard_normal((4, 1, 8)) * 0.5).astype(np.float32), "k"),
             nh.from_array(np.array([0, 1, -1], np.int64), "to3d"), nh.from_array(np.array(16000, np.int64), "rate")]
    nodes = [h.make_node("Reshape", ["audio", "to3d"], ["a3"]), h.make_node("Conv", ["a3", "k"], ["c"], strides=[4]),
             h.make_node("Tanh", ["c"], ["t"]), h.make_node("ReduceMean", ["t"], ["m"], keepdims=0),
             h.make_node("Neg", ["m"], ["n"]), h.make_node("Equal", ["sr", "rate"], ["ok"]),
             h.make_node("Where", ["ok", "m", "n"], ["score"])]
    return _model(nodes, [h.make_tensor_value_info("audio", T.FLOAT, [1, "samples"]),
                          h.make_tensor_value_info("sr", T.INT64, [])],
                  [h.make_tensor_value_info("score", T.FLOAT, [])], inits)


def test_a_wav_is_resampled_into_the_audio_input_and_sr(tmp_path: Path) -> None:
    src = tmp_path / "voice.onnx"
    onnx.save(audio_model(), str(src))
    t = np.arange(800) / 8000  # 0.1 s of stereo at 8 kHz: a tone on the left, another on the right
    stereo = np.stack([np.sin(2 * np.pi * 440 * t), 0.5 * np.sin(2 * np.pi * 1000 * t)], axis=1) * 20000
    clip = write_wav(tmp_path / "clip.wav", 8000, 2, stereo.round())
    out, used, report = tmp_path / "out.onnx", tmp_path / "s.npz", tmp_path / "r.json"
    result = rlx(src, "-p", "always-f16", "-o", out, "--provider", "cpu", "--no-emulate", "--inputs", clip,
                 "--save-inputs", used, "--report-json", report)
    assert result.returncode == 0, result.stderr
    saved = np.load(used)
    mono = stereo.round().mean(axis=1) / 32768
    want = np.interp(np.arange(1600) * 0.5, np.arange(800), mono).astype(np.float32)[None]
    assert np.array_equal(saved["audio"], want) and saved["sr"] == 16000
    v = json.loads(report.read_text())["verify"]
    assert v["inputs_from"] == "samples: 1 wav (resampled 8000 -> 16000 Hz)"
    ref, cand = _ort(src, dict(saved)), _ort(out, dict(saved))
    assert ref > 0 or ref < 0  # the trained rate's branch, not a constant
    assert v["outputs"][0]["max_abs"] == pytest.approx(abs(float(ref) - float(cand)), rel=1e-9, abs=1e-12)
    # rate=8000: no resampling, and sr says so
    at8k = load_inputs(clip, audio_model(), InputSpec(preprocess=parse_preprocess(["rate=8000"])), tmp_path)[0]
    assert np.array_equal(at8k["audio"], mono.astype(np.float32)[None]) and at8k["sr"] == 8000


@pytest.mark.slow  # importing transformers: 3 s and more
def test_whisper_features_are_transformers_own(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(extractor.to_dict()))
    rng = np.random.default_rng(52)
    encoder = _model([h.make_node("ReduceMean", ["input_features", "axes"], ["m"], keepdims=0),
                      h.make_node("MatMul", ["m", "w"], ["last_hidden_state"])],
                     [h.make_tensor_value_info("input_features", T.FLOAT, ["batch", 80, 3000])],
                     [h.make_tensor_value_info("last_hidden_state", T.FLOAT, ["batch", 4])],
                     [nh.from_array(np.array([2], np.int64), "axes"),
                      nh.from_array(rng.standard_normal((80, 4)).astype(np.float32), "w")])
    encoder.opset_import[0].version = 18  # ReduceMean's axes as an input
    pcm = (rng.standard_normal(24000) * 3000).round()
    clip = write_wav(tmp_path / "speech.wav", 16000, 1, pcm)
    sets = load_inputs(clip, encoder, InputSpec(), tmp_path)
    theirs = extractor((pcm / 32768).astype(np.float32), sampling_rate=16000, return_tensors="np")["input_features"]
    assert sets[0]["input_features"].shape == theirs.shape == (1, 80, 3000)
    assert np.abs(sets[0]["input_features"] - theirs).max() < 1e-4
    assert isinstance(sets, SampleSets) and "Whisper log-mel" in sets.source


def text_model(vocab: int = 16) -> onnx.ModelProto:
    """input_ids, attention_mask [batch, sequence] -> embedding * mask -> ReduceMean -> MatMul -> embeds."""
    rng = np.random.default_rng(53)
    inits = [nh.from_array(rng.standard_normal((vocab, 8)).astype(np.float32), "table"),
             nh.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w"),
             nh.from_array(np.array([-1], np.int64), "last")]
    nodes = [h.make_node("Gather", ["table", "input_ids"], ["e"]),
             h.make_node("Cast", ["attention_mask"], ["mf"], to=T.FLOAT),
             h.make_node("Unsqueeze", ["mf", "last"], ["m3"]), h.make_node("Mul", ["e", "m3"], ["em"]),
             h.make_node("ReduceMean", ["em"], ["pooled"], axes=[1], keepdims=0),
             h.make_node("MatMul", ["pooled", "w"], ["embeds"])]
    inputs = [h.make_tensor_value_info(n, T.INT64, ["batch", "sequence"]) for n in ("input_ids", "attention_mask")]
    return _model(nodes, inputs, [h.make_tensor_value_info("embeds", T.FLOAT, ["batch", 3])], inits)


def _tokenizer(path: Path) -> Tokenizer:
    """fixtures/tiny_tokenizer.py's vocabulary, small: <pad> </s> <s> <unk> w4 .. w15, by whitespace."""
    vocab = {t: i for i, t in enumerate(["<pad>", "</s>", "<s>", "<unk>"])} | {f"w{i}": i for i in range(4, 16)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return tok


def test_prompts_through_the_folders_tokenizer(tmp_path: Path) -> None:
    src = tmp_path / "encoder.onnx"
    onnx.save(text_model(), str(src))
    _tokenizer(tmp_path / "tokenizer.json")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w4 w5 w6 nope\n\nw7 w8\n")
    out, used, report = tmp_path / "out.onnx", tmp_path / "s.npz", tmp_path / "r.json"
    result = rlx(src, "-p", "always-f16", "-o", out, "--provider", "cpu", "--no-emulate", "--inputs", prompts,
                 "--save-inputs", used, "--report-json", report)
    assert result.returncode == 0, result.stderr
    saved = np.load(used)
    assert saved["input_ids"].tolist() == [[4, 5, 6, 3]] and saved["input_ids#1"].tolist() == [[7, 8]]
    assert saved["attention_mask"].tolist() == [[1, 1, 1, 1]] and saved["attention_mask#1"].tolist() == [[1, 1]]
    v = json.loads(report.read_text())["verify"]
    assert v["inputs_from"] == "samples: 2 prompts (tokenizer.json)" and v["samples"] == 2
    drift = max(np.max(np.abs(_ort(src, s).astype(np.float64) - _ort(out, s)))
                for s in ({n: saved[n] for n in ("input_ids", "attention_mask")},
                          {n: saved[f"{n}#1"] for n in ("input_ids", "attention_mask")}))
    assert v["outputs"][0]["max_abs"] == pytest.approx(drift, rel=1e-9)


def _refused(result: subprocess.CompletedProcess[str], out: Path, *words: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlx-amp: error: "), result.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not out.exists()


def test_a_sample_the_model_cannot_take_is_one_line(tmp_path: Path) -> None:
    image_model, text_only = tmp_path / "cls.onnx", tmp_path / "enc.onnx"
    onnx.save(classifier(["batch", 3, "height", "width"]), str(image_model))
    onnx.save(text_model(), str(text_only))
    out = tmp_path / "out.onnx"
    clip = write_wav(tmp_path / "clip.wav", 16000, 1, np.zeros(100))
    _refused(rlx(image_model, "-o", out, "--inputs", clip), out,
             "clip.wav: an audio sample needs one float input of rank 1 or 2", "pixel_values [?, 3, ?, ?] float32")
    _refused(rlx(text_only, "-o", out, "--inputs", _png(tmp_path / "p.png", 8, 8, 5)), out,
             "p.png: an image sample needs one image input", "the model has no 4-D image input")
    prompts = tmp_path / "p.txt"
    prompts.write_text("w4 w5\n")
    _refused(rlx(text_only, "-o", out, "--inputs", prompts), out,
             "p.txt: a text sample needs the model folder's tokenizer.json")
    _refused(rlx(text_only, "-o", out, "--inputs", prompts, "--preprocess", "size=big"), out,
             "--preprocess: expected size=HxW")
    _refused(rlx(text_only, "-o", out, "--preprocess", "rate=8000"), out,
             "--preprocess applies to --inputs samples (images, audio, text); no --inputs given")


def test_an_image_without_pillow_says_how_to_install_it(tmp_path: Path) -> None:
    src, out = tmp_path / "cls.onnx", tmp_path / "out.onnx"
    onnx.save(classifier(["batch", 3, "height", "width"]), str(src))
    photo = _png(tmp_path / "photo.png", 8, 8, 6)
    hidden = "import sys; sys.modules['PIL'] = None; from rlx_onnx_amp.__main__ import main; main(sys.argv[1:])"
    result = subprocess.run([sys.executable, "-c", hidden, str(src), "-o", str(out), "--inputs", str(photo)],
                            capture_output=True, text=True, timeout=120)
    _refused(result, out, f'{photo}: reading an image needs Pillow: pip install "rlx-amp[samples]"')
