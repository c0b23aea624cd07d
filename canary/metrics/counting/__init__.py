"""Evidence counting: Prometheus samples taken once per tick, turned into exact per-interval tallies.

* :mod:`.rules` — the specification: how a revision's counter samples become clean totals and
  tallies (resets and restarts, baselines, new pods, what a range reads, compaction), on plain values;
* :mod:`.book` — :class:`~.book.CounterBook`: the rules applied per revision, the snapshots kept in a
  :class:`~.book.SnapshotStore`, the ranges rollouts ask for, compaction;
* :mod:`.store` — :class:`~.store.ColumnStore`, the snapshot store in use: packed columns, shared
  layouts, tallies built when read;
* :mod:`.decode` — reading the counter sample's answers (typed decoding, interned identities);
* :mod:`.peaks` — gauge peaks per tick (GPU memory, KV cache, warm-up): their book and pipeline;
* :mod:`.pipeline` — what both kinds share: a book per query, one sample per tick (single-flight),
  the past backfilled once within Prometheus' limits;
* :mod:`.counts` — the counted measures' pipeline and their measurements.
"""
