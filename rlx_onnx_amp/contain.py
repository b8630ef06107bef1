"""What a contained run is doing now, for its supervisor (`rlx_onnx_amp.supervise`): the last
`note` before an onnxruntime crash names what crashed (the model, its role, the provider) in the
one line the supervisor prints. Outside a supervised run a note costs nothing and goes nowhere.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["listen", "note"]

_listener: Callable[[str], None] | None = None


def note(what: str) -> None:
    """Tell the supervisor, if any, what this process is about to do in onnxruntime, e.g.
    "loading the input model.onnx on CPUExecutionProvider"."""
    if _listener is not None:
        _listener(what)


def listen(listener: Callable[[str], None] | None) -> None:
    """Where notes go in this process (None: nowhere); set by the supervised child."""
    global _listener
    _listener = listener
