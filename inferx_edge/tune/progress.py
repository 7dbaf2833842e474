"""Live progress of a tuning run (tqdm): task, trials done, best latency so far, ETA; time limit."""

from __future__ import annotations

import math
import time

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback


class TimeLimitReached(Exception):
    """Raised by the measure callback once the wall-clock limit has passed: it unwinds MetaSchedule's
    task scheduler after the batch's records are in the database (the database callback runs first).
    Terminating the tasks from the callback instead crashed TVM 0.27's gradient scheduler: it could
    pick a task it had listed as alive before the callback terminated it (``!task->is_terminated``)."""


class Progress:
    def __init__(self, task_names: list[str], before: dict[str, int], budget: int, minutes: float | None) -> None:
        from tqdm import tqdm

        self.names = task_names
        self.best = dict.fromkeys(task_names, math.inf)
        self.done = dict(before)
        self.trials = 0
        self.valid = 0
        self.deadline = time.time() + minutes * 60 if minutes else None
        self.stopped_by_time = False
        self.bar = tqdm(total=budget, unit="trial", dynamic_ncols=True, smoothing=0.1)

    def callback(self):
        progress = self

        @derived_object
        class _Callback(PyMeasureCallback):
            def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
                progress.update(task_id, builder_results, runner_results)

        return _Callback()

    def update(self, task_id: int, builder_results, runner_results) -> None:
        name = self.names[task_id]
        for b, r in zip(builder_results, runner_results):
            self.trials += 1
            self.done[name] = self.done.get(name, 0) + 1
            if b.error_msg is None and r.error_msg is None and r.run_secs:
                secs = [float(s) for s in r.run_secs]
                self.valid += 1
                self.best[name] = min(self.best[name], sum(secs) / len(secs))
        best = self.best[name]
        self.bar.set_postfix_str(
            f"task {task_id + 1}/{len(self.names)} {name[:28]} trials {self.done[name]} "
            f"best {'-' if math.isinf(best) else f'{best * 1e6:.1f}us'} valid {self.valid}/{self.trials}",
            refresh=False,
        )
        self.bar.update(len(runner_results))
        if self.deadline and time.time() > self.deadline:
            self.stopped_by_time = True
            raise TimeLimitReached

    def close(self) -> None:
        self.bar.close()
