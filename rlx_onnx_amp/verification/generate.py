"""Greedy generation for the `generate` task (issue 39): a decoder export's tokens, step by step.

A generator here is a decoder step model: token ids in (`input_ids`), scores out (`logits`),
and a key/value cache out (`present.*`), read back as `past_key_values.*` / `past.*` where
the model takes one (optimum's decoder-with-past and merged decoders, onnxruntime-genai's
model), or else the whole sequence again (optimum's `decoder_model.onnx`). A step with no cache
at all (issue 50: the plain export of a T5 or BART decoder, `input_ids` and
`encoder_hidden_states` in, `logits` [batch, seq, vocab] out; GPT-2 without past) is one too:
each step feeds the whole sequence again, one token longer, every other input (the encoder's
states and mask) as at the first step. Its interface is also a masked LM's (BERT's `input_ids`
-> `logits` [batch, seq, vocab]), so `sign` says what makes it a decoder's (its file name, an
encoder input, `decoder_input_ids`): `--task auto` takes it on such a sign only (or on its
folder's config), `--task generate` always. `find_generator` tells one from its interface.

The loop starts from a feed the verification already ran (its first step: the prompt and, for a
cached step, its cache), then takes `steps - 1` more steps, each one token: the reference picks
its greedy token (argmax of the last position's scores), and the candidate is fed the
reference's token (teacher forcing: a drift at one step does not compound into the next
step's input, only through the candidate's own cache). Where the candidate's own choice first
differs is where a free-running candidate would part from the reference: the tokens before
are the same, since both were fed the same ones. Each step's feed follows the last: the cache
read back (but for an empty present: optimum's merged seq2seq decoder outputs one for the
encoder's cache on its cached branch, which is fed the first step's again), the attention mask
one position longer, the positions counted from it, a `use_cache_branch` set to the cached
branch.

In a seq2seq export folder (optimum's `encoder_model.onnx` beside its decoders), a decoder's
`encoder_hidden_states` are the f32 encoder's output on drawn token ids or spectrogram
(`folder_encoder`, `with_encoder_states`), not noise: the states a decoder meets in use, whose
attention a converted decoder must still read right. Given samples (`--inputs speech.wav` for a
Whisper folder, `prompts.txt` for a T5 one), the decoder starts from them: each sample through
the folder's preprocessing and the encoder, the decoder's first step its start token
(`samples_through_encoder`), and the generate task's greedy steps from there.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from rlx_onnx_amp.errors import AmpError, ModelRunError
from rlx_onnx_amp.loading import load_model
from rlx_onnx_amp.verification.inputs import PAST_INPUT, InputSpec, sample_filler, synthesized_sets
from rlx_onnx_amp.verification.options import PROVIDERS, session_thread_count
from rlx_onnx_amp.verification.samples import SampleSets, folder_json, read_samples

if TYPE_CHECKING:
    from rlx_onnx_amp.sessions import OrtSession

__all__ = [
    "ENCODER_STATES",
    "Generator",
    "Steps",
    "decode",
    "encoder_beside",
    "find_generator",
    "folder_encoder",
    "next_feeds",
    "with_encoder_states",
]

logger = logging.getLogger(__name__)

_IDS = ("input_ids", "decoder_input_ids")
_PRESENT = re.compile(r"^present\.(?P<part>.+)$")
_MASKS = ("attention_mask", "decoder_attention_mask")
_POSITIONS = ("position_ids",)
_BRANCH = "use_cache_branch"
#: Inputs that only a decoder reads: the encoder's output and its mask (seq2seq, whisper).
_ENCODER_INPUTS = ("encoder_hidden_states", "encoder_outputs", "encoder_attention_mask")


@dataclass(frozen=True)
class Generator:
    """Which inputs and outputs of a decoder step the greedy loop reads and writes."""

    ids: str  # the token ids fed in
    logits: str  # the scores the greedy token is picked from (last axis: the vocabulary)
    feedback: tuple[tuple[str, str], ...]  # (past input, the present output read back into it)
    mask: str | None = None  # the self-attention mask, one position longer each step
    positions: str | None = None
    branch: str | None = None  # a merged decoder's cached-branch switch
    self_cache: str | None = None  # a present output whose axis -2 counts the positions so far
    #: No cache in or out: each step is fed the whole sequence again (see the module docstring).
    cacheless: bool = False
    #: What says a step without a cache is a decoder's, in words; None where nothing does.
    sign: str | None = None

    @property
    def cached(self) -> bool:
        return bool(self.feedback)


def find_generator(model: onnx.ModelProto, name: str = "") -> Generator | None:
    """The decoder step `model` (its file named `name`) is, or None: it needs token ids in and a
    logits output of rank 2 or more with a cache out (`present.*`), or, with no cache in or out,
    logits [batch, seq, vocab] over the ids' symbolic positions (`_cacheless`)."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    outputs = {o.name: o for o in model.graph.output}
    ids = next((n for n in _IDS if n in inputs), None)
    logits = next((n for n, o in outputs.items() if "logits" in n.lower() and len(o.type.tensor_type.shape.dim) >= 2),
                  None)
    presents = {m.group("part"): n for n in outputs if (m := _PRESENT.match(n))}
    if ids is None or logits is None:
        return None
    mask = next((n for n in _MASKS if n in inputs), None)
    positions = next((n for n in _POSITIONS if n in inputs), None)
    if not presents:
        return _cacheless(model, inputs, ids, logits, mask, positions, name)
    feedback = tuple(
        (past, presents[m.group("part")])
        for past in inputs
        if (m := PAST_INPUT.match(past)) and m.group("part") in presents
    )
    self_cache = next((n for part, n in sorted(presents.items()) if "encoder" not in part), None)
    return Generator(
        ids=ids,
        logits=logits,
        feedback=feedback,
        mask=mask,
        positions=positions,
        branch=_BRANCH if _BRANCH in inputs else None,
        self_cache=self_cache,
    )


def _cacheless(
    model: onnx.ModelProto, inputs: Sequence[str], ids: str, logits: str, mask: str | None, positions: str | None,
    name: str,
) -> Generator | None:
    """A step with no cache: no past input, token ids [batch, seq] and logits [batch, seq,
    vocab], seq symbolic in both: the loop feeds a longer sequence each step, which a fixed
    axis refuses (a static export), and a logits [batch, vocab] (a classifier's, or one
    position's) has no position for each token."""
    if any(PAST_INPUT.match(n) for n in inputs):
        return None
    ids_dims = next(i for i in model.graph.input if i.name == ids).type.tensor_type.shape.dim
    out_dims = next(o for o in model.graph.output if o.name == logits).type.tensor_type.shape.dim
    if len(ids_dims) != 2 or len(out_dims) != 3 or (out_dims[2].HasField("dim_value") and out_dims[2].dim_value < 2):
        return None
    if any(d.HasField("dim_value") and d.dim_value > 0 for d in (ids_dims[1], out_dims[1])):
        return None
    return Generator(ids=ids, logits=logits, feedback=(), mask=mask, positions=positions, cacheless=True,
                     sign=_decoder_sign(inputs, ids, name))


def _decoder_sign(inputs: Sequence[str], ids: str, name: str) -> str | None:
    """What says a step without a cache is a decoder's rather than a masked LM's: an encoder's
    output among its inputs, ids named a decoder's, or a file name with `decoder` in it."""
    encoder = next((n for n in _ENCODER_INPUTS if n in inputs), None)
    if encoder is not None:
        return f"an {encoder} input"
    if ids == "decoder_input_ids":
        return "a decoder_input_ids input"
    if "decoder" in name.lower():
        return f"its file name {name}"
    return None


@dataclass
class Steps:
    """One prompt set's greedy steps: each step's last-position scores, one row per prompt
    (`logits[t]`, float64), and the token each row picked (`tokens[t]`)."""

    logits: list[np.ndarray]
    tokens: list[np.ndarray]


def last_scores(logits: np.ndarray) -> np.ndarray:
    """The last position's scores, one row per prompt, as float64 (NaN read as the lowest)."""
    a = np.asarray(logits, dtype=np.float64)
    rows = a[:, -1, :] if a.ndim >= 3 else a.reshape(a.shape[0], -1)
    return np.nan_to_num(rows.reshape(rows.shape[0], -1), nan=-np.inf)


def _step_scores(logits: np.ndarray, step: int) -> np.ndarray:
    """`last_scores` of one step; a step that gives no position (onnxruntime turns a position
    table's Gather past its end into an empty Slice) cannot go on: a `ModelRunError`."""
    if np.size(logits) == 0:
        raise ModelRunError(f"step {step} gave logits of shape {np.shape(logits)}: no position to pick a token "
                            "from (past the model's position table?)")
    return last_scores(logits)


def decode(
    gen: Generator,
    run: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    feeds: Mapping[str, np.ndarray],
    first: Mapping[str, np.ndarray],
    steps: int,
    forced: Sequence[np.ndarray] | None = None,
) -> Steps:
    """`steps` greedy steps from `feeds`, whose outputs `first` already holds: each next step is
    fed the token picked (or, teacher-forced, `forced[t]`, the reference's token at step t).
    `run` runs the model on one feed and returns its outputs (the logits and the cache)."""
    outputs = first
    scores = _step_scores(outputs[gen.logits], 0)
    found = Steps([scores], [np.argmax(scores, axis=1)])
    for t in range(1, steps):
        token = forced[t - 1] if forced is not None else found.tokens[-1]
        feeds = next_feeds(gen, feeds, outputs, token)
        outputs = run(feeds)
        scores = _step_scores(outputs[gen.logits], t)
        found.logits.append(scores)
        found.tokens.append(np.argmax(scores, axis=1))
    return found


def next_feeds(
    gen: Generator, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], token: np.ndarray
) -> dict[str, np.ndarray]:
    """The feed of the step after `feeds` (whose outputs are `outputs`) that adds `token` (one
    per row)."""
    new = dict(feeds)
    ids = np.asarray(feeds[gen.ids])
    column = np.asarray(token).reshape(ids.shape[0], 1).astype(ids.dtype)
    if gen.cached:
        new[gen.ids] = column
        for past, present in gen.feedback:
            value = np.asarray(outputs[present])
            if value.size:  # a merged decoder's cached branch gives an empty stand-in for what it reuses
                new[past] = value
        seen = np.shape(outputs[gen.self_cache])[-2] if gen.self_cache else ids.shape[1]
    else:
        new[gen.ids] = np.concatenate([ids, column], axis=1)
        seen = ids.shape[1]
    mask = None
    if gen.mask is not None:
        old = np.asarray(feeds[gen.mask])
        ones = np.ones((old.shape[0], 1), dtype=old.dtype)
        # A mask over the positions seen so far grows by one; another (a first step that
        # ignored its cache) starts again over all of them.
        grown = np.concatenate([old, ones], axis=1)
        mask = grown if old.shape[1] == seen else np.ones((old.shape[0], seen + 1), old.dtype)
        new[gen.mask] = mask
    if gen.positions is not None:
        old = np.asarray(feeds[gen.positions])
        every = np.arange(seen + 1)[None, :].repeat(old.shape[0], 0)
        counted = np.cumsum(mask, axis=1) - 1 if mask is not None else every
        positions = np.maximum(counted, 0).astype(old.dtype)
        new[gen.positions] = positions[:, -1:] if gen.cached else positions
    if gen.branch is not None:
        new[gen.branch] = np.ones_like(np.asarray(feeds[gen.branch]))
    return new


#: optimum's seq2seq encoder file, the output its decoders read, and the inputs they read it as.
ENCODER_FILE, _ENCODER_OUTPUT = "encoder_model.onnx", "last_hidden_state"
ENCODER_STATES, _ENCODER_MASK = "encoder_hidden_states", "encoder_attention_mask"


def folder_encoder(root: Path, models: Sequence[Path]) -> Path | None:
    """The encoder of an export folder whose decoders read its output (paths relative to
    `root`): optimum's `encoder_model.onnx`, `input_ids` in and `last_hidden_state` out, where
    another model of the folder takes `encoder_hidden_states`; None elsewhere."""
    encoder = next((m for m in models if m.name == ENCODER_FILE), None)
    if encoder is None or not _is_encoder(root / encoder):
        return None
    readers = [m for m in models
               if m != encoder and ENCODER_STATES in {i.name for i in load_model(root / m).graph.input}]
    return root / encoder if readers else None


def encoder_beside(decoder: onnx.ModelProto, folder: Path) -> Path | None:
    """The encoder a decoder given alone (or with its encoder) reads: `folder`'s optimum
    `encoder_model.onnx`, where the decoder takes `encoder_hidden_states`; None elsewhere."""
    encoder = folder / ENCODER_FILE
    takes = {i.name for i in decoder.graph.input}
    return encoder if ENCODER_STATES in takes and encoder.is_file() and _is_encoder(encoder) else None


#: What a seq2seq encoder reads: token ids (T5, BART) or a spectrogram (Whisper's log-mel).
_ENCODER_INPUTS_READ = ("input_ids", "input_features")


def _is_encoder(path: Path) -> bool:
    model = load_model(path)
    return bool({i.name for i in model.graph.input} & set(_ENCODER_INPUTS_READ)) and _ENCODER_OUTPUT in {
        o.name for o in model.graph.output}


def _encoder_session(encoder: Path, provider: str) -> OrtSession:
    from rlx_onnx_amp.sessions import OrtSession  # onnxruntime: when an encoder runs, not at import

    return OrtSession(str(encoder), PROVIDERS[provider], str(encoder), shown=provider, role="the folder's encoder",
                      threads=session_thread_count(), prepacking=False)


#: Where a folder says which token a decoder starts from, first that holds it.
_START_TOKEN = (("generation_config.json", "decoder_start_token_id"), ("config.json", "decoder_start_token_id"),
                ("config.json", "pad_token_id"))


def start_token(folder: Path | None) -> tuple[int, str]:
    """The token a seq2seq decoder's first step reads, and where that is written (0 where no
    config of the folder says: T5's pad token, which starts its decoder)."""
    for name, key in _START_TOKEN:
        value = folder_json(folder, name).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value, f"{name} {key}"
    return 0, "no config says, 0"


def samples_through_encoder(
    decoder: onnx.ModelProto, encoder: Path, samples: Path, spec: InputSpec, folder: Path | None, provider: str
) -> SampleSets:
    """A seq2seq decoder's input sets from the user's samples (a wav for Whisper, a prompt for
    T5): each made into the `encoder`'s inputs by the folder's preprocessing and run through it,
    its `last_hidden_state` the decoder's `encoder_hidden_states` (under the encoder's mask), and
    the decoder's `input_ids` its start token, one position (`start_token`): the first step of a
    generation, which the generate task goes on from. The rest is drawn as without samples (a
    merged decoder's first sets take the uncached branch)."""
    model = load_model(encoder)
    made = read_samples(samples, model, spec.preprocess, folder, sample_filler(model, spec))
    takes = {i.name for i in model.graph.input}
    token, said = start_token(folder)
    session = _encoder_session(encoder, provider)
    decoder_inputs = {i.name for i in decoder.graph.input}
    ids = next((n for n in _IDS if n in decoder_inputs), None)
    sets = []
    for k, feeds in enumerate(made):
        (states,) = session.run([_ENCODER_OUTPUT], {n: v for n, v in feeds.items() if n in takes})
        batch, length = states.shape[:2]
        shapes = {ENCODER_STATES: tuple(states.shape), _ENCODER_MASK: (batch, length)}
        if ids is not None:
            shapes[ids] = (batch, 1)
        drawn = synthesized_sets(decoder, dataclasses.replace(
            spec, shapes={n: s for n, s in shapes.items() if n in decoder_inputs}, samples=1,
            seed=(spec.seed + k) % 2**63))[0]
        if ids is not None:
            drawn[ids] = np.full((batch, 1), token, dtype=drawn[ids].dtype)
        drawn[ENCODER_STATES] = states.astype(drawn[ENCODER_STATES].dtype)
        if _ENCODER_MASK in drawn:
            mask = feeds.get("attention_mask", np.ones((batch, length)))
            drawn[_ENCODER_MASK] = np.asarray(mask).astype(drawn[_ENCODER_MASK].dtype)
        sets.append(drawn)
    first = f"; {ids} the start token {token} ({said})" if ids is not None else ""
    return SampleSets(sets, f"{made.source} through {encoder.name}{first}")


def with_encoder_states(
    sets: Sequence[dict[str, np.ndarray]], encoder: Path, spec: InputSpec, provider: str
) -> list[dict[str, np.ndarray]]:
    """A decoder's input `sets` with their `encoder_hidden_states` the f32 `encoder`'s output on
    seeded token ids of the same batch and length (drawn as the encoder's own inputs are),
    under the decoder's `encoder_attention_mask` where it has one. Sets without the input are
    kept; where the encoder cannot run on them, the drawn states are kept, and a warning says so."""
    model = load_model(encoder)
    takes = {i.name for i in model.graph.input}
    session: OrtSession | None = None
    found = []
    for k, feeds in enumerate(sets):
        if ENCODER_STATES not in feeds:
            found.append(feeds)
            continue
        batch, length = np.shape(feeds[ENCODER_STATES])[:2]
        shapes: dict[str, tuple[int, ...]] = {n: (int(batch), int(length)) for n in ("input_ids", "attention_mask")
                                               if n in takes}
        drawn = synthesized_sets(model, dataclasses.replace(spec, shapes=shapes, samples=1,
                                                              seed=(spec.seed + k) % 2**63))[0]
        if _ENCODER_MASK in feeds and "attention_mask" in takes:
            drawn["attention_mask"] = np.asarray(feeds[_ENCODER_MASK]).astype(drawn["attention_mask"].dtype)
        try:
            session = session or _encoder_session(encoder, provider)
            (states,) = session.run([_ENCODER_OUTPUT], {n: v for n, v in drawn.items() if n in takes})
        except AmpError as e:
            logger.warning("%s: the decoder's %s stay drawn: the encoder does not run on set %d (%s)", encoder,
                           ENCODER_STATES, k, e)
            return list(sets)
        found.append({**feeds, ENCODER_STATES: states.astype(np.asarray(feeds[ENCODER_STATES]).dtype)})
    return found
