"""Compilation of one variant: the Relax rewrites (``passes/``), the layout policy and variant preparation
(``variant.py``), tuning records applied (``tuning.py``), the CPU pipeline with default schedules (``cpu/``), the
CUDA pipeline and device compiler (``cuda/``), and ahead-of-time compilation + export per target (``compile.py``).

The build stage that packages variants into an artifact is :mod:`inferx_edge.build`.
"""
