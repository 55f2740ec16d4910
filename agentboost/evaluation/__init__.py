"""The evaluator behind ``agentboost eval``: resumable runs, pass@k, reports."""

from .passk import pass_at_k, pass_hat_k
from .report import EvalReport, build_report
from .store import EpisodeStore, ResumeMismatch

__all__ = ["EpisodeStore", "EvalReport", "ResumeMismatch", "build_report", "pass_at_k", "pass_hat_k"]
