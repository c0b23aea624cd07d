"""Backtests: replay a policy over recorded Prometheus history with the live controller's own code.

:func:`~canary.backtest.history.read_history` finds the periods in which two revisions of an
InferenceService served traffic; :func:`~canary.backtest.replay.replay_period` runs ``decide()`` over
one of them with evidence from :class:`~canary.metrics.prometheus.PrometheusEvidenceSource` at the
historical times; :func:`~canary.backtest.runner.run_backtest` does both for a range, and
:mod:`canary.backtest.render` prints the result (table, JSON, HTML). See docs/design.md §12.
"""
