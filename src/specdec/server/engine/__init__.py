"""The generation engine: one thread owns the models; each step runs one round of every active job,
their model calls batched (``loop``: the engine; ``slots``: a job's view of the shared models and the calls it
posts; ``calls``: how a batch of calls is answered; ``batch_gamma``: γ priced with the batch's cost; ``jobs``:
a job and its events; ``runs``: one request's generation, round by round)."""

from .jobs import Delta, Failed, Finished, Job
from .loop import PROMPT_CHUNK, Engine, QueueFull, ShuttingDown

__all__ = ["PROMPT_CHUNK", "Delta", "Engine", "Failed", "Finished", "Job", "QueueFull", "ShuttingDown"]
