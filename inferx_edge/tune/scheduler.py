"""The task scheduler of ``tune``: every measured batch is in the database before the next is chosen,
and the budget goes where the run time is.

MetaSchedule's gradient scheduler sends one batch of every task to the runner before it joins any
(its round-robin warm-up), and measure callbacks (the database commit among them) run only at a
join: a run killed during the first round kept no record at all. This scheduler joins the task it
just sent before choosing the next, so a kill loses at most the batch in flight.

Choice: first one batch of every task (so every kernel gets a first measurement before any is
refined), then the task with the largest share of the model's time, ``weight x best latency`` (a
kernel called several times counts each call), halved for every consecutive batch of that task that
did not improve it (so a kernel at its best yields to the others). Tasks MetaSchedule terminates (no
more candidates, or ``max_trials_per_task``) are skipped.
"""

from __future__ import annotations

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.task_scheduler import PyTaskScheduler

#: a batch that does not improve a task's best latency halves its priority
STALE_FACTOR = 0.5


def _median_seconds(result) -> float | None:
    if result.error_msg is not None or not result.run_secs:
        return None
    secs = sorted(float(s) for s in result.run_secs)
    return secs[len(secs) // 2]


@derived_object
class CommittingScheduler(PyTaskScheduler):
    """:mod:`inferx_edge.tune.scheduler`'s scheduler (see there). ``on_join(task_id, results)`` is
    called after each batch is committed (progress display); ``prior`` maps task index to the best
    latency (s) the database already holds for it."""

    def __init__(self, on_join=None, prior: dict[int, float] | None = None) -> None:
        super().__init__()
        self.on_join = on_join
        # a resumed run: tasks the database already measured skip the first round, and the budget
        # goes where the time is right away
        self.best: dict[int, float] = dict(prior or {})
        self.stale: dict[int, int] = {}
        self.warmed: set[int] = set(self.best)

    def _tasks(self):
        return self._outer().tasks_  # type: ignore[attr-defined]

    def next_task_id(self) -> int:
        tasks = self._tasks()
        for i, task in enumerate(tasks):
            if not task.is_terminated and task.measure_candidates is not None:
                self._join(i)
        live = [i for i, t in enumerate(tasks) if not t.is_terminated]
        if not live:
            return -1
        cold = [i for i in live if i not in self.warmed]
        if cold:
            self.warmed.add(cold[0])
            return cold[0]

        def share(i: int) -> float:
            best = self.best.get(i)
            if best is None:  # every candidate failed so far: worth another batch before the others
                return float("inf")
            return float(tasks[i].task_weight) * best * STALE_FACTOR ** self.stale.get(i, 0)

        return max(live, key=share)

    # (join_running_task itself is not overridden: C++ calls it virtually, so an override that called the
    # base implementation through the FFI would call itself)
    def _join(self, task_id: int):
        results = self.join_running_task(task_id)
        times = [t for t in (_median_seconds(r) for r in results) if t is not None]
        if times:
            batch_best = min(times)
            if task_id not in self.best or batch_best < self.best[task_id]:
                self.best[task_id] = batch_best
                self.stale[task_id] = 0
            else:
                self.stale[task_id] = self.stale.get(task_id, 0) + 1
        if self.on_join is not None:
            self.on_join(task_id, results)
        return results
