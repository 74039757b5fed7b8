"""The result types every bench mode reports, shared by the modes, the statistics and the report."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunFigures:
    """What one decoding run measured, beside its tokens."""

    seconds: float  # the decoding call, from entry to return (prompt reading included)
    target_calls: int | None  # forward calls of the target; None where the mode cannot count them
    rounds: int = 0  # speculative rounds (0 for modes that do not draft, or that we cannot see into)
    drafted: int = 0
    accepted: int = 0
    alpha: float | None = None  # mean β over the verified positions; None without drafts
    verified: int = 0  # positions whose β went into alpha (to pool α over runs)
    # Inside the call, where the mode can see it (None otherwise): prompt reading, and the time in
    # draft and target calls after it (what Thm 3.8's c and T(k) are made of).
    prefill_seconds: float | None = None
    draft_seconds: float | None = None
    target_seconds: float | None = None
