"""Tuning: MetaSchedule over every task of a model, databases under tuning_logs/, local or RPC runners."""

from inferx_edge.tune.driver import TuneOptions, TuneSummary, tune_model

__all__ = ["TuneOptions", "TuneSummary", "tune_model"]
