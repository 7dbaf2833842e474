"""The exception tree every stage raises; the CLI turns these into one-line messages and exit codes.

Anything else escaping a command is a bug in inferx_edge, and is reported with its traceback.

Exit codes: 1 other, 2 usage, 3 model, 4 build, 5 artifact, 6 input, 7 deploy, 8 tuning database busy,
9 power-mode control, 10 accuracy budget.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InferxError(Exception):
    """Base of every error a user can cause and fix. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class UsageError(InferxError):
    """A flag or value is invalid: unknown target, malformed ``--input-shape``, missing file."""

    exit_code = 2


class ModelError(InferxError):
    """The model cannot be read or imported: not ONNX, malformed, unsupported operators."""

    exit_code = 3


class BuildError(InferxError):
    """Compilation or export failed for a valid model (a missing cross compiler, a codegen failure)."""

    exit_code = 4


class ArtifactError(InferxError):
    """An artifact is unreadable, unsafe, tampered with, or not meant for this machine."""

    exit_code = 5


class ChecksumError(ArtifactError):
    """A member of an artifact does not match the sha256 its manifest records."""


class TargetMismatchError(ArtifactError):
    """The artifact was built for another CPU architecture, GPU architecture or device kind."""


class InputError(InferxError):
    """Inference inputs do not match what the artifact expects (names, shapes, dtypes, values)."""

    exit_code = 6


class BudgetError(InferxError):
    """A quantization accuracy budget cannot be met (nothing is written)."""

    exit_code = 10


class DeployError(InferxError):
    """Installing, verifying, switching or rolling back a release on a device failed."""

    exit_code = 7


class DatabaseBusyError(InferxError):
    """Another process holds a tuning database's lock."""

    exit_code = 8


class ControlError(InferxError):
    """Changing the device's power mode or clocks failed or is not allowed."""

    exit_code = 9


class TelemetryError(InferxError):
    """A telemetry backend is unavailable or unreadable."""


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """Return ``" did you mean 'x'?"`` for the closest choice, or ``""`` if none is close."""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.5)
    return f" did you mean '{close[0]}'?" if close else ""


def unknown_choice(kind: str, value: str, choices: Iterable[str]) -> UsageError:
    """An error for a value outside a closed set: names the value, the closest match and all choices."""
    choices = sorted(choices)
    return UsageError(f"unknown {kind} '{value}':{did_you_mean(value, choices)} valid: {', '.join(choices)}")


def check_choice(kind: str, value: str, choices: Iterable[str]) -> str:
    """``value`` when it is one of ``choices``; else a :class:`UsageError` naming the value, the closest
    choice and every choice in their given order (``unknown precision 'fp61'; did you mean 'fp16'?
    valid: fp32, fp16, int8, mixed``)."""
    choices = list(choices)
    if value not in choices:
        raise UsageError(f"unknown {kind} '{value}';{did_you_mean(value, choices)} valid: {', '.join(choices)}")
    return value
