"""Pareto fronts and policy picks over a profile's variants."""

from __future__ import annotations

from inferx_edge.runtime.governor import Policy, VariantStats, choose


def pareto_front(points: list[tuple[str, float, float]]) -> set[str]:
    """Names of points not dominated when minimising both coordinates."""
    front = set()
    for name, x, y in points:
        if not any((x2 <= x and y2 <= y) and (x2 < x or y2 < y) for _, x2, y2 in points):
            front.add(name)
    return front


def stats_from_profile(profile: dict) -> dict[str, VariantStats]:
    return {
        v["name"]: VariantStats(
            v["name"], v["fps"], v["avg_w"], v["j_per_frame"], v["p99_ms"], v["batch"], v["precision"]
        )
        for v in profile["variants"]
    }


def fronts(profile: dict) -> dict[str, set[str]]:
    """Pareto fronts: throughput vs power and energy vs p99 (variants with power measured), and
    throughput vs p50 / p99 latency (every variant: what a host without a power sensor can show)."""
    vs = [v for v in profile["variants"] if v["avg_w"] is not None]
    every = profile["variants"]
    return {
        "fps_vs_watts": pareto_front([(v["name"], v["avg_w"], -v["fps"]) for v in vs]),
        "energy_vs_p99": pareto_front([(v["name"], v["j_per_frame"], v["p99_ms"]) for v in vs]),
        "fps_vs_p50": pareto_front([(v["name"], v["p50_ms"], -v["fps"]) for v in every]),
        "fps_vs_p99": pareto_front([(v["name"], v["p99_ms"], -v["fps"]) for v in every]),
    }


def policy_picks(profile: dict, policies: list[Policy]) -> list[dict]:
    table = stats_from_profile(profile)
    out = []
    for p in policies:
        name, ok = choose(p, table)
        out.append({"policy": p.name, "constraint": p.describe(), "pick": name, "feasible": ok})
    return out
