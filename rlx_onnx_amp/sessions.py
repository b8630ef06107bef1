"""The one way this package opens an onnxruntime session (issue 49): on a model file or a
serialized model, on one provider with the CPU provider behind it, refusing a session that fell
back to another provider, and telling a supervisor (`contain.note`) what it loads and runs before
onnxruntime does, so that a crash there names its model, its role and the provider.

The reference, the screen, the candidate (`verification.compare.Session`), the proof
(`proof.onnxruntime_failure`) and the written file's run (`timing`) all go through
`OrtSession`. This module stays light: `timing` imports it in the fork server's preload, so it
imports onnxruntime, numpy and this package's `errors` and `contain` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort

from rlx_onnx_amp.contain import note
from rlx_onnx_amp.errors import InputError, ModelRunError, first_line

__all__ = ["CPU", "OrtSession", "providers_for"]

CPU = "CPUExecutionProvider"


def providers_for(provider: str) -> list[str]:
    """onnxruntime's providers for a session on `provider` (its own name, as
    `InferenceSession.get_providers` gives it): it, with the CPU provider behind it."""
    return list(dict.fromkeys([provider, CPU]))


class OrtSession:
    """An onnxruntime session on `model` (a file's path, or a serialized model) on `provider`
    (onnxruntime's name for it; `shown` is what errors call it, the CLI's short name).

    `label` names the model and `role` what it is to this run ("the input", "the written file",
    "a candidate"), in the supervisor's notes and the errors. `threads`: intra-op threads (0: all
    cores). `prepacking` off spares the copy of every MatMul weight into the CPU kernels' layout
    at load, for a session run on a few input sets only. `external`: external data locations ->
    their bytes in memory (onnxruntime reads external files only from the model's directory).
    A model that cannot be loaded or run is ModelRunError (exit 3); a session that fell back to
    another provider than `provider` is InputError."""

    def __init__(
        self,
        model: str | bytes,
        provider: str,
        label: str,
        *,
        role: str | None = None,
        shown: str | None = None,
        threads: int = 0,
        prepacking: bool = True,
        external: Mapping[str, np.ndarray] | None = None,
        log_level: int = 4,  # fatal only: an error reaches the user as one line, from the exception
    ) -> None:
        self.provider, self.label, self.role = provider, label, role
        self.shown = shown or provider
        opts = ort.SessionOptions()
        opts.log_severity_level = log_level
        opts.intra_op_num_threads = threads
        if not prepacking:
            opts.add_session_config_entry("session.disable_prepacking", "1")
        if external:
            buffers = list(external.values())
            opts.add_external_initializers_from_files_in_memory(list(external), buffers, [len(b) for b in buffers])
        note(self._doing("loading"))
        try:
            self.session = ort.InferenceSession(model, opts, providers=providers_for(provider))
        except Exception as e:
            raise ModelRunError(f"{label}: onnxruntime cannot load it on {self.shown} ({first_line(e, 400)})") from None
        used = self.session.get_providers()[0]
        if used != provider:
            raise InputError(f"{label}: onnxruntime fell back to {used} instead of {provider}")

    def _doing(self, action: str) -> str:
        whose = f"{self.role} {self.label}" if self.role else self.label
        return f"{action} {whose} on {self.provider}"

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """onnxruntime's `run`: the outputs `names` (None: all) on `feeds`."""
        note(self._doing("running"))
        try:
            return list(self.session.run(None if names is None else list(names), dict(feeds)))
        except Exception as e:
            why = first_line(e, 400)
            raise ModelRunError(f"{self.label}: onnxruntime cannot run it on {self.shown} ({why})") from None
