"""Tuning end to end on a tiny model on this CPU with a handful of trials: tune -> build applies records,
resume after kill -9, a torn record line, the lock, RPC measurement, and the no-device error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.records import metaschedule as tdb
from inferx_edge.runtime import Engine
from inferx_edge.targets import get_target, host_target_name
from inferx_edge.tune import TuneOptions, tune_model
from tests.helpers import REPO, cli, make_mlp

QUIET = {"log": lambda *a: None}


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    return make_mlp(tmp_path_factory.mktemp("mlp") / "mlp.onnx")


def _opts(mlp, root, **kw):
    return TuneOptions(
        model=mlp, target=host_target_name(), trials=kw.pop("trials", 8), per_iter=4, root=root, seed=0, **kw
    )


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
def test_tuning_works_whatever_handlers_the_caller_put_on_the_meta_schedule_logger(mlp, tmp_path):
    """An application's (or a test harness's) handler without a name on MetaSchedule's logger crashed
    every tuning run ('NoneType' object has no attribute 'format'); one with a foreign name did too.
    Both are set aside while tuning and are back afterwards."""
    import logging

    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    unnamed, named = logging.StreamHandler(), logging.StreamHandler()
    named.set_name("my-app")
    logger.addHandler(unnamed)
    logger.addHandler(named)
    try:
        summary = tune_model(_opts(mlp, tmp_path, trials=4), **QUIET)
        assert summary.trials_run >= 4
        assert unnamed in logger.handlers and named in logger.handlers
    finally:
        logger.removeHandler(unnamed)
        logger.removeHandler(named)


def test_tune_then_build_applies_records(mlp, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    summary = tune_model(_opts(mlp, tmp_path), **QUIET)
    assert summary.trials_run >= 8 and summary.valid_run >= 1  # the builder works on 2 cores
    assert any(t["best_us"] for t in summary.tasks)
    assert (summary.work_dir / tdb.RECORDS).exists() and summary.work_dir.parent.name == host_target_name()

    again = tune_model(_opts(mlp, tmp_path), **QUIET)  # same model, target and budget: nothing to do
    assert again.trials_run == 0 and again.trials_before >= 8

    out = tmp_path / "tuned.ixa"
    build_artifact(BuildOptions(model=mlp, target=host_target_name(), output=out, tuning_root=tmp_path), **QUIET)
    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    with Engine(out) as e:
        v = e.variant
        assert v.tuned and v.extra["tuning"]["kernels_tuned"] >= 1
        got = e.run(x)["y"]
    (want,) = ort.InferenceSession(str(mlp), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)

    untuned = tmp_path / "untuned.ixa"
    build_artifact(
        BuildOptions(model=mlp, target=host_target_name(), output=untuned, tuning=False, tuning_root=tmp_path), **QUIET
    )
    with Engine(untuned) as e:
        assert not e.variant.tuned


def test_resume_after_kill9_and_torn_line(mlp, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "inferx_edge",
        "tune",
        "--model",
        str(mlp),
        "--trials",
        "400",
        "--per-iter",
        "4",
        "--tuning-logs",
        str(tmp_path),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    records = None
    while time.time() < deadline:
        found = list(tmp_path.glob(f"*/*/{tdb.RECORDS}"))
        if found and sum(1 for _ in open(found[0])) >= 4:
            records = found[0]
            break
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert records is not None, "no records written within 300 s"
    kept = [json.loads(line) for line in open(records)]
    with open(records, "a") as f:
        f.write('[0, [[["GetSBlock", [], ["ro')  # a write torn by the kill

    r = cli("tune", "--model", mlp, "--trials", str(len(kept) + 4), "--per-iter", "4", "--tuning-logs", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "skipped 1 corrupt line" in r.stderr
    assert f"database has {len(kept)})" in r.stdout
    after = [json.loads(line) for line in open(records)]
    assert after[: len(kept)] == kept and len(after) >= len(kept) + 4  # nothing lost, work continued
    assert records.with_suffix(".corrupt").exists()


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
def test_locked_database_is_refused(mlp, tmp_path):
    from inferx_edge.frontend import import_model

    imported = import_model(mlp)
    with tdb.locked(tdb.model_database_dir(get_target(host_target_name()), imported, "fp32", tmp_path)):
        r = cli("tune", "--model", mlp, "--trials", "4", "--tuning-logs", tmp_path)
    assert r.returncode == 8 and "in use by another tuning run" in r.stderr


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
def test_prune_keeps_best_and_remembers_trials(mlp, tmp_path):
    summary = tune_model(_opts(mlp, tmp_path), **QUIET)
    before = tdb.trials_done(summary.work_dir)
    n_before, n_after = tdb.prune(summary.work_dir)
    assert n_after <= len(summary.tasks) and n_after < n_before
    assert tdb.trials_done(summary.work_dir) == before
    # pruned = packed: the workload file is gzipped, and a rerun that has nothing to do leaves it so
    packed = summary.work_dir / tdb.PACKED_WORKLOADS
    assert packed.exists() and not (summary.work_dir / tdb.WORKLOADS).exists()
    assert tune_model(_opts(mlp, tmp_path), **QUIET).trials_run == 0
    assert packed.exists() and not (summary.work_dir / tdb.WORKLOADS).exists()
    more = tune_model(_opts(mlp, tmp_path, trials=before + 4), **QUIET)  # resuming unpacks, keeps the best
    assert more.trials_run > 0 and not packed.exists() and (summary.work_dir / tdb.WORKLOADS).exists()
    assert sum(s["trials"] for s in tdb.trials_per_workload(summary.work_dir).values()) == n_after + more.trials_run
    out = tmp_path / "pruned.ixa"
    build_artifact(BuildOptions(model=mlp, target=host_target_name(), output=out, tuning_root=tmp_path), **QUIET)
    with Engine(out) as e:
        assert e.variant.extra["tuning"]["kernels_tuned"] >= 1


def test_host_cpu_databases_are_per_microarchitecture(mlp, monkeypatch):
    """Records measured on one CPU are not reused on another (Zen 3 records ran 2x slower on a Zen 4);
    GPU targets do not depend on the build host."""
    import tvm

    from inferx_edge.frontend import import_model

    imported = import_model(mlp)
    dirs = {}
    for cpu in ("znver3", "znver4"):
        monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda cpu=cpu: cpu)
        dirs[cpu] = {t: tdb.model_database_dir(get_target(t), imported, "fp32") for t in (host_target_name(), "h200")}
    assert dirs["znver3"][host_target_name()] != dirs["znver4"][host_target_name()]
    assert dirs["znver3"]["h200"] == dirs["znver4"]["h200"]


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
def test_jetson_without_device_names_both_ways(tmp_path):
    r = cli("tune", "--target", "jetson-orin", "--trials", "4", "--tuning-logs", tmp_path)
    assert r.returncode == 2
    assert "cannot tune for jetson-agx-orin-64gb here" in r.stderr
    assert "rpc_server --host DEVICE_IP_ON_THAT_LINK --tracker HOST_IP_ON_THAT_LINK:9190" in r.stderr
    assert "--rpc HOST_IP_ON_THAT_LINK:9190" in r.stderr and "never --host 0.0.0.0" in r.stderr
    assert "--no-fork" in r.stderr  # a forked server process cannot initialize CUDA
    assert "on the device itself" in r.stderr
    r = cli("tune", "--target", "h200", "--trials", "4", "--tuning-logs", tmp_path)
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr
    r = cli("tune", "--target", "h200", "--precision", "fp16", "--search", "tiles", "--tuning-logs", tmp_path)
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr


def test_rpc_flag_needs_key(mlp):
    r = cli("tune", "--model", mlp, "--rpc", "127.0.0.1:9190")
    assert r.returncode == 2 and "--rpc needs --key" in r.stderr


def test_tune_over_rpc(rpc_tracker, mlp, tmp_path):
    from inferx_edge.tune.runners import RPCSettings

    summary = tune_model(_opts(mlp, tmp_path, trials=4, rpc=RPCSettings("127.0.0.1", rpc_tracker, "testdev")), **QUIET)
    assert summary.valid_run >= 1


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
def test_time_limit_stops_the_run_and_keeps_its_records(mlp, tmp_path):
    """--minutes: the run ends after the batch that crosses the limit, with that batch's records saved
    and a summary (it once crashed TVM's gradient scheduler by terminating tasks mid-selection)."""
    summary = tune_model(_opts(mlp, tmp_path, trials=400, minutes=0.02), **QUIET)
    assert summary.stopped_by_time and 1 <= summary.trials_run < 400
    assert tdb.trials_done(summary.work_dir) == summary.trials_run
    records = (summary.work_dir / tdb.RECORDS).read_text().splitlines()
    assert len(records) == summary.trials_run


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
def test_kill9_in_the_first_round_keeps_every_measured_batch(tmp_path):
    """Each measured batch is committed before the next task is measured: the first records on disk
    belong to one kernel (MetaSchedule's own scheduler committed nothing until every kernel had a
    batch), and a kill -9 then keeps them."""
    from inferx_edge.models import DEFAULT_MODEL

    cmd = [sys.executable, "-m", "inferx_edge", "tune", "--model", str(DEFAULT_MODEL), "--trials", "64",
           "--per-iter", "4", "--tuning-logs", str(tmp_path)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, first = time.time() + 300, None
    try:
        while time.time() < deadline and first is None:
            found = list(tmp_path.glob(f"*/*/{tdb.RECORDS}"))
            lines = [json.loads(x) for x in open(found[0])] if found else []
            if lines:
                first = lines
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert first is not None, "no records within 300 s"
    assert len({rec[0] for rec in first}) == 1 and len(first) <= 4  # one batch of one kernel
    kept = [json.loads(x) for x in open(found[0])]
    assert len(kept) >= len(first)
    counts = tdb.trials_per_workload(found[0].parent)
    assert sum(c["trials"] for c in counts.values()) == len(kept)


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
def test_json_lines_that_are_not_records_are_set_aside(mlp, tmp_path):
    tune_model(_opts(mlp, tmp_path, trials=4), **QUIET)
    (records,) = tmp_path.glob(f"*/*/{tdb.RECORDS}")
    good = records.read_text()
    with open(records, "a") as f:
        f.write('{"not": "a record"}\n[1, 2]\n"text"\n')
    out = tmp_path / "m.ixa"
    build_artifact(BuildOptions(model=mlp, target=host_target_name(), output=out, tuning_root=tmp_path), **QUIET)
    assert out.exists()
    r = cli("tune", "--model", mlp, "--trials", "8", "--per-iter", "4", "--tuning-logs", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "skipped 3 corrupt line" in r.stderr
    assert records.read_text().startswith(good) and len(records.with_suffix(".corrupt").read_text().splitlines()) == 3


def test_a_database_of_another_cpu_of_the_same_isa_level_is_applied_with_a_note(mlp, tmp_path, monkeypatch):
    from inferx_edge.targets.cpu import same_level_cpus

    here = tdb.host_cpu_of(get_target(host_target_name()))
    others = same_level_cpus(here or "")
    if not others:
        pytest.skip(f"this CPU ({here}) is not in an ISA-level table")
    monkeypatch.setattr(tdb, "host_cpu_of", lambda spec: others[0])  # tune as if on the other CPU
    tune_model(_opts(mlp, tmp_path, trials=4), **QUIET)
    monkeypatch.undo()
    lines = []
    out = tmp_path / "m.ixa"
    build_artifact(
        BuildOptions(model=mlp, target=host_target_name(), output=out, tuning_root=tmp_path), log=lines.append
    )
    assert any(f"applied the one tuned on {others[0]}" in line for line in lines)
    with Engine(out) as engine:
        assert engine.variant.tuned
