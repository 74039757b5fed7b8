"""An engine step as data: which calls are answered together, in which order, and what each job brings.

Terms (the engine's words, used the same way in ``loop``, ``slots``, ``calls`` and the docs):

- a *job* is one request inside the engine; its *run* (``runs``) is its generation, round by round;
- a *round* is one target call of one job (draft γ, verify, roll back: ``decode.speculative_round``);
- a *step* is one pass of the engine: one round of every generating job, and a chunk of a prompt being read;
- a *call* is one model verb (prefill, score, trim) of one job, posted to the engine (``slots``);
- a *batch* is the calls answered together: a chunk of one prompt (``read``), every job's call on the draft
  model (``draft``: one per draft position), every job's call on the target (``verify``: one target call,
  Σ(γ_i + 1) rows), or the roll-backs (``trim``).

:func:`next_batch` chooses the next batch from the open calls alone (a pure function: testable without a
model or a thread). The jobs' γ are fixed before the step starts; the batches cannot all be known then, because
a draft's next position depends on its last draw (``stop_below``, lookup) — so a step is planned one batch at a
time, each answered before the next is chosen, and the :class:`StepPlan` holds the γ and every batch answered::

    step 812: γ {3: 2, 5: 0, 9: 3}; read 7 [1024:1152] 310 ms; draft 3 9 14 ms; draft 3 9 13 ms; draft 9 11 ms;
    verify 3[100:103] 5[40:41] 9[80:84] = 8 rows 63 ms; step 420 ms

(a prompt read by a job's draft model shows as ``read 7 draft [0:128]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

KINDS = ("trim", "read", "draft", "verify")


@dataclass(frozen=True)
class Part:
    """One job's share of a batch: positions ``start..end - 1`` of its sequence on ``model`` ("target" or
    "draft"; a read: the prompt tokens read; a score: the rows scored; a trim: the positions rolled back)."""

    job: int
    start: int
    end: int
    model: str = "target"

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Batch:
    """The calls to answer together (``calls``: the engine's ``slots.Call`` objects); a read reads at most
    ``budget`` tokens (None: the whole prompt)."""

    kind: str  # one of KINDS
    calls: tuple
    budget: int | None = None


@dataclass
class StepPlan:
    """One engine step: the γ of each job that ran a round (fixed before the step for the jobs already
    generating; for a job whose prompt was read in this step, chosen as it joined), then every batch as answered."""

    step: int
    gammas: dict[int, int] = field(default_factory=dict)  # job id → γ drafted at most this step
    batches: list[tuple[str, tuple[Part, ...]]] = field(default_factory=list)  # (kind, parts), in order
    seconds: list[float] = field(default_factory=list)  # each batch's time to answer, in the order of batches
    wall: float | None = None  # seconds of the whole step (the batches and the jobs' own work between them)

    def add(self, kind: str, parts: Sequence[Part], seconds: float = 0.0) -> None:
        self.batches.append((kind, tuple(parts)))
        self.seconds.append(seconds)

    def of_kind(self, kind: str) -> list[tuple[Part, ...]]:
        return [parts for k, parts in self.batches if k == kind]

    @property
    def verify_rows(self) -> int:
        """Rows of the step's target calls (one call: every generating job's γ_i + 1)."""
        return sum(p.rows for parts in self.of_kind("verify") for p in parts)

    def line(self) -> str:
        """The step in one line (``specdec serve --log-steps``), each batch with its milliseconds and the step's
        wall time last; trims are left out."""
        out = [f"step {self.step}: γ {{{', '.join(f'{j}: {g}' for j, g in self.gammas.items())}}}"]
        for (kind, parts), seconds in zip(self.batches, self.seconds, strict=True):
            ms = f" {1e3 * seconds:.0f} ms"
            if kind == "read":
                out += [f"read {p.job}{' draft' if p.model == 'draft' else ''} [{p.start}:{p.end}]{ms}" for p in parts]
            elif kind == "draft":
                out.append("draft " + " ".join(str(p.job) for p in parts) + ms)
            elif kind == "verify":
                rows = sum(p.rows for p in parts)
                out.append("verify " + " ".join(f"{p.job}[{p.start}:{p.end}]" for p in parts) + f" = {rows} rows{ms}")
        if self.wall is not None:
            out.append(f"step {1e3 * self.wall:.0f} ms")
        return "; ".join(out)


def next_batch(open_calls: Sequence, budget: int | None):
    """The next batch to answer, from the open calls (oldest first) and this step's prompt budget (None: no
    limit; 0: spent), or None when only prompts are left and the budget is spent.

    Order: roll-backs first (they end a round); then a chunk of the oldest prompt while the budget lasts (so a
    job whose prompt is read now joins this step's round); then every draft call, together; then every target
    call, together (one read of the weights for the whole step's verification)."""
    trims = tuple(c for c in open_calls if c.kind == "trim")
    if trims:
        return Batch("trim", trims)
    prompts = [c for c in open_calls if c.kind == "prefill"]
    if prompts and (budget is None or budget > 0):
        return Batch("read", (prompts[0],), budget)
    scores = [c for c in open_calls if c.kind == "score"]
    drafts = tuple(c for c in scores if c.slot.role == "draft")
    if drafts:
        return Batch("draft", drafts)
    if scores:
        return Batch("verify", tuple(scores))
    return None
