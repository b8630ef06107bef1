"""Samples in the user's terms (issue 50): `--inputs` takes image files, wav audio, text (one
prompt per line) and directories of them, made into the model's inputs as its own folder's
preprocessing makes them.

One input set per image or wav file, one per line of a text file; a directory's files in name
order (`img_2` before `img_10`). The model's folder is the model file's directory (or, for a
hub repository's `onnx/` folder, its parent): `preprocessor_config.json` and `tokenizer.json`.

- image (`.png .jpg .jpeg .bmp .webp`, read by Pillow) into the one 4-D input, NCHW or NHWC by
  its fixed channel axis, batch 1: by the folder's `preprocessor_config.json` (`size` as
  height/width or shortest edge, `crop_size` where it crops, ConvNext's `crop_pct`, `resample`, `rescale_factor`,
  `image_mean`/`image_std`), else by ultralytics metadata (letterbox to `imgsz`, gray 114
  padding, /255), else to the input's fixed height and width (else 224), /255, ImageNet
  mean/std for 3 channels. One channel: grayscale. An integer input gets the pixels as they are.
- audio (`.wav`, PCM, read by the standard library): mixed down to mono, scaled to [-1, 1],
  resampled linearly to the folder's `sampling_rate` (else 16000), into the one float input of
  rank 1 or 2 (padded or cut where its length is fixed); wav2vec2's `do_normalize` to zero mean
  and unit variance; a Whisper folder's `input_features`: its log-mel spectrogram (`log_mel`).
  An integer scalar `sr` input gets the rate.
- text (`.txt`, through `tokenizers` and the folder's `tokenizer.json`): `input_ids`, with
  `attention_mask` ones and `token_type_ids` zeros where the model takes them.

`Preprocess` (the CLI's `--preprocess size=HxW`, `mean=`, `std=`, `rate=`) overrides the
folder's values. Every input a sample leaves unfilled is synthesized as without samples (the
`fill` the caller passes: `inputs.load_inputs`). A sample the model cannot take, or a reader
that is not installed, is an `InputError` naming the file.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import logging
import math
import re
import wave
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
from onnx import helper

from rlx_onnx_amp.errors import InputError, first_line
from rlx_onnx_amp.verification.sizes import metadata

__all__ = [
    "SUFFIXES",
    "Preprocess",
    "SampleKind",
    "SampleSets",
    "folder_json",
    "folder_positions",
    "is_samples",
    "log_mel",
    "parse_preprocess",
    "read_samples",
]

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]
Feeds = dict[str, np.ndarray]
#: Inputs given their shapes (name -> shape), set k -> a synthesized feed for every input.
Fill = Callable[[Mapping[str, Shape], int], Feeds]


class SampleKind(enum.Enum):
    IMAGE = "image"
    AUDIO = "audio"
    TEXT = "text"


#: A sample file's suffix -> what it holds.
SUFFIXES: Mapping[str, SampleKind] = {
    ".png": SampleKind.IMAGE, ".jpg": SampleKind.IMAGE, ".jpeg": SampleKind.IMAGE,
    ".bmp": SampleKind.IMAGE, ".webp": SampleKind.IMAGE,
    ".wav": SampleKind.AUDIO,
    ".txt": SampleKind.TEXT,
}  # fmt: skip

_INSTALL = 'pip install "rlx-amp[samples]"'
PREPROCESSOR_CONFIG, TOKENIZER = "preprocessor_config.json", "tokenizer.json"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEFAULT_SIDE, DEFAULT_RATE, LETTERBOX_GRAY = 224, 16000, 114
#: A channel count -> the Pillow mode the image is converted to.
_MODES: Mapping[int, str] = {1: "L", 3: "RGB", 4: "RGBA"}
#: An integer scalar input that holds the sample rate.
_RATE_INPUT = re.compile(r"^(sr|sample_?rate|sampling_?rate)$", re.I)
_AUDIO_NAME = re.compile(r"audio|wav|pcm|signal|speech|waveform|input_values|samples", re.I)
_IMAGE_NAMES = ("pixel_values", "images", "image", "input", "x")
#: wave's sample width in bytes -> the integer type it holds and its offset (8-bit is unsigned).
_PCM: Mapping[int, tuple[type[np.integer], int]] = {1: (np.uint8, 128), 2: (np.int16, 0), 4: (np.int32, 0)}


@dataclass(frozen=True)
class Preprocess:
    """What the user overrides of a sample's preprocessing (`--preprocess KEY=VALUE`)."""

    size: tuple[int, int] | None = None  # an image's final height and width
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    rate: int | None = None  # audio's sample rate


def parse_preprocess(items: Sequence[str]) -> Preprocess:
    """`["size=224x224", "mean=0.5,0.5,0.5", "std=0.5", "rate=16000"]` -> Preprocess."""
    found: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            if key == "size":
                h, w = (int(v) for v in value.split("x"))
                if h < 1 or w < 1:
                    raise ValueError
                found[key] = (h, w)
            elif key in ("mean", "std"):
                found[key] = tuple(float(v) for v in value.split(","))
                if key == "std" and not all(v > 0 for v in found[key]):
                    raise ValueError
            elif key == "rate":
                found[key] = int(value)
                if found[key] < 1:
                    raise ValueError
            else:
                raise ValueError
        except ValueError:
            raise InputError(
                f"--preprocess: expected size=HxW, mean=R,G,B, std=R,G,B (positive) or rate=HZ, got {item!r}"
            ) from None
    return Preprocess(**found)


class SampleSets(list[Feeds]):
    """Input sets made from samples, and what they were made from (`Verification.inputs_from`)."""

    def __init__(self, sets: Sequence[Feeds], source: str) -> None:
        super().__init__(sets)
        self.source = source


def _sample_files(p: Path) -> list[Path]:
    if p.is_file():
        return [p] if p.suffix.lower() in SUFFIXES else []
    files = [f for f in p.iterdir() if f.is_file() and f.suffix.lower() in SUFFIXES]
    return sorted(files, key=lambda f: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", f.name)])


def is_samples(p: Path) -> bool:
    """Whether `p` is a sample file, or a directory that holds some."""
    return (p.is_file() or p.is_dir()) and bool(_sample_files(p))


def _need(module: str, package: str, file: Path, what: str) -> ModuleType:
    """The reader's module, or one line saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InputError(f"{file}: {what} needs {package}: {_INSTALL}") from None


def _folder_file(folder: Path | None, name: str) -> Path | None:
    """The folder's config file `name`, or its parent's (a hub repository's `onnx/` folder)."""
    for place in (folder, folder.parent if folder is not None else None):
        if place is not None and (place / name).is_file():
            return place / name
    return None


def folder_json(folder: Path | None, name: str) -> dict[str, Any]:
    """The folder's (or its parent's) JSON config `name` as a hint: {} where there is none or it
    cannot be read (logged), as a model without the file."""
    try:
        return _json(_folder_file(folder, name))
    except InputError as e:
        logger.info("%s", e)
        return {}


def _json(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable JSON file ({first_line(e)})") from None
    return data if isinstance(data, dict) else {}


#: config.json keys that bound a text model's token positions, the decoder's own first (Whisper
#: and BART write `max_target_positions` beside the encoder's `max_source_positions`).
POSITION_KEYS = ("max_target_positions", "max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length")
#: The inputs that say a model reads token positions (an audio encoder's frames have other limits).
_TOKEN_INPUTS = ("input_ids", "decoder_input_ids")


def folder_positions(model: onnx.ModelProto, folder: Path | None) -> tuple[int, str] | None:
    """The most token positions a model that reads `input_ids` may take, from its folder's
    config.json (`POSITION_KEYS`), and where that is written; None where nothing says. A tiny
    export's 64 positions, and Whisper's 448, are fewer than a guessed sequence and its past."""
    if not any(vi.name in _TOKEN_INPUTS for vi in _inputs(model)):
        return None
    config = folder_json(folder, "config.json")
    for key in POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"config.json {key} {value}"
    return None


def _inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits and vi.type.HasField("tensor_type")]


def _dtype(vi: onnx.ValueInfoProto) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))


def _dims(vi: onnx.ValueInfoProto) -> list[int | None]:
    """Each axis' fixed size, None where symbolic."""
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in vi.type.tensor_type.shape.dim]


def _described(model: onnx.ModelProto) -> str:
    return ", ".join(
        f"{vi.name} [{', '.join(str(d or '?') for d in _dims(vi))}] {_dtype(vi)}" for vi in _inputs(model)
    )


class _Reader:
    """Reads the sample files of one `--inputs` into input sets for one model."""

    def __init__(self, model: onnx.ModelProto, folder: Path | None, preprocess: Preprocess, fill: Fill) -> None:
        self.model, self.folder, self.pre, self.fill = model, folder, preprocess, fill
        self.config_path = _folder_file(folder, PREPROCESSOR_CONFIG)
        self.config = _json(self.config_path)
        self.how: dict[SampleKind, str] = {}  # what made each kind's inputs, for the report

    def refuse(self, file: Path, why: str) -> InputError:
        return InputError(f"{file}: {why}; the model's inputs: {_described(self.model)}")

    def sets(self, file: Path) -> list[Feeds]:
        kind = SUFFIXES[file.suffix.lower()]
        if kind is SampleKind.TEXT:
            return self.text(file)
        filled = self.image(file) if kind is SampleKind.IMAGE else self.audio(file)
        return [filled]

    def complete(self, given: Feeds, k: int, ones: Sequence[str] = (), zeros: Sequence[str] = ()) -> Feeds:
        """`given` with every other input synthesized at the sizes `given` fixes (set `k`'s seed);
        masks named in `ones` all ones and `zeros` all zeros, where the model takes them."""
        names = {vi.name for vi in _inputs(self.model)}
        feeds = self.fill({n: v.shape for n, v in given.items()}, k)
        feeds.update(given)
        for names_, value in ((ones, 1), (zeros, 0)):
            for n in names_:
                if n in names:
                    feeds[n] = np.full(feeds[n].shape, value, dtype=feeds[n].dtype)
        return feeds

    # ---- images --------------------------------------------------------------------------------

    def _image_input(self, file: Path) -> tuple[onnx.ValueInfoProto, bool, int]:
        """The image input, whether it is NHWC, and its channel count."""
        found = [vi for vi in _inputs(self.model) if len(vi.type.tensor_type.shape.dim) == 4
                 and _dtype(vi).kind in "fu"]
        named = [vi for vi in found if vi.name in _IMAGE_NAMES]
        if len(found) > 1 and len(named) == 1:
            found = named
        if len(found) != 1:
            why = "no 4-D image input" if not found else f"{len(found)} 4-D inputs and none named {_IMAGE_NAMES[0]}"
            raise self.refuse(file, f"an image sample needs one image input (N x C x H x W or N x H x W x C), "
                                    f"the model has {why}")
        vi = found[0]
        dims = _dims(vi)
        nhwc = dims[1] not in _MODES and dims[3] in _MODES
        channels = dims[3 if nhwc else 1] or 3
        if channels not in _MODES:
            raise self.refuse(file, f"input {vi.name!r} takes {channels} channels; an image has 1, 3 or 4")
        return vi, nhwc, channels

    def image(self, file: Path) -> Feeds:
        vi, nhwc, channels = self._image_input(file)
        image_module = _need("PIL.Image", "Pillow", file, "reading an image")
        try:
            with image_module.open(file) as opened:
                img = opened.convert(_MODES[channels])
        except (OSError, ValueError) as e:
            raise InputError(f"{file}: not a readable image ({first_line(e)})") from None
        dims = _dims(vi)
        fixed = (dims[1], dims[2]) if nhwc else (dims[2], dims[3])
        steps = image_steps(self.config, metadata(self.model), self.pre, fixed, channels)
        where = "" if self.config_path is None else f"{PREPROCESSOR_CONFIG}: "
        self.how[SampleKind.IMAGE] = f"{where}{steps.source}"
        raw = _dtype(vi).kind in "iu"  # an integer input takes the pixels as they are
        pixels = steps.apply(img, raw)
        if nhwc:
            pixels = pixels.transpose(1, 2, 0)
        return self.complete({vi.name: pixels[None].astype(_dtype(vi))}, 0)

    # ---- audio ---------------------------------------------------------------------------------

    def audio(self, file: Path) -> Feeds:
        cfg = self.config
        rate = self.pre.rate or int(cfg.get("sampling_rate") or DEFAULT_RATE)
        wav, original = read_wav(file)
        notes = [f"{rate} Hz"] if original == rate else [f"resampled {original} -> {rate} Hz"]
        wav = resample(wav, original, rate)
        inputs = {vi.name: vi for vi in _inputs(self.model)}
        if cfg.get("feature_extractor_type") == "WhisperFeatureExtractor" and "input_features" in inputs:
            vi = inputs["input_features"]
            features = log_mel(wav, cfg)
            self.how[SampleKind.AUDIO] = f"{', '.join(notes)}, Whisper log-mel ({PREPROCESSOR_CONFIG})"
            return self.complete({vi.name: features[None].astype(_dtype(vi))}, 0)
        candidates = [v for v in inputs.values() if _dtype(v).kind == "f" and len(_dims(v)) in (1, 2)]
        named = [v for v in candidates if _AUDIO_NAME.search(v.name)]
        candidates = named if len(candidates) > 1 and len(named) == 1 else candidates
        if len(candidates) != 1:
            raise self.refuse(file, "an audio sample needs one float input of rank 1 or 2 (samples, or 1 x samples)")
        vi = candidates[0]
        length = _dims(vi)[-1]
        if length is not None and length != len(wav):  # a fixed window: the sample padded with silence, or cut
            notes.append(f"{'cut' if len(wav) > length else 'padded'} to {length} samples")
            wav = np.pad(wav, (0, max(0, length - len(wav))))[:length]
        if cfg.get("do_normalize") and cfg.get("feature_extractor_type") == "Wav2Vec2FeatureExtractor":
            wav = (wav - wav.mean()) / np.sqrt(wav.var() + 1e-7)
            notes.append("normalized (do_normalize)")
        self.how[SampleKind.AUDIO] = ", ".join(notes)
        value = wav.astype(_dtype(vi))
        given = {vi.name: value[None] if len(_dims(vi)) == 2 else value}
        for other in inputs.values():
            if _RATE_INPUT.match(other.name) and _dtype(other).kind in "iu" and len(_dims(other)) <= 1:
                given[other.name] = np.full([1] * len(_dims(other)), rate, dtype=_dtype(other))
        masks = [n for n, v in inputs.items() if "mask" in n.lower() and len(_dims(v)) == len(_dims(vi))]
        for mask in masks:  # an audio model's attention mask over the same samples
            given[mask] = np.ones(given[vi.name].shape, dtype=_dtype(inputs[mask]))
        return self.complete(given, 0)

    # ---- text ----------------------------------------------------------------------------------

    def text(self, file: Path) -> list[Feeds]:
        inputs = {vi.name: vi for vi in _inputs(self.model)}
        if "input_ids" not in inputs:
            raise self.refuse(file, "a text sample needs an input named input_ids")
        path = _folder_file(self.folder, TOKENIZER)
        if path is None:
            where = self.folder if self.folder is not None else "the model's folder"
            raise InputError(f"{file}: a text sample needs the model folder's {TOKENIZER} (none in {where})")
        tokenizers = _need("tokenizers", "tokenizers", file, "reading text")
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(path))
            lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{file}: not readable text ({first_line(e)})") from None
        except Exception as e:  # tokenizers raises its own Exception for a file it cannot read
            raise InputError(f"{path}: not a tokenizer.json that tokenizers reads ({first_line(e)})") from None
        if not lines:
            raise InputError(f"{file}: no prompt (one per line)")
        self.how[SampleKind.TEXT] = TOKENIZER
        # A decoder step with a cache: the synthesizer sizes its mask over past and new tokens.
        cached = any(n.startswith(("past_key_values.", "past.")) for n in inputs)
        sets: list[Feeds] = []
        for line in lines:
            ids = np.asarray(tokenizer.encode(line).ids, dtype=np.int64)
            if not len(ids):
                raise InputError(f"{file}: the prompt {line[:40]!r} makes no tokens")
            given = {"input_ids": ids[None].astype(_dtype(inputs["input_ids"]))}
            sized = [n for n in ("attention_mask", "token_type_ids") if n in inputs and not cached]
            feeds = self.complete({**given, **{n: np.zeros((1, len(ids)), _dtype(inputs[n])) for n in sized}},
                                  len(sets), ones=["attention_mask"], zeros=["token_type_ids"])
            sets.append(feeds)
        return sets


def read_samples(
    path: Path, model: onnx.ModelProto, preprocess: Preprocess, folder: Path | None, fill: Fill
) -> SampleSets:
    """The input sets of a sample file or a directory of them (module docstring)."""
    reader = _Reader(model, folder, preprocess, fill)
    files = _sample_files(path)
    sets = [feeds for f in files for feeds in reader.sets(f)]
    counts: dict[SampleKind, int] = {}
    for f in files:
        kind = SUFFIXES[f.suffix.lower()]
        counts[kind] = counts.get(kind, 0) + (0 if kind is SampleKind.TEXT else 1)
    if SampleKind.TEXT in counts:
        counts[SampleKind.TEXT] = len(sets) - sum(v for k, v in counts.items() if k is not SampleKind.TEXT)
    nouns = {SampleKind.IMAGE: "image", SampleKind.AUDIO: "wav", SampleKind.TEXT: "prompt"}
    parts = [f"{n} {nouns[k]}{'s' if n != 1 else ''} ({reader.how[k]})" for k, n in counts.items()]
    source = f"samples: {', '.join(parts)}"
    logger.info("inputs: %s", source)
    return SampleSets(sets, source)


# ---- image preprocessing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageSteps:
    """How an image becomes pixels: resized (to `size`, its shortest edge to `shortest`, or
    letterboxed into `size`), center-cropped to `crop`, scaled, normalized; `source` says so."""

    size: tuple[int, int] | None
    shortest: int | None
    letterbox: bool
    crop: tuple[int, int] | None
    resample: int
    scale: float | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    source: str

    def apply(self, img: Any, raw: bool = False) -> np.ndarray:
        """A Pillow image -> C x H x W float32 (as they are where `raw`)."""
        if self.letterbox and self.size is not None:
            img = _letterbox(img, self.size, self.resample)
        elif self.shortest is not None:
            w, h = img.size
            short, long = min(w, h), max(w, h)
            other = int(self.shortest * long / short)  # as transformers' get_resize_output_image_size
            img = img.resize((self.shortest, other) if w <= h else (other, self.shortest), self.resample)
        elif self.size is not None and img.size != (self.size[1], self.size[0]):
            img = img.resize((self.size[1], self.size[0]), self.resample)
        if self.crop is not None:
            (w, h), (ch, cw) = img.size, self.crop
            top, left = (h - ch) // 2, (w - cw) // 2
            img = img.crop((left, top, left + cw, top + ch))
        pixels = np.asarray(img)
        pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
        if raw:
            return pixels.transpose(2, 0, 1)
        values: np.ndarray = pixels.astype(np.float32)
        if self.scale is not None:
            values = values * np.float32(self.scale)
        if self.mean is not None and self.std is not None:
            values = (values - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return values.transpose(2, 0, 1)


def _letterbox(img: Any, size: tuple[int, int], resample: int) -> Any:
    """ultralytics' LetterBox (auto=False, center=True): fit inside `size` keeping the aspect,
    pad with gray 114 around it."""
    from PIL import Image  # the caller has read the image with it

    w, h = img.size
    r = min(size[0] / h, size[1] / w)
    new_w, new_h = round(w * r), round(h * r)
    if (new_w, new_h) != (w, h):
        img = img.resize((new_w, new_h), resample)
    dw, dh = (size[1] - new_w) / 2, (size[0] - new_h) / 2
    top, left = round(dh - 0.1), round(dw - 0.1)
    bands = len(img.getbands())
    canvas = Image.new(img.mode, (size[1], size[0]), LETTERBOX_GRAY if bands == 1 else (LETTERBOX_GRAY,) * bands)
    canvas.paste(img, (left, top))
    return canvas


def _hw(value: object) -> tuple[tuple[int, int] | None, int | None]:
    """A preprocessor_config size -> (height, width) or a shortest edge."""
    if isinstance(value, int) and value > 0:
        return None, value
    if isinstance(value, dict):
        if isinstance(value.get("height"), int) and isinstance(value.get("width"), int):
            return (value["height"], value["width"]), None
        if isinstance(value.get("shortest_edge"), int):
            return None, value["shortest_edge"]
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (value[0], value[1]), None
    return None, None


def _floats(value: object, channels: int) -> tuple[float, ...] | None:
    if isinstance(value, int | float):
        return (float(value),) * channels
    if isinstance(value, list) and value and all(isinstance(v, int | float) for v in value):
        return tuple(float(v) for v in value) if len(value) == channels else (float(value[0]),) * channels
    return None


def image_steps(
    config: Mapping[str, Any],
    meta: Mapping[str, object],
    pre: Preprocess,
    fixed: tuple[int | None, int | None],
    channels: int,
) -> ImageSteps:
    """The steps for an image: the folder's preprocessor_config, else ultralytics metadata, else
    the input's fixed sizes (else 224) with ImageNet's mean/std for RGB; `pre` overrides."""
    bilinear = 2  # Pillow's Resampling.BILINEAR, as transformers' image processors default
    if config:
        size, shortest = _hw(config.get("size")) if config.get("do_resize", True) else (None, None)
        crop, _ = _hw(config.get("crop_size")) if config.get("do_center_crop", "crop_size" in config) else (None, None)
        if crop is None and config.get("do_center_crop") and isinstance(config.get("crop_size"), int):
            crop = (config["crop_size"], config["crop_size"])
        pct = config.get("crop_pct")
        if shortest is not None and crop is None and isinstance(pct, float) and 0 < pct <= 1:  # ConvNext
            # below 384 the shortest edge goes to shortest / crop_pct and is cropped back; above, warped
            shortest, crop, size = ((int(shortest / pct), (shortest, shortest), None) if shortest < 384
                                    else (None, None, (shortest, shortest)))
        if shortest is not None and crop is None and size is None:  # an int size that does not crop: a square
            size, shortest = (shortest, shortest), None
        scale = float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None
        normalize = config.get("do_normalize", True)
        mean = _floats(config.get("image_mean", IMAGENET_MEAN), channels) if normalize else None
        std = _floats(config.get("image_std", IMAGENET_STD), channels) if normalize else None
        steps = ImageSteps(size, shortest, False, crop, int(config.get("resample", bilinear)), scale, mean, std, "")
    elif isinstance(imgsz := meta.get("imgsz"), int | list | tuple):
        side = [imgsz] * 2 if isinstance(imgsz, int) else list(imgsz) * (2 if len(imgsz) == 1 else 1)
        steps = ImageSteps((int(side[0]), int(side[1])), None, True, None, bilinear, 1 / 255, None, None, "")
    else:
        size = (fixed[0] or DEFAULT_SIDE, fixed[1] or DEFAULT_SIDE)
        rgb = channels == 3
        steps = ImageSteps(size, None, False, None, bilinear, 1 / 255,
                           IMAGENET_MEAN if rgb else None, IMAGENET_STD if rgb else None, "")
    if pre.size is not None:  # the final size: a crop where there is one, else the resize
        if steps.crop is not None:
            steps = _replace(steps, crop=pre.size)
        else:
            steps = _replace(steps, size=pre.size, shortest=None)
    if pre.mean is not None or pre.std is not None:
        steps = _replace(steps, mean=_floats(list(pre.mean or steps.mean or (0.0,)), channels),
                         std=_floats(list(pre.std or steps.std or (1.0,)), channels))
    return _replace(steps, source=_image_source(steps, bool(config), "imgsz" in meta))


def _replace(steps: ImageSteps, **changes: Any) -> ImageSteps:
    return dataclasses.replace(steps, **changes)


def _image_source(s: ImageSteps, config: bool, ultralytics: bool) -> str:
    def hw(size: tuple[int, int]) -> str:
        return f"{size[0]}x{size[1]}"

    parts = []
    if s.letterbox and s.size is not None:
        parts.append(f"letterbox {hw(s.size)} (ultralytics imgsz)")
    elif s.shortest is not None:
        parts.append(f"resize shortest edge {s.shortest}")
    elif s.size is not None:
        parts.append(f"resize {hw(s.size)}")
    if s.crop is not None:
        parts.append(f"crop {hw(s.crop)}")
    if s.scale is not None:
        parts.append("/255" if math.isclose(s.scale, 1 / 255) else f"x{s.scale:g}")
    if s.mean is not None and s.std is not None:
        imagenet = s.mean == IMAGENET_MEAN and s.std == IMAGENET_STD
        parts.append("ImageNet mean/std" if imagenet and not config else "mean/std")
    return ", ".join(parts) or "pixels as they are"


# ---- audio -------------------------------------------------------------------------------------


def read_wav(file: Path) -> tuple[np.ndarray, int]:
    """A PCM wav's samples, mixed down to mono, in [-1, 1] (float64), and its rate."""
    try:
        with wave.open(str(file), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            frames = w.readframes(w.getnframes())
    except (OSError, EOFError, wave.Error) as e:
        raise InputError(f"{file}: not a PCM wav file that Python's wave reads ({first_line(e)})") from None
    if width not in _PCM:
        raise InputError(f"{file}: {8 * width}-bit samples; convert it to 16-bit PCM")
    dtype, offset = _PCM[width]
    values = (np.frombuffer(frames, dtype=np.dtype(dtype).newbyteorder("<")).astype(np.float64) - offset)
    values = values / float(2 ** (8 * width - 1))
    if not len(values):
        raise InputError(f"{file}: no samples")
    return values.reshape(-1, channels).mean(axis=1), rate


def resample(wav: np.ndarray, rate: int, to: int) -> np.ndarray:
    """Linear interpolation from `rate` to `to` samples per second."""
    if rate == to:
        return wav
    count = max(1, round(len(wav) * to / rate))
    return np.interp(np.arange(count) * (rate / to), np.arange(len(wav)), wav)


def _slaney_mel(hz: np.ndarray | float) -> np.ndarray:
    hz = np.asarray(hz, np.float64)
    linear = 3.0 * hz / 200.0
    log = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(hz >= 1000.0, log, linear)


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp(np.log(6.4) * (mel - 15.0) / 27.0), 200.0 * mel / 3.0)


def mel_filters(n_fft: int, mels: int, rate: int, fmax: float) -> np.ndarray:
    """Slaney mel filters, slaney-normalized (librosa's default, transformers' Whisper's): (bins, mels)."""
    fft_freqs = np.linspace(0, rate // 2, 1 + n_fft // 2)
    edges = _slaney_hz(np.linspace(_slaney_mel(0.0), _slaney_mel(fmax), mels + 2))
    widths = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down, up = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:mels + 2] - edges[:mels]))[None, :]


def log_mel(wav: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """A Whisper feature extractor's input_features (mels x frames, float32): the wav padded or
    cut to `n_samples` (30 s), a periodic-Hann STFT (`n_fft` 400, `hop_length` 160, centered,
    reflect-padded), power, slaney mels to 8 kHz, log10 floored at 1e-10, the last frame dropped,
    clamped to 8 below the maximum, then (x + 4) / 4."""
    n_fft, hop = int(config.get("n_fft", 400)), int(config.get("hop_length", 160))
    rate, mels = int(config.get("sampling_rate", DEFAULT_RATE)), int(config.get("feature_size", 80))
    n_samples = int(config.get("n_samples", int(config.get("chunk_length", 30)) * rate))
    wav = np.pad(wav, (0, max(0, n_samples - len(wav))))[:n_samples]
    padded = np.pad(wav, n_fft // 2, mode="reflect")
    window = np.hanning(n_fft + 1)[:-1]
    count = 1 + (len(padded) - n_fft) // hop
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop][:count]
    power = np.abs(np.fft.rfft(frames * window, n=n_fft)) ** 2  # (frames, bins)
    mel = mel_filters(n_fft, mels, rate, 8000.0).T @ power.T  # (mels, frames)
    log = np.log10(np.maximum(mel, 1e-10))[:, :-1]
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)
