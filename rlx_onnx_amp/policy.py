"""Precision policies: a declarative map from op kind to precision (docs/design.md, "Op taxonomy and policies")."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlx_onnx_amp.errors import PolicyError
from rlx_onnx_amp.precision import PRECISIONS, Precision
from rlx_onnx_amp.taxonomy import OpKind

__all__ = ["AUTO", "POLICY_NAMES", "Policy", "parse_kind_map", "policy_from_name"]

_K = OpKind
_F32, _F16, _BF16 = Precision.F32, Precision.F16, Precision.BF16

#: The preset policies, straight from the seed's `precision_for` (the code is the spec).
_PRESETS: Mapping[str, Mapping[OpKind, Precision]] = {
    "always-f32": {},
    "always-f16": {_K.COMPUTE: _F16, _K.REDUCTION: _F16, _K.ELEMENTWISE: _F16, _K.DATA_MOVEMENT: _F16},
    "auto-mixed-conservative": {_K.ELEMENTWISE: _F16},
    "auto-mixed": {_K.REDUCTION: _F16, _K.ELEMENTWISE: _F16},
    "auto-mixed-bf16": {
        _K.COMPUTE: _BF16,
        _K.REDUCTION: _BF16,
        _K.ELEMENTWISE: _BF16,
        _K.DATA_MOVEMENT: _BF16,
    },
}

#: The policy that searches: every kind at the low precision (f16, or bf16 with `--low bf16`),
#: then the fewest nodes kept in f32 that make the verdict pass (`repair`): the most
#: low-precision compute that passes. Its kinds are where the search starts.
AUTO = "auto"
POLICY_NAMES: tuple[str, ...] = (*_PRESETS, AUTO, "custom")


@dataclass(frozen=True)
class Policy:
    """Which precision each op kind runs at. Kinds not in `kinds` stay f32; Boundary is
    always f32 (user-facing values keep their type)."""

    name: str
    kinds: Mapping[OpKind, Precision] = field(default_factory=dict)

    def precision_for(self, kind: OpKind) -> Precision:
        if kind is OpKind.BOUNDARY:
            return Precision.F32
        return self.kinds.get(kind, Precision.F32)

    @property
    def searches(self) -> bool:
        """Whether the policy is a search (`auto`): converted, verified and kept in f32 where
        it drifts, rather than applied as it is."""
        return self.name == AUTO

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "kinds": {k.value: self.precision_for(k).value for k in OpKind}}

    @staticmethod
    def json_schema() -> dict[str, Any]:
        """The JSON Schema of `to_json` (the report's `policy`)."""
        return {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "kinds": {
                    "type": "object",
                    "properties": {k.value: {"enum": [p.value for p in Precision]} for k in OpKind},
                    "required": [k.value for k in OpKind],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "kinds"],
            "additionalProperties": False,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Policy:
        """The policy `to_json` wrote (a report's `policy`); kinds at f32, the default, are left out."""
        kinds = {OpKind(kind): Precision(precision) for kind, precision in data["kinds"].items()}
        return cls(str(data["name"]), {k: p for k, p in kinds.items() if p is not Precision.F32})


_KIND_ALIASES = {k.value: k for k in OpKind} | {
    "data_movement": OpKind.DATA_MOVEMENT,
    "data-movement": OpKind.DATA_MOVEMENT,
}
_PRECISION_ALIASES = {name: p for p, info in PRECISIONS.items() for name in (p.value, *info.aliases)}


def _kind_precision(kind: str, precision: str, where: str) -> tuple[OpKind, Precision]:
    k = _KIND_ALIASES.get(kind.strip().lower())
    if k is None:
        raise PolicyError(f"{where}: unknown kind {kind!r} (known: {', '.join(x.value for x in OpKind)})")
    p = _PRECISION_ALIASES.get(str(precision).strip().lower())
    if p is None:
        raise PolicyError(f"{where}: unknown precision {precision!r} for {kind} (known: f32, f16, bf16)")
    if k is OpKind.BOUNDARY and p is not Precision.F32:
        raise PolicyError(
            f"{where}: boundary={p.value} would do nothing: graph inputs, outputs, initializers and Constants keep "
            "their types at the boundary and take their consumers' precision inside"
        )
    return k, p


def kind_map_from(mapping: Mapping[Any, Any]) -> dict[OpKind, Precision]:
    """A kind map given in the API: OpKind/Precision members or their names ("compute": "f16")."""
    result: dict[OpKind, Precision] = {}
    for kind, precision in mapping.items():
        k = kind.value if isinstance(kind, OpKind) else str(kind)
        p = precision.value if isinstance(precision, Precision) else str(precision)
        key, value = _kind_precision(k, p, where="kind_map")
        result[key] = value
    return result


def parse_kind_map(text: str) -> dict[OpKind, Precision]:
    """Parse `compute=f16,reduction=f32,...` into a kind map."""
    result: dict[OpKind, Precision] = {}
    for item in filter(None, (s.strip() for s in re.split(r"[,\s]+", text))):
        if "=" not in item:
            raise PolicyError(f"--map: expected KIND=PRECISION, got {item!r}")
        kind_text, precision_text = item.split("=", 1)
        k, p = _kind_precision(kind_text, precision_text, where="--map")
        result[k] = p
    return result


def load_kind_map_file(path: Path) -> dict[OpKind, Precision]:
    """Read a kind map from a JSON or TOML file with the same keys as `--map`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(f"{path}: cannot read map file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not a valid map file (not UTF-8 text)") from None
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise PolicyError(
            f"{path}: not a valid {'TOML' if path.suffix.lower() == '.toml' else 'JSON'} map ({e})"
        ) from None
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: expected a table of kind = precision")
    return dict(_kind_precision(str(k), str(v), where=str(path)) for k, v in data.items())


def policy_from_name(
    name: str, kind_map: Mapping[OpKind, Precision] | None = None, low: Precision = Precision.F16
) -> Policy:
    """Build a policy by CLI name; `custom` needs `kind_map`; `low` is where `auto` starts."""
    if low is not Precision.F16 and name != AUTO:
        raise PolicyError(f"--low only goes with --policy auto, not {name!r}")
    if name == AUTO:
        if kind_map:
            raise PolicyError("--map/--map-file only go with --policy custom, not 'auto'")
        if low is Precision.F32:
            raise PolicyError("--low f32 would search nothing: give f16 or bf16")
        return Policy(AUTO, {k: low for k in OpKind if k is not OpKind.BOUNDARY})
    if name == "custom":
        if kind_map is None:
            raise PolicyError("policy 'custom' needs --map or --map-file")
        return Policy("custom", dict(kind_map))
    if kind_map:
        raise PolicyError(f"--map/--map-file only go with --policy custom, not {name!r}")
    if name not in _PRESETS:
        raise PolicyError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
    return Policy(name, _PRESETS[name])
