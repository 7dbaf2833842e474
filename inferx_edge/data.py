"""Reading user arrays from ``.npy`` / ``.npz`` files: one reader, no pickles, errors that name the file."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from inferx_edge.errors import InferxError, UsageError

#: what numpy raises on a file that is not (or no longer) a valid .npy/.npz (found by fuzzing)
_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError, NotImplementedError)


def load_arrays(
    path: Path | str,
    what: str,
    error: type[InferxError] = UsageError,
    missing: type[InferxError] | None = None,
    hint: str = "",
) -> np.ndarray | dict[str, np.ndarray]:
    """The array of a ``.npy`` file, or the arrays of a ``.npz`` by name, read into memory.

    Parameters
    ----------
    path : the file.
    what : what the file is for, for messages (``"input file"``, ``"calibration file"``).
    error : raised when the file cannot be read as arrays: ``"cannot read {what} {path}{hint}: {reason}"``.
    missing : raised instead when the file does not exist (``"{what} not found: {path}"``); default ``error``.
    hint : inserted after the path in the unreadable-file message (e.g. ``" as a .npy/.npz array"``).
    """
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise (missing or error)(f"{what} not found: {path}") from None
    except _UNREADABLE as exc:
        raise error(f"cannot read {what} {path}{hint}: {exc}") from exc
    if isinstance(data, np.lib.npyio.NpzFile):
        try:
            with data:
                return {k: data[k] for k in data.files}
        except _UNREADABLE as exc:  # a member that does not decode
            raise error(f"cannot read {what} {path}{hint}: {exc}") from exc
    return data
