"""Run an artifact with the on-device runtime: check inputs, run, write outputs, print latency."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from inferx_edge.cli._common import add_trust_argument
from inferx_edge.data import load_arrays
from inferx_edge.errors import InputError, UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", type=Path, help="artifact file written by 'build'")
    p.add_argument(
        "--input",
        "-i",
        action="append",
        default=[],
        metavar="[NAME=]FILE",
        help="input tensor: FILE.npy for a single-input model, NAME=FILE.npy per input, or one "
        ".npz keyed by input name. Without --input, seeded random inputs are used (smoke test).",
    )
    p.add_argument(
        "--output",
        "-o",
        type=Path,
        default=None,
        help="write outputs here: .npy (single output) or .npz (keyed by output name)",
    )
    p.add_argument("--variant", default=None, help="variant to run (default: the manifest's default)")
    p.add_argument("--device-id", type=int, default=0, help="GPU index for CUDA artifacts")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs before timing (default 5)")
    p.add_argument("--repeat", type=int, default=50, help="timed runs (default 50); 0 skips timing")
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="say which TVM runtime and CUDA runtime library were loaded, and why",
    )
    add_trust_argument(p)
    p.add_argument(
        "--allow-nonfinite", action="store_true", help="accept NaN/Inf in float inputs (refused by default: exit 6)"
    )


def _load_array(path: str) -> np.ndarray | dict[str, np.ndarray]:
    return load_arrays(path, "input file", error=InputError, missing=UsageError, hint=" as a .npy/.npz array")


def _read_inputs(values: list[str], names: list[str]) -> dict[str, np.ndarray]:
    inputs: dict[str, np.ndarray] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            name, path = "", value
        data = _load_array(path)
        if not isinstance(data, dict):
            if not name:
                if len(names) != 1:
                    raise UsageError(f"model has inputs {names}: give each as NAME=FILE.npy, or one .npz")
                name = names[0]
            data = {name: data}
        twice = sorted(set(data) & set(inputs))
        if twice:
            raise UsageError(f"input {', '.join(twice)} given twice (--input {value} repeats it); give each input once")
        inputs.update(data)
    return inputs


def _random_inputs(specs) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for s in specs:
        shape = tuple(d or 1 for d in s.shape)
        if np.issubdtype(np.dtype(s.dtype), np.floating):
            out[s.name] = rng.standard_normal(shape).astype(s.dtype)
        else:
            out[s.name] = rng.integers(0, 2, shape).astype(s.dtype)
    return out


def _write_outputs(path: Path, outputs: dict[str, np.ndarray]) -> None:
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".npz"):
        raise UsageError(f"--output must end in .npy or .npz, got '{path.name}'")
    if suffix == ".npy" and len(outputs) != 1:
        raise UsageError(f"model has {len(outputs)} outputs ({', '.join(outputs)}): write them to a .npz")
    from inferx_edge.package.atomic import atomic_write

    with atomic_write(path) as f:
        if suffix == ".npy":
            np.save(f, next(iter(outputs.values())))
        else:
            np.savez(f, **outputs)


def _run_llm(args: argparse.Namespace) -> int:
    """An LLM artifact: prefill the token ids of ``--input`` (an int .npy; default 16 seeded ids),
    decode ``--repeat`` tokens greedily, print them and the step times (deploy's self-test runs this)."""
    import time

    from inferx_edge.runtime.llm import LLMEngine

    with LLMEngine(args.artifact, variant=args.variant, device_id=args.device_id, trust=args.trust) as engine:
        if len(args.input) > 1:
            raise UsageError("an LLM artifact takes one --input: a .npy of token ids")
        if args.input:
            ids = np.asarray(_load_array(args.input[0]))
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise InputError(f"--input must be a 1-D integer array of token ids, got {ids.dtype}{list(ids.shape)}")
        else:
            ids = np.random.default_rng(0).integers(0, engine.vocab_size, 16)
        engine.add_sequence(0)
        t0 = time.perf_counter()
        logits = engine.prefill([0], [ids.tolist()[: engine.prefill_chunk]])
        prefill_ms = (time.perf_counter() - t0) * 1e3
        out, steps = [int(logits[0].argmax())], []
        for _ in range(max(0, min(args.repeat, engine.context_length - len(ids) - 1))):
            t0 = time.perf_counter()
            out.append(int(engine.decode([0], [out[-1]])[0].argmax()))
            steps.append(time.perf_counter() - t0)
        if not np.isfinite(logits).all():
            raise InputError("the model produced non-finite logits")
        print(f"{args.artifact.name}: {engine.provenance.line()}")
        print(f"  prefill {len(ids)} tokens: {prefill_ms:.2f} ms; greedy tokens {out[:16]}")
        if steps:
            print(
                f"  decode: {len(steps)} steps, p50 {np.median(steps) * 1e3:.2f} ms ({1 / np.median(steps):.1f} tokens/s)"
            )
        if args.output is not None:
            _write_outputs(args.output, {"tokens": np.asarray(out, dtype=np.int32)})
    return 0


def run(args: argparse.Namespace) -> int:
    from inferx_edge.runtime import Engine
    from inferx_edge.runtime.llm import is_llm_artifact

    if is_llm_artifact(args.artifact):  # an unreadable file goes on to the Engine, which names the fault
        return _run_llm(args)
    if args.output is not None and args.output.suffix.lower() not in (".npy", ".npz"):
        raise UsageError(f"--output must end in .npy or .npz, got '{args.output.name}'")
    for flag in ("repeat", "warmup"):
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag} must be 0 or more, got {getattr(args, flag)}")
    with Engine(
        args.artifact,
        variant=args.variant,
        device_id=args.device_id,
        trust=args.trust,
        allow_nonfinite=args.allow_nonfinite,
    ) as engine:
        print(f"{args.artifact.name}: {engine.provenance.line()}")
        if args.verbose:
            for line in engine.runtime_lines():
                print(f"  {line}")
        specs = engine.variant.inputs
        if args.input:
            inputs = _read_inputs(args.input, [s.name for s in specs])
        else:
            inputs = _random_inputs(specs)
            print("note: no --input given; running on seeded random inputs")
        outputs = engine.run(inputs)
        target = engine.manifest.target
        print(f"ran {args.artifact.name} variant {engine.variant.name} on {target['name']} ({target['device']})")
        for name, value in outputs.items():
            print(f"  output {name}: {value.dtype}{list(value.shape)}")
        if args.output is not None:
            _write_outputs(args.output, outputs)
            print(f"wrote {args.output}")
        if args.repeat > 0:
            print(engine.benchmark(inputs, warmup=args.warmup, repeat=args.repeat).line())
    return 0
