"""`--inputs DIR` of .npz files, one input set each, as AutoCast's `--calibration_data` takes a
directory of them (issue 51): sets in name order (batch_2 before batch_10), each checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from fixtures.quantized import WIDTH, float_mlp, symbolic_batch
from tests.helpers import rlx


def _sets(folder: Path, batches: dict[str, int]) -> dict[str, np.ndarray]:
    folder.mkdir()
    written = {}
    for k, (stem, batch) in enumerate(batches.items()):
        x = np.random.default_rng(k).uniform(-1, 1, (batch, WIDTH)).astype(np.float32)
        np.savez(folder / f"{stem}.npz", x=x)
        written[stem] = x
    return written


def test_a_directory_of_npz_files_is_one_input_set_each(tmp_path: Path) -> None:
    src = tmp_path / "mlp.onnx"
    onnx.save(symbolic_batch(float_mlp()), str(src))
    written = _sets(tmp_path / "calib", {"batch_10": 2, "batch_2": 3, "batch_1": 4})
    (tmp_path / "calib" / "notes.txt").write_text("not an input set")
    used, report = tmp_path / "used.npz", tmp_path / "r.json"
    result = rlx(src, "--policy", "auto-mixed", "-o", tmp_path / "out.onnx", "--inputs", tmp_path / "calib",
                 "--save-inputs", used, "--report-json", report)
    assert result.returncode == 0, result.stderr
    saved = np.load(used)
    order = ["batch_1", "batch_2", "batch_10"]
    assert sorted(saved.files) == ["x", "x#1", "x#2"]
    for key, stem in zip(["x", "x#1", "x#2"], order):
        assert np.array_equal(saved[key], written[stem])
    # The cost is counted at the first set's shapes (batch_1: 4 rows), as the run saw them.
    cost = json.loads(report.read_text())["cost"]
    assert cost["input_shapes"] == {"x": [4, WIDTH]} and cost["macs"] == 4 * WIDTH * WIDTH * 3


def test_an_npz_of_the_directory_without_an_input_is_named(tmp_path: Path) -> None:
    src = tmp_path / "mlp.onnx"
    onnx.save(symbolic_batch(float_mlp()), str(src))
    _sets(tmp_path / "calib", {"a": 2})
    np.savez(tmp_path / "calib" / "b.npz", other=np.zeros(3, np.float32))
    result = rlx(src, "-o", tmp_path / "out.onnx", "--inputs", tmp_path / "calib")
    assert result.returncode == 2 and "no value for input(s) x (input set 1)" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = rlx(src, "-o", tmp_path / "out.onnx", "--inputs", empty)
    assert result.returncode == 2 and "no .npz files and no input_N.pb files" in result.stderr
