"""The LLM commands end to end: build from a checkpoint, inspect, generate; bad flags answered."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from inferx_edge.__main__ import main  # noqa: E402


def test_build_inspect_generate(tiny_llama, tiny_llm_fp32_artifact, tmp_path, capsys):
    out = tmp_path / "cli.ixa"
    assert main(["build", "-m", str(tiny_llama), "--precision", "q4_1", "-o", str(out)]) == 0
    assert "variants q4_1" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "LLM      llama: 2 layers" in text and "variant q4_1: float32 activations" in text
    assert main(["generate", str(tiny_llm_fp32_artifact), "--variant", "fp32", "-p", "Hello", "--max-tokens", "5"]) == 0
    captured = capsys.readouterr()
    assert "prompt tokens, 5 generated (length)" in captured.err or "generated (stop)" in captured.err
    assert main(["generate", str(tiny_llm_fp32_artifact), "--chat", "-p", "hi", "-p", "yo", "--max-tokens", "3"]) == 0
    assert captured.out.count("---") == 0 and capsys.readouterr().out.count("---") == 2


def test_bad_llm_flags_are_usage_errors(tiny_llama, tiny_llm_fp32_artifact, tmp_path, capsys):
    assert main(["build", "-m", str(tiny_llama), "--precision", "q3", "-o", str(tmp_path / "x.ixa")]) == 2
    assert "choose from: q4, q4_1, int8, fp16, fp32" in capsys.readouterr().err
    assert main(["build", "-m", str(tiny_llama), "--batch-sizes", "1,2", "-o", str(tmp_path / "x.ixa")]) == 2
    assert main(["generate", str(tiny_llm_fp32_artifact), "-p", "hi", "--temperature", "9"]) == 6
    assert "temperature" in capsys.readouterr().err


def test_run_smoke_tests_an_llm_artifact(tiny_llm_fp32_artifact, tmp_path, capsys):
    """``run`` (deploy's self-test) on an LLM artifact: prefill + greedy decode, tokens written."""
    import numpy as np

    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([72, 101, 108, 108, 111], dtype=np.int64))
    out = tmp_path / "tokens.npy"
    assert main(["run", str(tiny_llm_fp32_artifact), "--variant", "fp32", "--input", str(ids), "--repeat", "6", "-o", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "prefill 5 tokens" in text and "decode: 6 steps" in text
    assert np.load(out).shape == (7,)
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((2, 2), dtype=np.float32))
    assert main(["run", str(tiny_llm_fp32_artifact), "--input", str(bad)]) == 6


def test_deploy_installs_and_self_tests_an_llm_artifact(tiny_llm_fp32_artifact, tmp_path, capsys):
    dest = tmp_path / "device"
    assert main(["deploy", str(tiny_llm_fp32_artifact), "--to", str(dest)]) == 0
    assert "decode:" in capsys.readouterr().out or (dest / "current").exists()
    assert (dest / "current").exists()


def test_signed_llm_artifact_is_verified(tiny_llama, tmp_path, capsys):
    keys, other = tmp_path / "keys", tmp_path / "other"
    assert main(["keygen", "--out", str(keys)]) == 0
    assert main(["keygen", "--out", str(other)]) == 0
    priv = (
        next(keys.glob("*.key"))
        if list(keys.glob("*.key"))
        else next(p for p in keys.iterdir() if not p.name.endswith(".pub"))
    )
    out = tmp_path / "signed.ixa"
    assert main(["build", "-m", str(tiny_llama), "--precision", "int8", "-o", str(out), "--sign", str(priv)]) == 0
    pub, wrong = next(keys.glob("*.pub")), next(other.glob("*.pub"))
    assert main(["generate", str(out), "-p", "hi", "--max-tokens", "2", "--trust", str(pub)]) == 0
    capsys.readouterr()
    assert main(["generate", str(out), "-p", "hi", "--max-tokens", "2", "--trust", str(wrong)]) == 5
    assert "sign" in capsys.readouterr().err.lower()


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
def test_llm_build_keeps_another_build_at_the_output(tiny_llama, tmp_path, capsys):
    out = tmp_path / "m.ixa"
    assert main(["build", "-m", str(tiny_llama), "--precision", "int8", "-o", str(out)]) == 0
    assert main(["build", "-m", str(tiny_llama), "--precision", "q4", "-o", str(out)]) == 0  # another build
    assert (tmp_path / "m.1.ixa").exists() and "kept as" in capsys.readouterr().out
    assert main(["build", "-m", str(tiny_llama), "--precision", "fp32", "-o", str(out), "--force"]) == 0
    assert not (tmp_path / "m.2.ixa").exists()
