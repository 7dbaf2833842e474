"""Reading user arrays: every unreadable file is one clear error of the class the caller chose."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferx_edge.data import load_arrays
from inferx_edge.errors import InferxError, InputError, UsageError


def test_npy_npz_and_the_errors(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((2, 3), np.float32))
    np.savez(tmp_path / "b.npz", x=np.zeros(3), y=np.arange(2))
    assert load_arrays(tmp_path / "a.npy", "input file").shape == (2, 3)
    assert sorted(load_arrays(tmp_path / "b.npz", "input file")) == ["x", "y"]
    with pytest.raises(UsageError, match="input file not found"):
        load_arrays(tmp_path / "missing.npy", "input file")
    (tmp_path / "empty.npy").write_bytes(b"")
    with pytest.raises(InputError, match="cannot read calibration file .*empty.npy"):
        load_arrays(tmp_path / "empty.npy", "calibration file", error=InputError)
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="cannot read"):  # pickles are never loaded
        load_arrays(tmp_path / "obj.npy", "input file", error=InputError)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=512), suffix=st.sampled_from([".npy", ".npz"]), prefix=st.booleans())
def test_fuzzed_array_files_give_only_the_chosen_error(tmp_path_factory, data, suffix, prefix):
    if prefix:  # start like a real file, then garbage
        data = (b"\x93NUMPY\x01\x00" if suffix == ".npy" else b"PK\x03\x04") + data
    path = tmp_path_factory.mktemp("f") / f"x{suffix}"
    path.write_bytes(data)
    try:
        load_arrays(path, "input file", error=InputError)
    except InputError:
        pass
    except InferxError as exc:  # pragma: no cover - a wrong class is a failure
        raise AssertionError(f"wrong error class {type(exc).__name__}") from exc
