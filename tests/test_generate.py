"""The `generate` and `detect` tasks (issue 39): a decoder judged by its greedy tokens over
several steps, a detector by its detections matched by class and IoU, each where the
element-wise check of one run says the opposite. Models from fixtures/decoders.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fixtures.decoders import decoder_step, detector
from rlx_onnx_amp.verification.generate import Steps, decode, find_generator, next_feeds
from rlx_onnx_amp.verification.inputs import InputSpec, synthesized_sets
from rlx_onnx_amp.verification.task import Task, choose_task, judge_detection, judge_generation
from rlx_onnx_amp.verification.tolerance import Tolerance
from tests.helpers import rlx

TOL = Tolerance(atol=1e-2, rtol_of_max=1e-2, min_cosine=0.999)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def _greedy(path: Path, steps: int) -> list[np.ndarray]:
    """The file's own greedy tokens from the verification's first synthesized input set, run by
    onnxruntime here (not through the verifier)."""
    model = onnx.load(str(path))
    gen = find_generator(model)
    assert gen is not None
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, dict(feeds))))

    feeds = synthesized_sets(model, InputSpec())[0]
    return decode(gen, run, feeds, run(feeds), steps).tokens


def test_a_decoder_step_is_found_by_its_interface() -> None:
    cached = find_generator(decoder_step())
    assert cached is not None and cached.cached and cached.ids == "input_ids" and cached.logits == "logits"
    assert dict(cached.feedback) == {"past_key_values.0.key": "present.0.key",
                                     "past_key_values.0.value": "present.0.value"}
    assert cached.mask == "attention_mask" and cached.self_cache == "present.0.key"
    whole = find_generator(decoder_step(cached=False))
    assert whole is not None and not whole.cached
    assert find_generator(detector()) is None
    assert choose_task("auto", {"logits": (1, 8, 48)}, cached)[0] is Task.GENERATE
    assert choose_task("classify", {"logits": (1, 8, 48)}, cached)[0] is Task.CLASSIFY


def test_each_step_feeds_the_cache_back_and_a_longer_mask() -> None:
    gen = find_generator(decoder_step())
    assert gen is not None
    feeds = {"input_ids": np.array([[3, 4]]), "attention_mask": np.ones((1, 5), np.int64),
             "past_key_values.0.key": np.zeros((1, 1, 3, 16), np.float32),
             "past_key_values.0.value": np.zeros((1, 1, 3, 16), np.float32)}
    outputs = {"present.0.key": np.ones((1, 1, 5, 16), np.float32), "present.0.value": np.full((1, 1, 5, 16), 2.0)}
    step = next_feeds(gen, feeds, outputs, np.array([7]))
    assert step["input_ids"].tolist() == [[7]] and step["input_ids"].dtype == np.int64
    assert step["attention_mask"].shape == (1, 6) and step["past_key_values.0.key"].shape == (1, 1, 5, 16)
    assert float(step["past_key_values.0.value"].max()) == 2.0
    # optimum's merged seq2seq decoder: its cached branch outputs an empty stand-in for a cache
    # it reuses (the encoder's); the past fed at the first step is fed again.
    outputs["present.0.value"] = np.zeros((0, 1, 1, 16), np.float32)
    step = next_feeds(gen, feeds, outputs, np.array([7]))
    assert step["past_key_values.0.value"] is feeds["past_key_values.0.value"]
    whole = find_generator(decoder_step(cached=False))
    assert whole is not None
    step = next_feeds(whole, {"input_ids": np.array([[3, 4]]), "attention_mask": np.ones((1, 2), np.int64)}, {},
                      np.array([9]))
    assert step["input_ids"].tolist() == [[3, 4, 9]] and step["attention_mask"].shape == (1, 3)


def test_generation_sets_near_tie_steps_apart_and_finds_where_tokens_part() -> None:
    ref = Steps([np.array([[5.0, 1.0, 0.0]]), np.array([[2.0, 2.001, 0.0]]), np.array([[0.0, 3.0, 1.0]])],
                [np.array([0]), np.array([1]), np.array([1])])
    tie_flips = Steps([np.array([[5.1, 1.0, 0.0]]), np.array([[2.001, 2.0, 0.0]]), np.array([[0.0, 3.0, 1.1]])], [])
    result = judge_generation("logits", [ref], [tie_flips], TOL)
    assert result.passed and result.set_apart == 1 and result.top1_agreement == 1.0
    assert result.first_divergence == 1 and result.steps == 3  # free-running, it parts at the tie
    clear_flip = Steps([ref.logits[0], ref.logits[1], np.array([[0.0, 1.0, 3.0]])], [])
    result = judge_generation("logits", [ref], [clear_flip], TOL)
    assert not result.passed and result.top1_agreement == 0.5 and result.first_divergence == 2
    assert result.token_agreement == pytest.approx(2 / 3)


def test_tokens_that_part_fail_though_the_first_step_passes_element_wise(tmp_path: Path) -> None:
    """A cache whose keys grow each step: float16 holds the first step and overflows a few
    steps later. Element-wise on one step passes; the greedy tokens part; the task decides."""
    src = _save(decoder_step(growth=16.0), tmp_path / "grow.onnx")
    none = rlx(src, "-p", "always-f16", "-o", tmp_path / "none.onnx", "--provider", "cpu", "--task", "none", "-q",
               "--report-json", tmp_path / "none.json")
    assert none.returncode == 0, none.stdout + none.stderr
    one = rlx(src, "-p", "always-f16", "-o", tmp_path / "one.onnx", "--provider", "cpu", "--generate-steps", "1", "-q")
    assert one.returncode == 0, one.stdout + one.stderr
    auto = rlx(src, "-p", "always-f16", "-o", tmp_path / "auto.onnx", "--provider", "cpu",
               "--report-json", tmp_path / "auto.json")
    assert auto.returncode == 1, auto.stdout + auto.stderr
    verify = json.loads((tmp_path / "auto.json").read_text())["verify"]
    assert all(o["passed"] for o in verify["outputs"])  # every element-wise row passes at step one
    task = verify["task"]
    assert task["task"] == "generate" and task["chosen_by"].startswith("auto: a decoder step") and not task["passed"]
    result = task["outputs"][0]
    assert result["steps"] == 8 and 0 < result["first_divergence"] < 8 and result["top1_agreement"] < 1
    assert "task generate (auto: a decoder step" in auto.stdout and "free-running first parts at step" in auto.stdout


def test_auto_keeps_the_growing_cache_f32_and_the_written_file_generates_the_same_tokens(tmp_path: Path) -> None:
    src = _save(decoder_step(growth=16.0), tmp_path / "grow.onnx")
    out = tmp_path / "auto.onnx"
    result = rlx(src, "-p", "auto", "-o", out, "--provider", "cpu", "-q", "--report-json", tmp_path / "r.json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    kept = {k["node"]: k["code"] for k in report["kept_f32"]}
    assert "cache_growth" in kept
    assert report["verify"]["task"]["task"] == "generate" and report["verify"]["task"]["passed"]
    assert report["cost"]["mac_low_share"] >= 0.5
    # The written file itself, run by onnxruntime here: the original's greedy tokens, step by step.
    assert [t.tolist() for t in _greedy(out, 8)] == [t.tolist() for t in _greedy(src, 8)]


@pytest.mark.parametrize("cached", [True, False])
def test_a_healthy_decoder_passes_generate(tmp_path: Path, cached: bool) -> None:
    src = _save(decoder_step(cached=cached), tmp_path / "dec.onnx")
    result = rlx(src, "-p", "always-f16", "-o", tmp_path / "out.onnx", "--provider", "cpu", "-q", "--samples", "2",
                 "--report-json", tmp_path / "r.json")
    assert result.returncode == 0, result.stdout + result.stderr
    task = json.loads((tmp_path / "r.json").read_text())["verify"]["task"]
    assert task["task"] == "generate" and task["passed"]
    # --samples 2 at each of the two sizes (the prompt 128 tokens, then 256): four prompts
    assert task["outputs"][0]["rows"] == 4 and task["outputs"][0]["steps"] == 8
    assert "first_divergence" not in task["outputs"][0] and task["outputs"][0]["token_agreement"] == 1.0


def test_generate_on_a_model_that_is_no_decoder_is_bad_usage(tmp_path: Path) -> None:
    src = _save(detector(), tmp_path / "det.onnx")
    result = rlx(src, "-p", "always-f16", "-o", tmp_path / "out.onnx", "--provider", "cpu", "--task", "generate")
    assert result.returncode == 2 and "--task generate: the model is no decoder step" in result.stderr
    assert not (tmp_path / "out.onnx").exists()


# -- detect --------------------------------------------------------------------------------------


def _run(boxes: list[list[float]], scores: list[float], labels: list[int]) -> dict[str, np.ndarray]:
    return {"boxes": np.array(boxes, np.float32), "scores": np.array(scores, np.float32),
            "labels": np.array(labels, np.int64)}


NAMES = ("boxes", "scores", "labels")
REF = _run([[0, 0, 10, 10], [20, 20, 40, 40], [5, 5, 8, 8]], [0.9, 0.8, 0.1], [1, 2, 1])


def test_detections_match_by_class_and_iou_whatever_their_order() -> None:
    reordered = _run([[20, 20, 40, 40.5], [0, 0, 10, 10], [5, 5, 8, 8]], [0.8, 0.9, 0.1], [2, 1, 1])
    result = judge_detection(NAMES, [REF], [reordered], TOL)
    assert result.passed and result.recall == 1.0 and result.precision == 1.0
    assert result.mean_iou is not None and 0.97 < result.mean_iou < 1.0
    moved = _run([[0, 0, 10, 10], [30, 30, 50, 50], [5, 5, 8, 8]], [0.9, 0.8, 0.1], [1, 2, 1])
    result = judge_detection(NAMES, [REF], [moved], TOL)
    assert not result.passed and result.recall == 0.5 and result.precision == 0.5
    relabelled = _run([[0, 0, 10, 10], [20, 20, 40, 40], [5, 5, 8, 8]], [0.9, 0.8, 0.1], [1, 3, 1])
    assert not judge_detection(NAMES, [REF], [relabelled], TOL).passed


def test_a_detection_at_the_score_cut_is_set_apart() -> None:
    ref = _run([[0, 0, 10, 10], [20, 20, 40, 40]], [0.9, 0.505], [1, 2])
    dropped = _run([[0, 0, 10, 10], [20, 20, 40, 40]], [0.9, 0.495], [1, 2])
    result = judge_detection(NAMES, [ref], [dropped], TOL)
    assert result.passed and result.set_apart == 2 and result.recall == 1.0


def test_hugging_face_pred_boxes_are_centres_and_logits_give_scores() -> None:
    logits = np.array([[[0.0, 6.0, 0.0], [5.0, 0.0, 0.0]]], np.float32)  # 1 image, 2 queries, 3 classes
    ref = {"pred_boxes": np.array([[[0.5, 0.5, 0.2, 0.2], [0.2, 0.2, 0.1, 0.1]]], np.float32), "logits": logits}
    cand = {"pred_boxes": ref["pred_boxes"][:, ::-1].copy(), "logits": logits[:, ::-1].copy()}
    assert choose_task("auto", {"pred_boxes": (1, 2, 4), "logits": (1, 2, 3)})[:2] == (
        Task.DETECT, ("pred_boxes", "logits"))
    result = judge_detection(("pred_boxes", "logits"), [ref], [cand], TOL)
    assert result.passed and result.recall == 1.0 and result.mean_iou == pytest.approx(1.0)


def test_a_detector_whose_rows_trade_places_passes_on_its_detections(tmp_path: Path) -> None:
    """Near-tied scores sort another way in float16: element-wise, box rows are compared with
    other boxes and fail; matched by class and IoU, every detection is there."""
    src = _save(detector(), tmp_path / "det.onnx")
    none = rlx(src, "-p", "always-f16", "-o", tmp_path / "none.onnx", "--provider", "cpu", "--task", "none", "-q")
    assert none.returncode == 1 and "boxes" in none.stdout
    auto = rlx(src, "-p", "always-f16", "-o", tmp_path / "auto.onnx", "--provider", "cpu", "-q",
               "--report-json", tmp_path / "r.json")
    assert auto.returncode == 0, auto.stdout + auto.stderr
    verify = json.loads((tmp_path / "r.json").read_text())["verify"]
    assert not {o["name"]: o["passed"] for o in verify["outputs"]}["boxes"]
    task = verify["task"]
    assert task["task"] == "detect" and task["chosen_by"] == "auto: output 'boxes'" and task["passed"]
    result = task["outputs"][0]
    assert result["recall"] == 1.0 and result["precision"] == 1.0 and result["mean_iou"] > 0.99
