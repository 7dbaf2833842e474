"""Governor policies, hysteresis, dwell, telemetry loss; profile/report on a CPU with a fake meter."""

from __future__ import annotations

import json
import time

import pytest

from inferx_edge.errors import UsageError
from inferx_edge.runtime.governor import (
    Governor,
    LatencySLO,
    MaxThroughputUnderPowerCap,
    MinEnergyAboveFps,
    VariantStats,
    choose,
    jsonl_logger,
    make_policy,
)
from inferx_edge.runtime.telemetry import Sample
from tests.helpers import build_quietly

# Shaped like the H200 ResNet-18 profile: bigger batches are faster and cheaper per frame but slower.
TABLE = {
    "fp32-b1": VariantStats("fp32-b1", 312, 154, 0.495, 3.2, 1),
    "fp16-b8": VariantStats("fp16-b8", 2595, 258, 0.0995, 3.1, 8),
    "fp16-b64": VariantStats("fp16-b64", 6427, 461, 0.0718, 10.1, 64),
    "fp32-b64": VariantStats("fp32-b64", 4004, 408, 0.102, 16.1, 64),
}


def test_policies_pick_the_constrained_optimum():
    assert choose(MaxThroughputUnderPowerCap(300), TABLE) == ("fp16-b8", True)
    assert choose(MaxThroughputUnderPowerCap(1000), TABLE) == ("fp16-b64", True)
    assert choose(MinEnergyAboveFps(3000), TABLE) == ("fp16-b64", True)
    assert choose(LatencySLO(5.0), TABLE) == ("fp16-b8", True)
    # nothing meets it: the closest to feasible, flagged
    assert choose(MaxThroughputUnderPowerCap(100), TABLE) == ("fp32-b1", False)
    assert choose(LatencySLO(1.0), TABLE) == ("fp16-b8", False)
    with pytest.raises(UsageError, match="unknown policy 'fastest'; valid: max-throughput, min-energy, latency-slo"):
        make_policy("fastest", 1)


def test_switch_when_the_constraint_breaks_even_inside_dwell():
    g = Governor(MaxThroughputUnderPowerCap(500), TABLE, start="fp16-b64", min_dwell_s=60)
    assert g.decide(0.0) == "fp16-b64"
    g.observe(VariantStats("fp16-b64", 6400, 520, 0.081, 10, 64))  # the power went over the cap
    assert g.decide(1.0) == "fp32-b64"
    assert "breaks the constraint" in g.decisions[-1]["reason"]


def test_dwell_and_hysteresis_prevent_flapping():
    g = Governor(MinEnergyAboveFps(2000), TABLE, start="fp16-b8", min_dwell_s=10, hysteresis=0.05)
    g.since = 0.0
    # fp16-b64 is 28 % better, but we just switched: dwell holds
    assert g.decide(5.0) == "fp16-b8" and g.decisions[-1]["reason"].startswith("dwell")
    assert g.decide(11.0) == "fp16-b64"
    # a challenger only 2 % better than the current does not cause a switch
    g.observe(VariantStats("fp16-b8", 2600, 250, 0.0705, 3.1, 8))
    assert g.decide(30.0) == "fp16-b64" and g.decisions[-1]["reason"].startswith("hysteresis")
    # every decision carries its inputs
    assert set(g.decisions[-1]["inputs"]) == set(TABLE)


def test_telemetry_loss_holds_the_last_safe_variant():
    g = Governor(MaxThroughputUnderPowerCap(300), TABLE, start="fp16-b8", min_dwell_s=0)
    g.observe(VariantStats("fp16-b8", 2600, 250, 0.096, 3.1, 8))
    assert g.last_safe == "fp16-b8"
    assert g.decide(1.0, telemetry_ok=False) == "fp16-b8"
    assert g.decisions[-1]["reason"] == "telemetry lost: holding last safe variant fp16-b8"


def test_decision_log_is_jsonl(tmp_path):
    path = tmp_path / "decisions.jsonl"
    g = Governor(LatencySLO(5.0), TABLE, log=jsonl_logger(path))
    g.decide(0.0)
    g.decide(1.0)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["policy"] == "latency-slo" and lines[0]["choice"] == "fp16-b8"


class FakeNVML:
    """A meter with an energy counter: 60 W idle + 40 W while 'busy'."""

    name = "fake-nvml"
    driver = "fake"

    def __init__(self):
        self.t0 = time.time()

    def read(self):
        t = time.time()
        return Sample(t, 100.0, (t - self.t0) * 100.0)

    def close(self):
        pass


@pytest.fixture(scope="module")
def multi_artifact(tmp_path_factory):

    out = tmp_path_factory.mktemp("multi") / "multi.ixa"
    build_quietly(out, precisions=("fp32", "fp16"), batch_sizes=(1, 4), tuning=False)
    return out


def test_multi_variant_artifact_switches_without_reloading(multi_artifact):
    import numpy as np

    from inferx_edge.runtime import Engine

    with Engine(multi_artifact, preload=True) as e:
        assert [v.name for v in e.manifest.variants] == ["fp32-b1", "fp32-b4", "fp16-b1", "fp16-b4"]
        # one weights file per precision, shared by its batch sizes (fp16's weights are stored fp16)
        assert sorted({v.weights for v in e.manifest.variants}) == ["weights/fp16.npz", "weights/fp32.npz"]
        x = np.random.default_rng(0).random((4, 1, 28, 28)).astype(np.float32)
        ref = e.run(x[:1])["logits"]
        loaded = dict(e._loaded)
        e.select("fp32-b4")
        np.testing.assert_allclose(e.run(x)["logits"][:1], ref, atol=1e-4)
        e.select("fp16-b1")
        assert np.abs(e.run(x[:1])["logits"] - ref).max() < 0.05  # fp16 compute
        assert e._loaded["fp32-b1"] is loaded["fp32-b1"]  # no reload


def test_profile_and_report(multi_artifact, tmp_path):
    from inferx_edge.report.profile import profile_artifact
    from inferx_edge.report.render import render
    from tests.helpers import cli

    prof = profile_artifact(
        multi_artifact,
        tmp_path / "p.json",
        window_s=0.2,
        repeats=2,
        warmup_s=0.05,
        idle_s=0.1,
        backend=FakeNVML(),
        log=lambda *a: None,
    )
    assert prof["schema"] == "inferx_edge.profile/1" and len(prof["variants"]) == 4
    for v in prof["variants"]:
        assert v["fps"] > 0 and v["avg_w"] == pytest.approx(100.0, rel=0.05) and len(v["windows"]) == 2
        # per window J/frame is W / FPS (the aggregate is a mean over windows of each, which differ
        # when one window stalls on a loaded host: mean(W/fps) != mean(W)/mean(fps))
        for w in v["windows"]:
            assert w["j_per_frame"] == pytest.approx(w["avg_w"] / w["fps"], rel=0.3)  # fps: busy time only
        assert v["j_per_frame"] == pytest.approx(sum(w["j_per_frame"] for w in v["windows"]) / 2)
    out = render(tmp_path / "p.json", tmp_path / "rep", [MinEnergyAboveFps(1), LatencySLO(1000)])
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = out["html"].read_text()
    assert "data:image/png;base64," in page and "min-energy" in page
    assert "fp32-b1" in out["md"].read_text() and out["csv"].read_text().count("\n") == 5
    r = cli("report", tmp_path / "p.json", "--output", tmp_path / "rep2", "--fps-floor", "1")
    assert r.returncode == 0, r.stderr
    r = cli("report", tmp_path / "missing.json", "--output", tmp_path / "rep3")
    assert r.returncode == 2 and "profile not found" in r.stderr


def test_power_mode_changes_are_opt_in(multi_artifact, tmp_path):
    from inferx_edge.report.profile import profile_artifact
    from inferx_edge.runtime.control import set_power_mode
    from tests.helpers import cli

    with pytest.raises(UsageError, match="never done by default"):
        set_power_mode(0, allowed=False)
    r = cli("profile", multi_artifact, "-o", tmp_path / "p.json", "--power-modes", "0,1")
    assert r.returncode == 2 and "never done by default" in r.stderr
    assert not (tmp_path / "p.json").exists()

    # with the opt-in, a sweep over a fake nvpmodel restores the mode it found
    state = tmp_path / "mode"
    state.write_text("2")
    fake = tmp_path / "nvpmodel"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = "-q" ]; then echo "NV Power Mode: MODE_$(cat {state})"; cat {state}; else echo "$2" > {state}; echo "$2" >> {state}.log; fi
""")
    fake.chmod(0o755)
    prof = profile_artifact(
        multi_artifact,
        tmp_path / "pm.json",
        window_s=0.1,
        repeats=1,
        warmup_s=0.01,
        idle_s=0.05,
        variants=["fp32-b1"],
        backend=FakeNVML(),
        power_modes=[0, 1],
        allow_power_mode_change=True,
        nvpmodel=str(fake),
        log=lambda *a: None,
    )
    assert [v["name"] for v in prof["variants"]] == ["fp32-b1@pm0", "fp32-b1@pm1"]
    assert (tmp_path / "mode.log").read_text().split() == ["0", "1", "2"]  # swept, then restored


def test_garbage_windows_are_rejected_and_unknown_variants_refused():
    g = Governor(MinEnergyAboveFps(1000), dict(TABLE), start="fp16-b8", min_dwell_s=0)
    for bad in (
        VariantStats("fp16-b8", float("nan"), 258, 0.1, 3.1),
        VariantStats("fp16-b8", 2595, -5.0, 0.1, 3.1),
        VariantStats("fp16-b8", 2595, 1e6, 0.1, 3.1),  # a megawatt GPU
        VariantStats("fp16-b8", 2595, 258, float("inf"), 3.1),
    ):
        assert g.observe(bad) is False
    assert g.table["fp16-b8"] == TABLE["fp16-b8"] and len(g.rejected) == 4
    with pytest.raises(UsageError, match="unknown variant 'fp8-b1'"):
        g.observe(VariantStats("fp8-b1", 1, 1, 1, 1))
    with pytest.raises(UsageError, match="unknown variant"):
        Governor(MinEnergyAboveFps(1000), dict(TABLE), start="nope")


def test_a_failing_backend_holds_the_safe_variant_and_never_raises():
    g = Governor(MinEnergyAboveFps(2000), dict(TABLE), start="fp16-b8", min_dwell_s=0)
    g.observe(TABLE["fp16-b8"])  # fp16-b8 met the floor: the safe variant

    def broken():
        raise OSError("sensor gone")

    assert g.step(1.0, broken) == "fp16-b8"
    assert g.step(2.0, lambda: VariantStats("fp16-b8", float("nan"), 1, 1, 1)) == "fp16-b8"
    assert "telemetry lost" in g.decisions[-1]["reason"] and g.rejected[-2]["source"] == "backend"


def test_with_no_safe_history_it_picks_a_variant_that_met_the_constraint_or_the_closest():
    g = Governor(MinEnergyAboveFps(3000), dict(TABLE), start="fp32-b1", min_dwell_s=0)
    assert g.last_safe is None
    assert g.decide(1.0, telemetry_ok=False) == "fp16-b64"  # its last valid window met the floor
    g = Governor(MinEnergyAboveFps(10**6), dict(TABLE), start="fp32-b1", min_dwell_s=0)
    assert g.decide(1.0, telemetry_ok=False) == "fp16-b64"  # nothing met it: the closest (highest FPS)
    assert "closest" in g.decisions[-1]["reason"]


def test_a_profile_without_a_power_sensor_still_gets_a_report(multi_artifact, tmp_path):
    """A CPU host, a laptop, a VM: no telemetry. The report plots throughput against p50/p99 latency
    and says power was not measured, instead of refusing."""
    from inferx_edge.report.profile import profile_artifact
    from inferx_edge.report.render import render

    class NoSensor:
        name = "none"

        def read(self):
            return Sample(time.time(), None)

        def close(self):
            pass

    prof = profile_artifact(
        multi_artifact, tmp_path / "p.json", window_s=0.1, repeats=1, warmup_s=0.01, idle_s=0.05,
        backend=NoSensor(), log=lambda *a: None,
    )  # fmt: skip
    assert all(v["avg_w"] is None and v["fps"] > 0 for v in prof["variants"])
    out = render(tmp_path / "p.json", tmp_path / "rep", [MinEnergyAboveFps(1)])
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page, md = out["html"].read_text(), out["md"].read_text()
    assert "power: not measured" in page and "power: not measured" in md and "needs power measurements" in md
    assert "FPS/p50" in md or "FPS/p99" in md  # the latency fronts


def test_a_broken_variant_is_left_only_for_one_that_meets_the_constraint_or_comes_closer():
    from inferx_edge.runtime.governor import Governor, LatencySLO, VariantStats

    def stats(name, p99, fps=100.0):
        return VariantStats(name, fps, 100.0, 1.0, p99)

    gov = Governor(LatencySLO(50.0), {"a": stats("a", 10.0), "b": stats("b", 30.0)}, start="a", min_dwell_s=0)
    gov.observe(stats("a", 120.0))
    gov.observe(stats("b", 118.0))  # as far from the SLO: no move
    assert gov.decide(1.0) == "a"
    gov.observe(stats("b", 60.0))  # much closer: move
    assert gov.decide(2.0) == "b"
    gov.observe(stats("b", 120.0))
    gov.observe(stats("a", 40.0))  # meets it: move at once
    assert gov.decide(3.0) == "a"
