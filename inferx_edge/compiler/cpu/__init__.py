"""CPU targets: default schedules for kernels no tuning record covers, and the Relax pipeline that
applies them (:func:`cpu_pipeline`)."""

from inferx_edge.compiler.cpu.default_schedule import CPUDefaultSchedule, cpu_pipeline

__all__ = ["CPUDefaultSchedule", "cpu_pipeline"]
