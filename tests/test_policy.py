"""Parsing of policies and custom kind maps."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx_onnx_amp.errors import PolicyError
from rlx_onnx_amp.policy import load_kind_map_file, parse_kind_map, policy_from_name
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.taxonomy import OpKind


def test_parse_kind_map() -> None:
    m = parse_kind_map("compute=f16, reduction=f32,elementwise=fp16,datamovement=bf16")
    assert m == {OpKind.COMPUTE: Precision.F16, OpKind.REDUCTION: Precision.F32,
                 OpKind.ELEMENTWISE: Precision.F16, OpKind.DATA_MOVEMENT: Precision.BF16}


@pytest.mark.parametrize("text, message", [
    ("compute=f8", "unknown precision"), ("matmul=f16", "unknown kind"), ("compute", "expected KIND=PRECISION"),
])
def test_bad_kind_maps(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_kind_map(text)


def test_map_files(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text('{"compute": "f16", "reduction": "f32"}')
    (tmp_path / "m.toml").write_text('compute = "f16"\nelementwise = "bf16"\n')
    assert load_kind_map_file(tmp_path / "m.json") == {OpKind.COMPUTE: Precision.F16, OpKind.REDUCTION: Precision.F32}
    assert load_kind_map_file(tmp_path / "m.toml") == {OpKind.COMPUTE: Precision.F16, OpKind.ELEMENTWISE: Precision.BF16}
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PolicyError, match="not a valid JSON"):
        load_kind_map_file(tmp_path / "bad.json")


def test_policy_names() -> None:
    with pytest.raises(PolicyError, match="unknown policy"):
        policy_from_name("fastest")
    with pytest.raises(PolicyError, match="needs --map"):
        policy_from_name("custom")
    with pytest.raises(PolicyError, match="only go with --policy custom"):
        policy_from_name("auto-mixed", {OpKind.COMPUTE: Precision.F16})
