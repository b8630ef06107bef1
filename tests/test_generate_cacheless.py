"""`generate` for decoders without a cache (issue 50): `input_ids` (+ `encoder_hidden_states`)
in, `logits` [batch, seq, vocab] out, nothing else, as optimum's plain T5/BART `decoder_model.onnx`
and GPT-2 without past are exported. Each greedy step feeds the whole sequence again, one token
longer. `--task auto` takes such a model for a decoder only on a sign (an encoder input, its
file name, its folder's config): a masked LM has the same interface. Models from
fixtures/decoders.py (seeded), GPT-2 exported here with torch, T5 by optimum in its own venv."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fixtures.decoders import cross_decoder, decoder_step, gpt2_without_past, masked_lm, table_encoder
from rlx_onnx_amp.verification.generate import decode, find_generator, folder_encoder, next_feeds
from rlx_onnx_amp.verification.inputs import InputSpec, synthesized_sets
from rlx_onnx_amp.verification.options import VerifyOptions
from rlx_onnx_amp.verification.reference import prepare_reference
from rlx_onnx_amp.verification.task import Task, choose_task
from tests.helpers import rlx, write_wav

REPO = Path(__file__).resolve().parents[1]


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _task(report: Path) -> dict:
    return json.loads(report.read_text())["verify"]["task"]


def _greedy(path: Path, steps: int) -> list[list[int]]:
    """The file's own greedy tokens from the verification's first synthesized input set,
    onnxruntime running each step on the whole sequence (not through the verifier)."""
    model = onnx.load(str(path))
    gen = find_generator(model, path.name)
    assert gen is not None and gen.cacheless
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(["logits"], session.run(["logits"], dict(feeds))))

    feeds = synthesized_sets(model, InputSpec())[0]
    return [t.tolist() for t in decode(gen, run, feeds, run(feeds), steps).tokens]


def _static(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its sequence axis fixed at 8 (a static export: no longer sequence fits)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in (*fixed.graph.input, *fixed.graph.output):
        vi.type.tensor_type.shape.dim[1].dim_value = 8
    return fixed


def test_a_decoder_without_a_cache_is_found_and_auto_wants_a_sign() -> None:
    cross = find_generator(cross_decoder())
    assert cross is not None and cross.cacheless and not cross.cached and cross.feedback == ()
    assert cross.ids == "input_ids" and cross.logits == "logits" and cross.mask is None
    assert cross.sign == "an encoder_hidden_states input"
    bare = find_generator(masked_lm())
    assert bare is not None and bare.cacheless and bare.sign is None
    named = find_generator(masked_lm(), "decoder_model.onnx")
    assert named is not None and named.sign == "its file name decoder_model.onnx"
    assert find_generator(_static(masked_lm()), "decoder_model.onnx") is None  # the loop cannot feed it more
    with_present = find_generator(decoder_step(cached=False))  # optimum's decoder_model.onnx with present.*
    assert with_present is not None and not with_present.cacheless
    shapes = {"logits": (1, 8, 48)}
    # auto: a masked LM's logits are a classifier's; a sign makes them a decoder's
    assert choose_task("auto", shapes, bare)[0] is Task.CLASSIFY
    for gen in (cross, named):
        task, named_outputs, how = choose_task("auto", shapes, gen)
        assert task is Task.GENERATE and named_outputs == ("logits",) and "without a cache" in how
    assert choose_task("generate", shapes, bare)[0] is Task.GENERATE  # asked for: no sign needed
    folder = ("generate", "config.json architectures GPT2LMHeadModel")
    assert choose_task("auto", shapes, bare, folder)[:3:2] == (Task.GENERATE, f"auto: {folder[1]}")


def test_each_step_feeds_the_whole_sequence_one_token_longer() -> None:
    gen = find_generator(cross_decoder())
    assert gen is not None
    states, mask = np.ones((2, 5, 16), np.float32), np.ones((2, 5), np.int64)
    feeds = {"input_ids": np.array([[3, 4], [5, 6]]), "encoder_hidden_states": states, "encoder_attention_mask": mask}
    step = next_feeds(gen, feeds, {"logits": np.zeros((2, 2, 48), np.float32)}, np.array([7, 9]))
    assert step["input_ids"].tolist() == [[3, 4, 7], [5, 6, 9]] and step["input_ids"].dtype == np.int64
    # the encoder's states and mask as at the first step
    assert step["encoder_hidden_states"] is states and step["encoder_attention_mask"] is mask


def test_a_cacheless_decoder_passes_generate_and_the_written_file_keeps_its_tokens(tmp_path: Path) -> None:
    src = _save(cross_decoder(), tmp_path / "decoder_model.onnx")
    for task in ("generate", "auto"):
        out, report = tmp_path / f"{task}.onnx", tmp_path / f"{task}.json"
        result = rlx(src, "-p", "always-f16", "-o", out, "--provider", "cpu", "-q", "--samples", "2",
                     "--task", task, "--report-json", report)
        assert result.returncode == 0, result.stdout + result.stderr
        verdict = _task(report)
        assert verdict["task"] == "generate" and verdict["passed"], verdict
        assert verdict["chosen_by"] == ("--task" if task == "generate" else
                                        "auto: a decoder step without a cache (input_ids in, logits out, the whole "
                                        "sequence fed again each step; a decoder's by an encoder_hidden_states input)")
        judged = verdict["outputs"][0]
        # --samples 2 at each of the two sizes: four prompts, eight steps each, every judged token the same
        assert judged["rows"] == 4 and judged["steps"] == 8 and judged["top1_agreement"] == 1.0
        assert judged["token_agreement"] == 1.0 and "first_divergence" not in judged
    # The written file itself, run by onnxruntime here: the original's greedy tokens, step by step.
    want = _greedy(src, 8)
    assert _greedy(tmp_path / "auto.onnx", 8) == want and len({t[0] for t in want}) > 1  # the tokens vary


def test_a_cacheless_decoder_whose_tokens_flip_fails_generate(tmp_path: Path) -> None:
    """Every logit near 16384, where float16's spacing is 16: each one within the element-wise
    bound (it scales with the largest logit), the greedy tokens flipped."""
    src = _save(cross_decoder(logit_bias=16384.0), tmp_path / "decoder_model.onnx")
    report = tmp_path / "r.json"
    result = rlx(src, "-p", "always-f16", "-o", tmp_path / "out.onnx", "--provider", "cpu", "--report-json", report)
    assert result.returncode == 1, result.stdout + result.stderr
    verify = json.loads(report.read_text())["verify"]
    assert all(o["passed"] for o in verify["outputs"])
    task = verify["task"]
    assert task["task"] == "generate" and not task["passed"]
    judged = task["outputs"][0]
    assert judged["steps"] == 8 and judged["top1_agreement"] < 0.9 and judged["first_divergence"] is not None
    assert "task generate (auto: a decoder step without a cache" in result.stdout


def test_auto_takes_a_masked_lm_shape_for_a_decoder_only_by_its_name(tmp_path: Path) -> None:
    tasks = {}
    for name in ("model.onnx", "decoder_model.onnx"):
        src = _save(masked_lm(), tmp_path / name)
        report = tmp_path / f"{name}.json"
        result = rlx(src, "-p", "always-f16", "-o", tmp_path / f"out-{name}", "--provider", "cpu", "-q",
                     "--report-json", report)
        assert result.returncode == 0, result.stdout + result.stderr
        verdict = _task(report)
        tasks[name] = (verdict["task"], verdict["chosen_by"], verdict["passed"])
    assert tasks == {
        "model.onnx": ("classify", "auto: output 'logits'", True),
        "decoder_model.onnx": ("generate", "auto: a decoder step without a cache (input_ids in, logits out, the whole "
                                           "sequence fed again each step; a decoder's by its file name "
                                           "decoder_model.onnx)", True),
    }


def test_gpt2_without_past_generates_alone_and_in_its_folder(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed (pip install 'rlx-onnx-amp[export]')")
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'rlx-onnx-amp[export]')")
    folder = tmp_path / "gpt2"
    folder.mkdir()
    src = gpt2_without_past(folder / "model.onnx")
    gen = find_generator(onnx.load(str(src)), src.name)
    assert gen is not None and gen.cacheless and gen.mask == "attention_mask" and gen.sign is None
    result = rlx(src, "-p", "always-f16", "-o", tmp_path / "out.onnx", "--provider", "cpu", "-q", "--task", "generate",
                 "--report-json", tmp_path / "file.json")
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = _task(tmp_path / "file.json")
    assert verdict["task"] == "generate" and verdict["passed"] and verdict["outputs"][0]["steps"] == 8
    assert verdict["outputs"][0]["top1_agreement"] == 1.0
    # In its export folder the config names the task: auto generates without --task.
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    result = rlx(folder, "-p", "always-f16", "-o", tmp_path / "out", "--provider", "cpu", "-q",
                 "--report-json", tmp_path / "folder.json")
    assert result.returncode == 0, result.stdout + result.stderr
    (model,) = json.loads((tmp_path / "folder.json").read_text())["models"]
    task = model["verify"]["task"]
    assert (task["task"], task["chosen_by"], task["passed"]) == (
        "generate", "auto: config.json architectures GPT2LMHeadModel", True)


def _from_table(states: np.ndarray, table: np.ndarray, mask: np.ndarray) -> bool:
    """Whether every state is its token's row of the encoder's table (zero where masked)."""
    rows = states.reshape(-1, states.shape[-1])
    kept = mask.reshape(-1).astype(bool)
    distance = np.abs(rows[:, None, :] - table[None, :, :]).max(axis=-1).min(axis=1)
    return bool((distance[kept] == 0).all() and (rows[~kept] == 0).all())


def test_a_folders_decoder_reads_its_encoders_states(tmp_path: Path) -> None:
    """An encoder_model.onnx beside the decoder: the decoder's encoder_hidden_states are the
    encoder's output (onnxruntime's, on drawn token ids under the decoder's encoder mask), not
    drawn noise; the folder's decoder generates on them."""
    folder = tmp_path / "t5-like"
    encoder = _save(table_encoder(), folder / "encoder_model.onnx")
    decoder = _save(cross_decoder(), folder / "decoder_model.onnx")
    (folder / "config.json").write_text(json.dumps({"architectures": ["T5ForConditionalGeneration"]}))
    rels = [Path("decoder_model.onnx"), Path("encoder_model.onnx")]
    assert folder_encoder(folder, rels) == encoder and folder_encoder(folder, rels[:1]) is None
    table = onnx.numpy_helper.to_array(onnx.load(str(encoder)).graph.initializer[0])
    read = prepare_reference(decoder, VerifyOptions(provider="cpu", encoder=str(encoder)))
    # The decoder file given alone (or with its encoder) reads the encoder beside it; a decoder
    # with no encoder beside it gets drawn states.
    beside = prepare_reference(decoder, VerifyOptions(provider="cpu"))
    drawn = prepare_reference(_save(cross_decoder(), tmp_path / "lone" / "decoder_model.onnx"),
                              VerifyOptions(provider="cpu"))
    assert len(read.samples) == len(drawn.samples) == len(beside.samples) == 2  # the two sizes
    assert read.sizes is not None and drawn.sizes is not None  # the report says where the states came from
    assert read.sizes.why["encoder_hidden_states"].endswith(", the output of encoder_model.onnx on drawn inputs")
    assert "encoder_model" not in drawn.sizes.why["encoder_hidden_states"]
    for with_encoder, found, alone in zip(read.samples, beside.samples, drawn.samples):
        mask = with_encoder["encoder_attention_mask"]
        assert _from_table(with_encoder["encoder_hidden_states"], table, mask)
        np.testing.assert_array_equal(found["encoder_hidden_states"], with_encoder["encoder_hidden_states"])
        assert not _from_table(alone["encoder_hidden_states"], table, alone["encoder_attention_mask"])
        assert with_encoder["input_ids"].tolist() == alone["input_ids"].tolist()  # the rest as drawn
    # the reference's run is on those states: its logits are the decoder's on them
    session = ort.InferenceSession(str(decoder), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(read.runs[0]["logits"], session.run(["logits"], read.samples[0])[0])
    result = rlx(folder, "-p", "always-f16", "-o", tmp_path / "out", "--provider", "cpu", "-q",
                 "--report-json", tmp_path / "r.json")
    assert result.returncode == 0, result.stdout + result.stderr
    tasks = {Path(m["output"]).name: (m["verify"]["task"]["task"], m["verify"]["task"]["passed"])
             for m in json.loads((tmp_path / "r.json").read_text())["models"]}
    assert tasks == {"encoder_model.onnx": ("embed", True), "decoder_model.onnx": ("generate", True)}


# -- optimum's T5 exported without a cache (its own venv: RLX_AMP_OPTIMUM_PYTHON) ----------------

OPTIMUM_PYTHON = os.environ.get("RLX_AMP_OPTIMUM_PYTHON", "")
_NO_OPTIMUM = ("RLX_AMP_OPTIMUM_PYTHON names no python with optimum-onnx 0.1.0 (it needs transformers 4.57, this "
               "environment has 5.x for torch exports; .ci/run builds one)")


@pytest.mark.slow
@pytest.mark.skipif(not OPTIMUM_PYTHON, reason=_NO_OPTIMUM)
def test_optimums_t5_decoder_without_past_generates(tmp_path: Path) -> None:
    exports = tmp_path / "exports"
    built = subprocess.run([OPTIMUM_PYTHON, str(REPO / "fixtures" / "export_seq2seq_plain.py"), str(exports)],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert built.returncode == 0, built.stderr[-3000:]
    folder = exports / "t5-plain"
    decoder = onnx.load(str(folder / "decoder_model.onnx"))
    assert not [o.name for o in decoder.graph.output if o.name != "logits"]  # no cache out: no present.*
    result = rlx(folder / "decoder_model.onnx", "-p", "always-f16", "-o", tmp_path / "dec.onnx", "--provider", "cpu",
                 "-q", "--report-json", tmp_path / "dec.json")
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = _task(tmp_path / "dec.json")
    assert verdict["task"] == "generate" and verdict["passed"] and verdict["chosen_by"].startswith(
        "auto: a decoder step without a cache")
    assert verdict["outputs"][0]["steps"] == 8 and verdict["outputs"][0]["top1_agreement"] == 1.0
    result = rlx(folder, "-p", "always-f16", "-o", tmp_path / "out", "--provider", "cpu", "-q",
                 "--report-json", tmp_path / "folder.json")
    assert result.returncode == 0, result.stdout + result.stderr
    tasks = {Path(m["output"]).name: (m["verify"]["task"]["task"], m["verify"]["task"]["passed"])
             for m in json.loads((tmp_path / "folder.json").read_text())["models"]}
    assert tasks == {"encoder_model.onnx": ("embed", True), "decoder_model.onnx": ("generate", True)}


def test_a_speech_folders_decoder_starts_from_a_wav_through_its_encoder(tmp_path: Path) -> None:
    """A Whisper-style folder given `--inputs speech.wav`: the encoder takes the wav's log-mel;
    the decoder, which takes no audio, gets the encoder's output on it as its encoder states and
    the folder's start token as its first step, and its generate verdict goes on from there."""
    import wave

    from fixtures.decoders import spectrogram_encoder
    from rlx_onnx_amp.verification.samples import log_mel

    folder = tmp_path / "whisper-like"
    encoder = _save(spectrogram_encoder(), folder / "encoder_model.onnx")
    decoder = _save(cross_decoder(), folder / "decoder_model.onnx")
    extractor = {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 8, "chunk_length": 1,
                 "n_samples": 16000, "hop_length": 160, "n_fft": 400, "sampling_rate": 16000}
    (folder / "preprocessor_config.json").write_text(json.dumps(extractor))
    (folder / "generation_config.json").write_text(json.dumps({"decoder_start_token_id": 3}))
    (folder / "config.json").write_text(json.dumps({"architectures": ["WhisperForConditionalGeneration"]}))
    wav = tmp_path / "speech.wav"
    t = np.arange(12000) / 16000
    write_wav(wav, 16000, 1, np.sin(2 * np.pi * 440 * t) * np.exp(-3 * t) * 12000)
    read = prepare_reference(decoder, VerifyOptions(provider="cpu", inputs=str(wav), encoder=str(encoder)))
    assert len(read.samples) == 1 and read.samples[0]["input_ids"].tolist() == [[3]]
    assert read.inputs_from is not None and read.inputs_from.endswith(
        "through encoder_model.onnx; input_ids the start token 3 (generation_config.json decoder_start_token_id)")
    with wave.open(str(wav)) as w:
        samples = np.frombuffer(w.readframes(12000), np.int16).astype(np.float32) / 32768
    states = ort.InferenceSession(str(encoder), providers=["CPUExecutionProvider"]).run(
        None, {"input_features": log_mel(samples, extractor)[None]})[0]
    np.testing.assert_allclose(read.samples[0]["encoder_hidden_states"], states, rtol=1e-5, atol=1e-5)
    assert read.samples[0]["encoder_attention_mask"].shape == (1, 100) and read.samples[0]["encoder_attention_mask"].all()
    result = rlx(folder, "-p", "always-f16", "-o", tmp_path / "out", "--provider", "cpu", "-q", "--inputs", wav,
                 "--report-json", tmp_path / "r.json")
    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = {Path(m["output"]).name: m["verify"] for m in json.loads((tmp_path / "r.json").read_text())["models"]}
    assert verdicts["decoder_model.onnx"]["task"]["task"] == "generate" and verdicts["decoder_model.onnx"]["task"]["passed"]
    assert "through encoder_model.onnx" in verdicts["decoder_model.onnx"]["inputs_from"]
    assert verdicts["encoder_model.onnx"]["inputs_from"].startswith("samples: 1 wav (16000 Hz, Whisper log-mel")
