"""Tiny random-weight GGUF files for the llama.cpp backend's tests (no downloads).

``write_tiny_llama`` writes a 2-layer llama-architecture model with a byte-level BPE ("gpt2")
vocabulary of single letters, which llama.cpp loads like any other GGUF file. Weights are drawn
from a seed; ``head_noise`` perturbs only the output layer (with its own seed), so a draft can be
a noisy copy of a target: close enough that the rule accepts often, different enough that it
rejects too. ``qtype`` stores the layers' linear weights as f32, q8_0 or q4_0 (the gguf package
quantizes those two), so the tests also cover llama.cpp's quantized matrix kernels.
"""

from __future__ import annotations

import string

import numpy as np

N_EMBD = 64  # a multiple of 32, the q8_0 / q4_0 block size
N_FF = 128
N_HEAD = 4
N_HEAD_KV = 2
N_LAYER = 2
N_CTX_TRAIN = 1024


def write_tiny_llama(
    path,
    *,
    vocab: int = 8,
    seed: int = 0,
    head_scale: float = 1.5,
    head_noise: float = 0.0,
    noise_seed: int = 1,
    qtype: str = "f32",
    n_embd: int = N_EMBD,
    n_ff: int = N_FF,
) -> str:
    """Write the model to ``path`` (a str or Path) and return it as a str (``n_embd``, ``n_ff``: wider ones, e.g.
    rows of whole 256-weight blocks for llama.cpp's K and IQ4_XS quantizers)."""
    import gguf

    if not 2 <= vocab <= len(string.ascii_lowercase):
        raise ValueError(f"vocab={vocab} is invalid: must be in [2, {len(string.ascii_lowercase)}]")
    types = {"f32": gguf.GGMLQuantizationType.F32, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_0": gguf.GGMLQuantizationType.Q4_0}
    if qtype not in types:
        raise ValueError(f"qtype={qtype!r} is invalid: choose one of {', '.join(types)}")
    rng = np.random.default_rng(seed)
    head_dim = n_embd // N_HEAD

    def linear(n_out: int, n_in: int) -> np.ndarray:  # [out, in], GGUF stores it as ne = [in, out]
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    tensors: dict[str, tuple[np.ndarray, bool]] = {  # name → (weights, quantizable)
        "token_embd.weight": (rng.standard_normal((vocab, n_embd)).astype(np.float32), False),
        "output_norm.weight": (np.ones(n_embd, dtype=np.float32), False),
    }
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        tensors |= {
            f"{blk}.attn_norm.weight": (np.ones(n_embd, dtype=np.float32), False),
            f"{blk}.attn_q.weight": (linear(n_embd, n_embd), True),
            f"{blk}.attn_k.weight": (linear(N_HEAD_KV * head_dim, n_embd), True),
            f"{blk}.attn_v.weight": (linear(N_HEAD_KV * head_dim, n_embd), True),
            f"{blk}.attn_output.weight": (linear(n_embd, n_embd), True),
            f"{blk}.ffn_norm.weight": (np.ones(n_embd, dtype=np.float32), False),
            f"{blk}.ffn_gate.weight": (linear(n_ff, n_embd), True),
            f"{blk}.ffn_up.weight": (linear(n_ff, n_embd), True),
            f"{blk}.ffn_down.weight": (linear(n_embd, n_ff), True),
        }
    head = linear(vocab, n_embd) * head_scale  # [vocab, n_embd]
    if head_noise:
        head = head + np.random.default_rng(noise_seed).standard_normal(head.shape).astype(np.float32) * (
            head_noise * head_scale / np.sqrt(n_embd)
        )
    tensors["output.weight"] = (head.astype(np.float32), False)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    letters = list(string.ascii_lowercase[:vocab])
    writer.add_token_list(letters)
    writer.add_token_types([gguf.TokenType.NORMAL] * vocab)
    writer.add_token_merges([f"{letters[0]} {letters[1]}"])  # llama.cpp requires the key
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(vocab - 1)
    writer.add_add_bos_token(False)
    for name, (weights, quantizable) in tensors.items():
        if quantizable and qtype != "f32":
            writer.add_tensor(name, gguf.quants.quantize(weights, types[qtype]), raw_dtype=types[qtype])
        else:
            writer.add_tensor(name, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)
