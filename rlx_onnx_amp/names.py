"""Names the command line offers before it imports anything heavy (`--help` loads no onnx or
numpy): the library's own tables assert against them (`verification.task.TASK_SPECS`)."""

from __future__ import annotations

__all__ = ["TASK_NAMES"]

#: `--task` choices: `auto`, the rows of `verification.task.TASK_SPECS` in the order `auto`
#: tries them, and `none` (element-wise only).
TASK_NAMES = ("auto", "generate", "detect", "segment", "classify", "embed", "logits", "none")
