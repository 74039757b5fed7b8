"""A tiny random Qwen2 GGUF file in the K-quant formats the native backend's kernels read (no downloads).

The gguf package cannot quantize to Q4_K/Q6_K, so the blocks are drawn at random with fp16 scales
chosen to keep weights centred and of size ≈ 1/√(row length): a valid file whose de-quantized
weights (``gguf.quants.dequantize``) are a well-defined model that transformers can run too.
Hidden size 256 = one Q4_K block per row; biases on q/k/v as in Qwen2; one layer's attn_v and every
ffn_down and the output head in Q6_K, as llama.cpp's Q4_K_M mixes them.
"""

from __future__ import annotations

import numpy as np

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB, CONTEXT = 256, 512, 4, 2, 2, 300, 2048
ROPE_BASE, EPS = 1_000_000.0, 1e-6


def q4k_blocks(rng, rows: int, cols: int) -> np.ndarray:
    """[rows, cols / 256 * 144] random block_q4_K bytes (d, dmin, 12 scale bytes, 128 nibble bytes)."""
    blocks = rng.integers(0, 256, size=(rows, cols // 256, 144), dtype=np.uint8)
    d = 2.0 / (63 * 15 * np.sqrt(cols))
    blocks[:, :, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    blocks[:, :, 2:4] = np.frombuffer(np.float16(7.5 * d).tobytes(), np.uint8)  # dmin: centres the weights
    return blocks.reshape(rows, -1)


def q6k_blocks(rng, rows: int, cols: int) -> np.ndarray:
    """[rows, cols / 256 * 210] random block_q6_K bytes (ql, qh, 16 int8 scales, d)."""
    blocks = rng.integers(0, 256, size=(rows, cols // 256, 210), dtype=np.uint8)
    blocks[:, :, 208:210] = np.frombuffer(np.float16(3.0 / (64 * 32 * np.sqrt(cols))).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def add_byte_level_tokenizer(writer, vocab: int) -> None:
    """A GPT-2 style byte-level BPE vocabulary of ``vocab`` (>= 257) tokens in the file: the 256 bytes, merges of
    letter pairs, and ``<|endoftext|>`` last (the EOS id), so that transformers builds a tokenizer from it."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    if vocab < 257:
        raise ValueError(f"vocab={vocab} is invalid with a tokenizer: must be >= 257 (256 bytes and the EOS)")
    spelled = bytes_to_unicode()
    letters = "etaoinshrdlucmfwypvbgk"
    pairs = [(a, b) for a in spelled[ord(" ")] + letters for b in letters][: vocab - 257]
    tokens = [spelled[byte] for byte in range(256)] + [a + b for a, b in pairs] + ["<|endoftext|>"]
    if len(tokens) != vocab:
        raise ValueError(f"vocab={vocab} is invalid with a tokenizer: at most {257 + len(pairs)}")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 1) + [3])  # NORMAL, the EOS CONTROL
    writer.add_token_merges([f"{a} {b}" for a, b in pairs])


def write_tiny_qwen2(path, *, seed: int = 0, vocab: int = VOCAB, head_scale: float = 1.0,
                     tokenizer: bool = False) -> str:
    """``tokenizer``: also a byte-level vocabulary (:func:`add_byte_level_tokenizer`), for runs through the CLI."""
    import gguf

    rng = np.random.default_rng(seed)
    Q4K, Q6K = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
    kv = HIDDEN // HEADS * KV_HEADS
    head = q6k_blocks(rng, vocab, HIDDEN)
    if head_scale != 1.0:  # scale d of every block: logits × head_scale (flatter or sharper distributions)
        d = head.reshape(vocab, -1, 210)[:, :, 208:210].copy().view(np.float16) * np.float16(head_scale)
        head.reshape(vocab, -1, 210)[:, :, 208:210] = d.view(np.uint8)
    tensors = {"token_embd.weight": (q4k_blocks(rng, vocab, HIDDEN), Q4K),
               "output_norm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), None),
               "output.weight": (head, Q6K)}
    for i in range(LAYERS):
        b = f"blk.{i}"
        tensors |= {
            f"{b}.attn_norm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), None),
            f"{b}.attn_q.weight": (q4k_blocks(rng, HIDDEN, HIDDEN), Q4K),
            f"{b}.attn_q.bias": (0.1 * rng.standard_normal(HIDDEN).astype(np.float32), None),
            f"{b}.attn_k.weight": (q4k_blocks(rng, kv, HIDDEN), Q4K),
            f"{b}.attn_k.bias": (0.1 * rng.standard_normal(kv).astype(np.float32), None),
            f"{b}.attn_v.weight": ((q6k_blocks if i == 0 else q4k_blocks)(rng, kv, HIDDEN), Q6K if i == 0 else Q4K),
            f"{b}.attn_v.bias": (0.1 * rng.standard_normal(kv).astype(np.float32), None),
            f"{b}.attn_output.weight": (q4k_blocks(rng, HIDDEN, HIDDEN), Q4K),
            f"{b}.ffn_norm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), None),
            f"{b}.ffn_gate.weight": (q4k_blocks(rng, FFN, HIDDEN), Q4K),
            f"{b}.ffn_up.weight": (q4k_blocks(rng, FFN, HIDDEN), Q4K),
            f"{b}.ffn_down.weight": (q6k_blocks(rng, HIDDEN, FFN), Q6K),
        }
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_eos_token_id(vocab - 1)
    if tokenizer:
        add_byte_level_tokenizer(writer, vocab)
    return write_tensors(writer, tensors, path)


def write_tensors(writer, tensors: dict, path) -> str:
    """Add ``tensors`` (name → (data, raw qtype or None)) to ``writer``, write the file and return its path."""
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype) if qtype is not None else writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def transformers_twin(path: str):
    """The same model in transformers (weights de-quantized to float32 by gguf), the reference forward pass."""
    import torch
    from gguf import GGUFReader, quants
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CONTEXT,
                         rope_theta=ROPE_BASE, rms_norm_eps=EPS, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    weights = {t.name: torch.from_numpy(np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
               for t in GGUFReader(path).tensors}
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    parts = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    state = {}
    for name, value in weights.items():
        if name.startswith("blk."):
            _, i, part, kind = name.split(".")
            state[f"model.layers.{i}.{parts[part]}.{kind}"] = value
        else:
            state[names[name]] = value
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model
