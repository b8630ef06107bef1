"""What a verification is asked to do (`VerifyOptions`), the providers it may run on, and the
onnxruntime threads a session takes: what the CLI parses and a batch sets up, importable
without the verification's modules and without onnxruntime (`resolve_provider` imports it)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.verification.inputs import InputSpec, parse_range, parse_shape
from rlx_onnx_amp.verification.samples import Preprocess, parse_preprocess
from rlx_onnx_amp.verification.tolerance import Tolerances

__all__ = [
    "DEFAULT_BUDGET",
    "PROVIDERS",
    "VerifyOptions",
    "resolve_provider",
    "session_thread_count",
    "session_threads",
]

PROVIDERS: Mapping[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
}
_AUTO_ORDER = ("cuda", "coreml", "cpu")
#: onnxruntime's intra-op threads per session; 0 lets it choose (all cores). Batch workers
#: (`--jobs`) share the CPUs out (`session_threads`).
_SESSION_THREADS: ContextVar[int] = ContextVar("session_threads", default=0)

#: The candidate evaluations `repair.repair_file` may use unless told otherwise.
DEFAULT_BUDGET = 24
#: The greedy steps per prompt the `generate` task takes unless told otherwise.
DEFAULT_GENERATE_STEPS = 8


@dataclass
class VerifyOptions:
    provider: str = "auto"
    emulate: bool | None = None  # None: when the provider cannot run low precision faithfully
    inputs: str | None = None
    spec: InputSpec = field(default_factory=InputSpec)
    tolerance: Tolerances = field(default_factory=Tolerances)  # per output; the precision's defaults for the rest
    localize: bool = False
    localize_top: int = 10
    save_inputs: str | None = None
    #: Warm runs timed per model for `Verification.latency` (0: not timed).
    latency_runs: int = 5
    #: The provider short name the candidate is meant for ("cuda", "cpu"); None: the one the
    #: verification runs on. A written model that cannot run on the provider at hand is an
    #: error (exit 3) there; where that provider only stands in for the target, a warning.
    target: str | None = None
    #: What the verdict judges (`verification.task`): "auto" picks from the model's interface,
    #: "logits", "classify", "embed", "detect", "generate", or "none" (element-wise only).
    task: str = "auto"
    #: The task an export folder's config names, and where it says so (`directory.config_task`):
    #: under `task` "auto" it is judged wherever the model's interface allows it.
    folder_task: tuple[str, str] | None = None
    #: The greedy steps per prompt of the `generate` task, its first one included.
    generate_steps: int = DEFAULT_GENERATE_STEPS
    #: A seq2seq folder's encoder (`generate.folder_encoder`): a decoder's synthesized
    #: `encoder_hidden_states` are its output (`generate.with_encoder_states`), not noise.
    encoder: str | None = None

    def check(self, option: Callable[[str], str] = "--{}".format) -> None:
        """Raise InputError for what makes these options unusable, before any work: no sample
        to run, a provider onnxruntime here lacks, an inputs file that is not there. `option`
        spells an option's name as the caller's user gives it (the CLI's `--samples`, the Olive
        pass's `samples`)."""
        if self.spec.samples < 1:
            raise InputError(f"{option('samples')} must be at least 1")
        if self.generate_steps < 1:
            raise InputError(f"{option('generate_steps').replace('_', '-')} must be at least 1")
        if self.latency_runs < 0:
            raise InputError(f"{option('latency_runs').replace('_', '-')} must be 0 (not timed) or more")
        resolve_provider(self.provider, option("provider"))
        if self.spec.preprocess != Preprocess() and self.inputs is None:  # it would do nothing
            raise InputError(f"{option('preprocess')} applies to --inputs samples (images, audio, text); "
                             "no --inputs given")
        if self.inputs is not None and not os.path.exists(self.inputs):
            raise InputError(f"{option('inputs')}: {self.inputs}: no such file or directory")


def resolve_provider(name: str, option: str = "--provider") -> str:
    """The short name of the provider to use; an unavailable one is an error, never a fallback."""
    import onnxruntime as ort  # here, not at import: parsing options needs no onnxruntime

    available = ort.get_available_providers()
    if name == "auto":
        return next(p for p in _AUTO_ORDER if PROVIDERS[p] in available)
    if name not in PROVIDERS:
        raise InputError(f"{option}: unknown provider {name!r} (known: auto, {', '.join(PROVIDERS)})")
    if PROVIDERS[name] not in available:
        raise InputError(
            f"{option} {name}: onnxruntime here has no {PROVIDERS[name]} (available: {', '.join(available)})"
        )
    return name


def session_thread_count() -> int:
    """The intra-op threads a session opened now takes (`session_threads`; 0: all cores)."""
    return _SESSION_THREADS.get()


@contextlib.contextmanager
def session_threads(count: int) -> Iterator[None]:
    """Every session opened inside the block runs with `count` intra-op threads (0: onnxruntime
    chooses, all cores): a batch worker's share of the CPUs."""
    token = _SESSION_THREADS.set(count)
    try:
        yield
    finally:
        _SESSION_THREADS.reset(token)


def verify_options_from(
    provider: str,
    emulate: bool | None,
    inputs_path: str | None,
    seed: int,
    samples: int,
    shapes: Sequence[str],
    ranges: Sequence[str],
    save_inputs: str | None,
    atol: Sequence[str],
    rtol_of_max: Sequence[str],
    rtol: Sequence[str],
    min_cosine: Sequence[str],
    localize: bool,
    latency_runs: int = 5,
    task: str = "auto",
    generate_steps: int = DEFAULT_GENERATE_STEPS,
    preprocess: Sequence[str] = (),
) -> VerifyOptions:
    """The options the command line's verify flags give, checked before any work (exit 2)."""
    if not 0 <= seed < 2**63:
        raise InputError(f"--seed: expected a number from 0 to 2**63-1, got {seed}")
    spec = InputSpec(dict(parse_shape(s) for s in shapes), dict(parse_range(r) for r in ranges), seed, samples,
                     parse_preprocess(preprocess))
    options = VerifyOptions(
        provider=provider,
        emulate=emulate,
        inputs=inputs_path,
        spec=spec,
        tolerance=Tolerances.parse(atol=atol, rtol=rtol, min_cosine=min_cosine, rtol_of_max=rtol_of_max),
        localize=localize,
        save_inputs=save_inputs,
        latency_runs=latency_runs,
        task=task,
        generate_steps=generate_steps,
    )
    options.check()  # exit 2 before any work
    return options
