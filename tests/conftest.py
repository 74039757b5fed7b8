"""Shared fixtures: tiny models built in-process (no downloads)."""

import numpy as np
import pytest
import torch

# The unit tests push tiny tensors through many small ops: one thread avoids OpenMP spin-waits
# that make such ops 10x slower on a busy 2-core machine. The real-model tests raise it again.
torch.set_num_threads(1)


def random_table(rng: np.random.Generator, vocab: int, concentration: float = 1.0, zeros: int = 0) -> np.ndarray:
    """A random row-stochastic [V, V] table; `zeros` entries per row forced to 0."""
    table = rng.dirichlet(np.full(vocab, concentration), size=vocab)
    for row in table:
        if zeros:
            row[rng.choice(vocab, size=zeros, replace=False)] = 0.0
            row /= row.sum()
    return table


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def tiny_qwen(vocab: int = 96, seed: int = 0, dtype=torch.float64):
    """A random-weight Qwen2 causal LM built from a config (float64: no near-ties from rounding)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # Sharper logits than the default init, so sampling and greedy paths both matter.
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
    return model.to(dtype).eval()


def start_explorer(explorer=None):
    """The explorer's app (``explorer``, default the toy pair) served by uvicorn on a daemon thread at an
    ephemeral 127.0.0.1 port, as ``specdec explore`` serves it; the caller calls ``stop()``."""
    from specdec.explorer import Explorer, create_app
    from specdec.server.runner import ServerThread

    explorer = explorer or Explorer()
    srv = ServerThread(create_app(explorer))
    srv.explorer = explorer
    return srv


@pytest.fixture(scope="module")
def server():
    """The explorer on the toy pair, on an ephemeral loopback port."""
    srv = start_explorer()
    yield srv
    srv.stop()
