"""``report``: a profile rendered as PNG plots, one self-contained HTML page, Markdown and CSV tables."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path

from inferx_edge.errors import UsageError
from inferx_edge.report.pareto import fronts, policy_picks

COLUMNS = [
    "name",
    "precision",
    "batch",
    "fps",
    "p50_ms",
    "p99_ms",
    "avg_w",
    "dynamic_w",
    "j_per_frame",
    "dynamic_j_per_frame",
]


def load_profile(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"profile not found: {path}") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not a profile JSON ({exc})") from exc
    if data.get("schema") != "inferx_edge.profile/1" or not data.get("variants"):
        raise UsageError(f"{path} is not an inferx_edge profile (schema inferx_edge.profile/1 with variants)")
    return data


def _fmt(v, key) -> str:
    if v is None:
        return "-"
    if key in ("j_per_frame", "dynamic_j_per_frame"):
        return f"{v * 1e3:.3f}"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


#: the two plots of a profile with power measured, and of one without (x key, y key, front, labels)
_POWER_PLOTS = (
    ("avg_w", "fps", "fps_vs_watts", "average power (W)", "throughput (frames/s)"),
    ("p99_ms", "j_per_frame", "energy_vs_p99", "p99 latency (ms)", "energy (mJ/frame)"),
)
_LATENCY_PLOTS = (
    ("p50_ms", "fps", "fps_vs_p50", "p50 latency (ms)", "throughput (frames/s)"),
    ("p99_ms", "fps", "fps_vs_p99", "p99 latency (ms)", "throughput (frames/s)"),
)


def _twin(profile: dict) -> str:
    """The label every title and table of a twin's profile carries, so nobody takes it for a measurement."""
    if not profile.get("predicted"):
        return ""
    return f"predicted on a twin ({profile.get('twin', 'board model')}), not measured"


def _has_power(profile: dict) -> bool:
    return any(v["avg_w"] is not None for v in profile["variants"])


def _plots(profile: dict, front: dict[str, set[str]], picks: list[dict]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    powered = _has_power(profile)
    vs = [v for v in profile["variants"] if v["avg_w"] is not None] if powered else list(profile["variants"])
    picked: dict[str, str] = {}
    for p in picks:  # several policies may pick the same variant
        picked[p["pick"]] = ", ".join(filter(None, [picked.get(p["pick"]), p["policy"]]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (xk, yk, fk, xl, yl) in zip(axes, _POWER_PLOTS if powered else _LATENCY_PLOTS):
        scale = 1e3 if yk == "j_per_frame" else 1
        for v in vs:
            on = v["name"] in front[fk]
            ax.scatter(v[xk], v[yk] * scale, s=60 if on else 30, c="tab:red" if on else "tab:gray", zorder=3)
            label = v["name"] + (f"  [{picked[v['name']]}]" if v["name"] in picked else "")
            ax.annotate(label, (v[xk], v[yk] * scale), textcoords="offset points", xytext=(5, 4), fontsize=8)
        pts = sorted((v[xk], v[yk] * scale) for v in vs if v["name"] in front[fk])
        if pts:
            ax.plot(*zip(*pts), c="tab:red", lw=1, zorder=2, label="Pareto front")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        if yk == "j_per_frame":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    title = (
        f"{profile['model']} on {profile['device']} ({profile['target']}); idle {profile['idle_w']:.0f} W"
        if profile.get("idle_w")
        else f"{profile['model']} on {profile['device']}" + ("" if powered else " (power: not measured)")
    )
    fig.suptitle(f"{title}\n{_twin(profile).upper()}" if _twin(profile) else title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def render(profile_path: Path, out_dir: Path, policies) -> dict[str, Path]:
    profile = load_profile(profile_path)
    powered = _has_power(profile)
    front = fronts(profile)
    picks = policy_picks(profile, policies)
    power_note = "" if powered else "power: not measured (no power sensor or telemetry on the profiling device); "
    front_a, front_b = ("fps_vs_watts", "energy_vs_p99") if powered else ("fps_vs_p50", "fps_vs_p99")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    twin = _twin(profile)
    rows = [
        {k: v.get(k) for k in COLUMNS}
        | {"pareto_fps_w": v["name"] in front[front_a], "pareto_energy_p99": v["name"] in front[front_b]}
        | ({"predicted_on_twin": profile.get("twin")} if twin else {})
        for v in profile["variants"]
    ]
    with open(out_dir / "variants.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    written["csv"] = out_dir / "variants.csv"

    head = ["variant", "prec", "batch", "FPS", "p50 ms", "p99 ms", "W", "dyn W", "mJ/frame", "dyn mJ/frame", "Pareto"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        labels = ("FPS/W", "J/p99") if powered else ("FPS/p50", "FPS/p99")
        mark = ", ".join(k for k, on in zip(labels, (r["pareto_fps_w"], r["pareto_energy_p99"])) if on)
        lines.append("| " + " | ".join(_fmt(r[k], k) for k in COLUMNS) + f" | {mark or '-'} |")
    picks_md = [
        f"- **{p['policy']}** ({p['constraint']}): `{p['pick']}`"
        + (
            ""
            if p["feasible"]
            else " — no variant meets it; closest shown"
            if powered
            else " — needs power measurements"
        )
        for p in picks
    ]
    md = "\n".join(
        [
            f"# {profile['model']} on {profile['device']}" + (f" — {twin.upper()}" if twin else ""),
            "",
            *([f"**{twin}**: every number below comes from the twin's model of the board.", ""] if twin else []),
            f"{power_note}target {profile['target']}, telemetry {profile['telemetry']}, idle {_fmt(profile.get('idle_w'), 'w')} W, "
            f"{profile['repeats']} windows of {profile['window_s']:g} s per variant",
            "",
            *([f"Variants ({twin}):"] if twin else []),
            *lines,
            "",
            "Policy picks" + (f" ({twin})" if twin else "") + ":",
            *picks_md,
            "",
        ]
    )
    (out_dir / "report.md").write_text(md)
    written["md"] = out_dir / "report.md"

    png = _plots(profile, front, picks)
    (out_dir / "pareto.png").write_bytes(png)
    written["png"] = out_dir / "pareto.png"
    table = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(_fmt(r[k], k))}</td>" for k in COLUMNS)
        + f"<td>{'&#9733;' if r['pareto_fps_w'] or r['pareto_energy_p99'] else ''}</td></tr>"
        for r in rows
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(profile["model"])} profile</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f3f3f3}}</style></head><body>
<h1>{html.escape(profile["model"])} on {html.escape(str(profile["device"]))}{
        html.escape(" — " + twin.upper()) if twin else ""
    }</h1>
<p>{html.escape(power_note)}target {html.escape(profile["target"])}; telemetry {
        html.escape(str(profile["telemetry"]))
    }; idle power
{_fmt(profile.get("idle_w"), "w")} W; {profile["repeats"]} windows of {profile["window_s"]:g} s per variant.
Red points: Pareto-optimal; brackets: what each policy picks.</p>
<img alt="Pareto fronts" src="data:image/png;base64,{base64.b64encode(png).decode()}">
<h2>Variants{html.escape(" (" + twin + ")") if twin else ""}</h2><table><tr>{
        "".join(f"<th>{h}</th>" for h in head)
    }</tr>{table}</table>
<h2>Policy picks{html.escape(" (" + twin + ")") if twin else ""}</h2><ul>{
        "".join(
            f"<li><b>{p['policy']}</b> ({html.escape(p['constraint'])}): {p['pick']}"
            + ("" if p["feasible"] else " (no variant meets it; closest)")
            + "</li>"
            for p in picks
        )
    }</ul>
</body></html>"""
    (out_dir / "report.html").write_text(page)
    written["html"] = out_dir / "report.html"
    return written
