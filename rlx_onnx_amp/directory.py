"""An export directory as one unit: what optimum (`optimum-cli export onnx`) and
onnxruntime-genai's model builder write, and what `ORTModelFor*` and `onnxruntime_genai.Model`
load.

`rlx-amp EXPORT_DIR --policy P -o OUT_DIR` converts every `.onnx` file of the directory (its
subdirectories included) under its own relative name, and copies every other file unchanged
(`config.json`, `generation_config.json`, tokenizer files, `genai_config.json`, whose 0.18
fields name inputs and outputs but hold no types), except the external data files the models
read: the converted models write their own (`OUT.<hash>.data`, see `files`). The directory is
staged beside `OUT_DIR` and put in place only when every model converted (exit 0, 1 or 4), in
place of an earlier `OUT_DIR`: whole, or not at all.

Across the files of one directory, the past and present key/value caches share one element
type (a generator feeds `present.N.key` back as `past_key_values.N.key`): a conversion that
gives them two (with `--no-keep-io-types`) is refused, naming the pair.

onnxruntime-genai's builder leaves the cache's head size a symbolic axis (`kv_cache_dim`) that
no synthesized input can guess; its `genai_config.json` holds it (`decoder.head_size`, with
`num_key_value_heads`): the decoder's cache inputs are verified at those sizes
(`genai_cache_shapes`) unless `--shape` gives them.

optimum leaves every axis of an image model's `pixel_values` symbolic, and a guessed 8x8 image
cannot run a ViT or a ResNet; the folder's `preprocessor_config.json` (its crop or resize size)
and `config.json` (`num_channels`, `image_size`) hold the real ones: every model of the folder
with such an input is verified at batch 1 and those sizes (`config_shapes`) unless `--shape`
gives them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.files import STAGE_PREFIX, private_dir, remove_private_dir
from rlx_onnx_amp.loading import load_model
from rlx_onnx_amp.stops import signals_deferred
from rlx_onnx_amp.tensors import WeightSource, is_external
from rlx_onnx_amp.types import DEFAULT_DIM, all_tensors

__all__ = [
    "ExportDir",
    "StagedDirectory",
    "check_cache_types",
    "config_shapes",
    "config_task",
    "genai_cache_shapes",
    "scan_export_dir",
    "with_genai_folder_hint",
]

logger = logging.getLogger(__name__)

#: A cache input or output of a generator and the layer/part it holds: `past_key_values.0.key`
#: (optimum, genai), `past.0.key`, `present.0.key`, `present.0.decoder.key` (seq2seq).
_CACHE = re.compile(r"^(?:past_key_values|past|present)\.(?P<part>.+)$")
_OLD_PREFIX = ".rlx-amp-old-"
GENAI_CONFIG = "genai_config.json"


@dataclass
class ExportDir:
    """The files of an export directory, relative to its root."""

    root: Path
    models: list[Path] = field(default_factory=list)
    data: set[Path] = field(default_factory=set)  # external data the models read: rewritten, not copied
    others: list[Path] = field(default_factory=list)  # copied unchanged
    #: Directories without a file (a sentence-transformers `2_Normalize/`): made again, empty.
    empty_dirs: list[Path] = field(default_factory=list)


def scan_export_dir(root: str | os.PathLike[str]) -> ExportDir:
    """The models, their data files and the other files of `root`; links are not followed out
    of it, and a directory without a model is bad input."""
    base = Path(root)
    found = ExportDir(base)
    for path in sorted(_files(base, found.empty_dirs)):
        (found.models if path.suffix == ".onnx" else found.others).append(path)
    if not found.models:
        raise InputError(f"{base}: no .onnx model in the directory")
    for rel in found.models:
        model = load_model(base / rel)  # an unreadable model is an InputError naming it
        source = WeightSource((base / rel).parent, str(base / rel))
        for tensor in all_tensors(model):
            if is_external(tensor):
                found.data.add(source.external_path(tensor).resolve().relative_to(base.resolve()))
        del model
    found.others = [p for p in found.others if p not in found.data]
    return found


def _files(base: Path, empty_dirs: list[Path]) -> Iterator[Path]:
    """The files under `base`, relative to it; the directories that hold nothing go to `empty_dirs`."""
    for directory, subdirs, files in os.walk(base):
        subdirs[:] = [d for d in subdirs if not d.startswith((STAGE_PREFIX, _OLD_PREFIX))]
        if not subdirs and not files and Path(directory) != base:
            empty_dirs.append(Path(directory).relative_to(base))
        for name in files:
            path = Path(directory) / name
            if path.is_symlink() and not path.resolve().is_relative_to(base.resolve()):
                raise InputError(f"{path}: a link out of the export directory")
            yield path.relative_to(base)


class StagedDirectory:
    """The output directory, written into a private staging directory beside it and put in
    place by `commit`; leaving the `with` block without a commit removes it."""

    def __init__(self, final: str | os.PathLike[str]) -> None:
        self.final = Path(final)
        parent = self.final.parent if str(self.final.parent) else Path(".")
        if self.final.exists() and not self.final.is_dir():
            raise InputError(f"{self.final}: the output directory path exists and is not a directory")
        if not parent.is_dir():
            raise InputError(f"{self.final}: directory {parent} of the output does not exist")
        self.root = private_dir(STAGE_PREFIX, parent)
        os.chmod(self.root, 0o777 & ~_umask())  # a directory's usual mode once in place

    def __enter__(self) -> StagedDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        remove_private_dir(self.root)  # after a commit it is the output's path no more

    def path(self, rel: Path) -> Path:
        """Where the output file `rel` is staged (its directory made)."""
        staged = self.root / rel
        staged.parent.mkdir(parents=True, exist_ok=True)
        return staged

    def make_dir(self, rel: Path) -> None:
        (self.root / rel).mkdir(parents=True, exist_ok=True)

    def copy(self, source: Path, rel: Path) -> None:
        try:
            shutil.copy2(source, self.path(rel))
        except OSError as e:
            raise InputError(f"{source}: cannot copy into {self.final} ({e.strerror})") from None

    def commit(self) -> None:
        """Put the staged directory in place of `final` (an earlier one is moved aside first,
        then removed). Signals wait until both renames are done."""
        with signals_deferred(committing=True):
            old = None
            if self.final.exists():
                old = Path(tempfile.mkdtemp(prefix=_OLD_PREFIX, dir=self.root.parent))
                os.rename(self.final, old / "previous")
            os.rename(self.root, self.final)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_cache_types(root: Path, models: list[Path]) -> None:
    """Every past/present cache value of the directory's models (paths relative to `root`) has
    one element type per layer and part; InputError names a pair that does not."""
    seen: dict[str, tuple[str, str, int]] = {}  # part -> (file, value, elem type)
    for rel in models:
        file = str(rel)
        model = onnx.load(str(root / rel), load_external_data=False)
        for vi in (*model.graph.input, *model.graph.output):
            match = _CACHE.match(vi.name)
            if not match or not vi.type.HasField("tensor_type"):
                continue
            elem = vi.type.tensor_type.elem_type
            part = match.group("part")
            if part in seen and seen[part][2] != elem:
                other_file, other, other_elem = seen[part]
                raise InputError(
                    f"{file}: {vi.name} is {_type_name(elem)} but {other} in {other_file} is {_type_name(other_elem)}: "
                    "a generator feeds one back as the other (keep them one type: drop --no-keep-io-types)"
                )
            seen.setdefault(part, (file, vi.name, elem))


def genai_cache_shapes(root: Path) -> dict[Path, dict[str, tuple[int, ...]]]:
    """The shapes to verify the cache inputs of the decoder that `root`'s genai_config.json
    names at (path relative to `root` -> input -> shape): batch 1, the config's key/value heads,
    `DEFAULT_DIM` past positions and its head size on the symbolic axes, the declared sizes on
    the others. No shape for an input of another rank or with no symbolic axis the config
    fills; {} without a config that names them (the inputs are then guessed, and a verification that
    cannot run says what it needs)."""
    try:
        decoder = json.loads((root / GENAI_CONFIG).read_text(encoding="utf-8"))["model"]["decoder"]
        rel = Path(decoder["filename"])
        heads, head_size = int(decoder["num_key_value_heads"]), int(decoder["head_size"])
        patterns = [decoder["inputs"][k] for k in ("past_key_names", "past_value_names")]
        names = {pattern % layer for pattern in patterns for layer in range(int(decoder["num_hidden_layers"]))}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as e:  # unreadable or another schema: guess
        logger.info("%s: no cache sizes from %s (%s: %s)", root, GENAI_CONFIG, type(e).__name__, e)
        return {}
    if not (root / rel).is_file():
        return {}
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in load_model(root / rel).graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in names or len(dims) != 4:
            continue
        filled, symbolic = _filled(dims, (1, heads, DEFAULT_DIM, head_size))
        if symbolic[1] or symbolic[3]:
            shapes[vi.name] = filled
    return {rel: shapes} if shapes else {}


#: Image inputs whose sizes a Hugging Face folder's configs hold: (batch, channels, height, width).
_IMAGE_INPUTS = ("pixel_values",)
PREPROCESSOR_CONFIG = "preprocessor_config.json"


def config_shapes(root: Path, models: list[Path]) -> dict[Path, dict[str, tuple[int, ...]]]:
    """The shapes to verify the image inputs of the folder's models at (path relative to `root`
    -> input -> shape), from its Hugging Face configs: batch 1, `num_channels` (3 when not
    given), the preprocessor's crop size (else its resize size, else `config.json`'s
    `image_size`) on the symbolic axes, the declared sizes on the others. {} where the configs
    give no size (the input is then guessed, and a verification that cannot run says so)."""
    config, pre = _json_file(root / "config.json"), _json_file(root / PREPROCESSOR_CONFIG)
    height_width = _image_size(pre, config)
    if height_width is None:
        return {}
    channels = config.get("num_channels", 3)
    fill = (1, channels if isinstance(channels, int) and channels > 0 else 3, *height_width)
    found: dict[Path, dict[str, tuple[int, ...]]] = {}
    for rel in models:
        for vi in load_model(root / rel).graph.input:
            dims = vi.type.tensor_type.shape.dim
            if vi.name not in _IMAGE_INPUTS or len(dims) != 4:
                continue
            filled, symbolic = _filled(dims, fill)
            if any(symbolic):
                found.setdefault(rel, {})[vi.name] = filled
    return found


def _filled(dims: Sequence[onnx.TensorShapeProto.Dimension], fill: Sequence[int]) -> tuple[tuple[int, ...], list[bool]]:
    """An input's declared sizes with its symbolic axes taken from `fill` (as long as `dims`),
    and which axes were symbolic."""
    symbolic = [not (d.HasField("dim_value") and d.dim_value > 0) for d in dims]
    return tuple(f if sym else d.dim_value for d, f, sym in zip(dims, fill, symbolic)), symbolic


def _json_file(path: Path) -> dict:
    """A JSON object file's content; {} where there is none or it is no object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        logger.info("%s: not read (%s: %s)", path, type(e).__name__, e)
        return {}
    return data if isinstance(data, dict) else {}


def _image_size(pre: dict, config: dict) -> tuple[int, int] | None:
    """(height, width) an image model's preprocessor feeds it: the center crop where it crops,
    else the resize size (`{"height", "width"}`, a square `shortest_edge`, or an int), else the
    model config's `image_size`."""
    candidates = [pre.get("crop_size") if pre.get("do_center_crop", True) else None, pre.get("size"),
                  config.get("image_size")]
    for size in candidates:
        if isinstance(size, int) and size > 0:
            return size, size
        if isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size):
            return size[0], size[1]
        if isinstance(size, dict):
            if isinstance(size.get("height"), int) and isinstance(size.get("width"), int):
                return size["height"], size["width"]
            if isinstance(size.get("shortest_edge"), int):
                return size["shortest_edge"], size["shortest_edge"]
    return None


#: A Hugging Face `config.json` architecture's name ending -> the task its exports do (the
#: first ending that matches; a bare encoder, `BertModel`, computes embeddings).
_ARCHITECTURE_TASKS = (
    ("LMHeadModel", "generate"),
    ("ForCausalLM", "generate"),
    ("ForConditionalGeneration", "generate"),
    ("ForSpeechSeq2Seq", "generate"),
    ("ForObjectDetection", "detect"),
    ("ForSemanticSegmentation", "segment"),
    ("ForImageClassification", "classify"),
    ("ForSequenceClassification", "classify"),
    ("ForAudioClassification", "classify"),
    ("ForTokenClassification", "classify"),
    ("Model", "embed"),
)
#: sentence-transformers' module list: its folder's model computes embeddings.
_SENTENCE_TRANSFORMERS = "modules.json"


def config_task(root: Path) -> tuple[str, str] | None:
    """The task an export folder's configs name, and where: onnxruntime-genai's
    genai_config.json (generate), sentence-transformers' modules.json (embed), or the first
    `config.json` architecture `_ARCHITECTURE_TASKS` knows; None where none does."""
    if (root / GENAI_CONFIG).is_file():
        return "generate", GENAI_CONFIG
    if (root / _SENTENCE_TRANSFORMERS).is_file():
        return "embed", f"{_SENTENCE_TRANSFORMERS} (sentence-transformers)"
    architectures = _json_file(root / "config.json").get("architectures")
    for name in architectures if isinstance(architectures, list) else []:
        for ending, task in _ARCHITECTURE_TASKS:
            if isinstance(name, str) and name.endswith(ending):
                return task, f"config.json architectures {name}"
    return None


def with_genai_folder_hint(error: InputError, model: Path) -> InputError:
    """`error` (a verification's guessed cache sizes) for a model converted or verified alone
    from an onnxruntime-genai folder, saying where the sizes are: the folder's
    genai_config.json, which that run does not read; elsewhere `error` as it is."""
    folder = model.parent
    if not (folder / GENAI_CONFIG).is_file():
        return error
    return InputError(
        f"{error}; {folder} holds a {GENAI_CONFIG}: `rlx-amp {folder} -o OUT_DIR` converts the folder and "
        "verifies its decoder at the cache sizes the config gives"
    )


def _type_name(elem: int) -> str:
    return onnx.helper.tensor_dtype_to_string(elem).removeprefix("TensorProto.").lower()

