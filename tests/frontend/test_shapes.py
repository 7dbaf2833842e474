"""--input-shape parsing: malformed, repeated and absurd shapes are usage errors (exit 2)."""

from __future__ import annotations

import pytest

from inferx_edge.errors import UsageError
from inferx_edge.frontend import parse_input_shapes
from tests.helpers import cli


def test_shapes_parse_and_bad_ones_are_named():
    assert parse_input_shapes(["image:2x1x28x28", "a:b:3"]) == {"image": (2, 1, 28, 28), "a:b": (3,)}
    for bad, msg in (
        (["image"], "malformed"),
        (["image:0x3"], "malformed"),
        (["image:1x1", "image:2x2"], "given twice"),
        (["image:99999999999x1x28x28"], "absurdly large"),
        (["image:65536x65536x65536"], "absurdly large"),
    ):
        with pytest.raises(UsageError, match=msg):
            parse_input_shapes(bad)


def test_an_absurd_batch_exits_2_before_compiling(tmp_path):
    r = cli("build", "--input-shape", "image:99999999999x1x28x28", "-o", tmp_path / "a.ixa")
    assert r.returncode == 2 and "absurdly large" in r.stderr
