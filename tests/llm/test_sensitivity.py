"""Per-layer sensitivity and the perplexity budget on the tiny random Llama."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from inferx_edge.errors import BudgetError, UsageError  # noqa: E402


@pytest.fixture(scope="module")
def ck(tiny_llama):
    from inferx_edge.llm.checkpoint import load_checkpoint

    return load_checkpoint(tiny_llama)


def test_numpy_forward_matches_transformers(ck, tiny_llama):
    import transformers

    from inferx_edge.llm.sensitivity import nll

    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_llama).eval()
    ids = list(np.random.default_rng(0).integers(0, 256, 40))
    with torch.no_grad():
        lp = torch.log_softmax(ref(torch.tensor([ids])).logits[0].double(), -1)
    want = float(-lp[torch.arange(39), torch.tensor(ids[1:])].sum())
    assert math.isclose(nll(ck, ck.weights, ids), want, rel_tol=1e-4)


def test_sensitivity_table_and_budget(ck):
    from inferx_edge.llm.sensitivity import choose_layer_precisions, layer_sensitivity

    ids = list(np.random.default_rng(1).integers(0, 256, 48))
    table = layer_sensitivity(ck, "q4", ids)
    incs = [r["increase_pct"] for r in table["layers"]]
    assert len(incs) == 2 and incs == sorted(incs, reverse=True)
    chosen, search = choose_layer_precisions(ck, table, ids, budget_pct=1e6)
    assert chosen == {} and search["met"]
    all_q4 = search["steps"][0]["increase_pct"]
    # a budget between "every layer int4" and "every layer int8" keeps some layers, most sensitive first
    try:
        choose_layer_precisions(ck, table, ids, budget_pct=-1)
    except BudgetError as exc:
        all_int8 = float(str(exc).split("+")[1].split(" %")[0])
    if all_int8 < all_q4:
        chosen, search = choose_layer_precisions(ck, table, ids, budget_pct=(all_q4 + all_int8) / 2)
        assert 1 <= len(chosen) <= 2 and table["layers"][0]["layer"] in chosen
    # a budget no mix meets is an error, not a silent miss
    with pytest.raises(BudgetError, match="above the budget"):
        choose_layer_precisions(ck, table, ids, budget_pct=-1)
    with pytest.raises(UsageError, match="at least 16"):
        layer_sensitivity(ck, "q4", ids[:5])


def test_build_under_a_budget_records_the_table(tiny_llama, tmp_path):
    from inferx_edge.llm.build import LLMBuildOptions, build_llm_artifact

    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 8)
    opts = LLMBuildOptions(
        model=tiny_llama, target="x86-cpu", output=tmp_path / "m.ixa", precisions=("q4",),
        calib_text=text, max_ppl_increase=1e6,
    )  # fmt: skip
    m = build_llm_artifact(opts, log=lambda s: None)
    extra = m.variant("q4").extra["llm"]
    assert len(extra["sensitivity"]["layers"]) == 2
    assert set(extra["layer_precisions"].values()) <= {"int8"}
    with pytest.raises(UsageError, match="needs calibration text"):
        LLMBuildOptions(model=tiny_llama, target="x86-cpu", output=tmp_path / "x.ixa", max_ppl_increase=1)
    with pytest.raises(UsageError, match="q4 or q4_1"):
        LLMBuildOptions(model=tiny_llama, target="x86-cpu", output=tmp_path / "x.ixa", precisions=("fp16",), calib_text=text, max_ppl_increase=1)  # fmt: skip
