"""A cut LM head for the draft: logits for the most frequent tokens only, −inf for the rest.

The draft's output head is a large share of what it reads per token (151,936 × 896 of the default
0.5B draft's 494 M parameters). Cut to the ``n`` tokens most frequent in a corpus (plus every special
token), its q is exactly zero outside the kept set. The rule stays exact: it only needs each drafted
token to be drawn from the q it reports; a target token outside the set is never drafted, and the
recovered-token draw from norm(max(0, p − q)) supplies it with the right probability. Only the
target must never be cut.

``specdec.loading.frequent`` chooses the kept tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class CutHead(torch.nn.Module):
    """``[..., hidden] → [..., vocab]`` logits: a linear layer over the kept rows, −inf elsewhere."""

    def __init__(self, head: torch.nn.Module, keep: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        weight = head.weight.detach()[keep]  # [n_keep, hidden]
        bias = getattr(head, "bias", None)
        self.linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                                      device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(weight)
            if bias is not None:
                self.linear.bias.copy_(bias.detach()[keep])
        self.register_buffer("keep", keep.to(weight.device), persistent=False)  # [n_keep] token ids
        self.out_features = vocab_size
        self.weight = self.linear.weight  # what callers read the head's shape and dtype from

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # hidden: [..., hidden_size]
        kept = self.linear(hidden)  # [..., n_keep]
        logits = kept.new_full((*kept.shape[:-1], self.out_features), float("-inf"))  # [..., vocab]
        return logits.index_copy_(-1, self.keep, kept)


def cut_head(model, keep: Sequence[int]) -> None:
    """Replace a transformers causal LM's output head by a :class:`CutHead` over ``keep`` (in place)."""
    head = model.get_output_embeddings()
    vocab_size = int(getattr(head, "out_features", None) or head.weight.shape[0])
    ids = torch.as_tensor(sorted(set(int(i) for i in keep)), dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("a cut head must keep at least one token id")
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise ValueError(f"kept token ids must lie in [0, {vocab_size}); got ids from {int(ids[0])} to {int(ids[-1])}")
    model.config.tie_word_embeddings = False  # the embedding keeps every row; only the head is cut
    model.set_output_embeddings(CutHead(head, ids, vocab_size))
