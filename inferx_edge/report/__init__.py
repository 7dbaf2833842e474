"""Profiling sweeps (on the device, runtime only) and Pareto reports (PNG, HTML, Markdown, CSV)."""
