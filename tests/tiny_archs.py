"""Tiny random Llama, Qwen3 and Gemma 3 GGUF files in the formats the native backend's kernels read, and their
transformers twins (no downloads).

Blocks are drawn at random (``tiny_qwen2``'s Q4_K/Q6_K writers, Q8_0 and Q5_0 here) with scales that keep weights
centred and of size ≈ 1/√(row length); the de-quantized weights (``gguf.quants.dequantize``) are a well-defined
model that transformers runs too, with the file's layout undone where llama.cpp's converter changed it:

- ``llama``: the file's q/k rows are in llama.cpp's adjacent-pair rotary layout (its converter permutes them;
  the twin undoes that with transformers' own GGUF loader's ``LlamaTensorProcessor``); a ``rope_freqs.weight``
  tensor written by the converter's formula for a llama3 rotary scaling, which the twin computes itself from its
  config; the head tied to the embedding;
- ``qwen3``: head_dim 128 with hidden 256 and 4 heads (q 512 wide), q/k norms;
- ``gemma3``: norms stored as 1 + w (the converter's shift; the twin gets w by transformers'
  ``Gemma2TensorProcessor``, which its loader uses for gemma3), a sliding window of :data:`WINDOW` on layers 0
  and 2 and a global layer 1 (an explicit pattern), 4 heads × 128 over one kv head (q 512 wide, hidden 256),
  q/k/v in Q5_0, the attention output in Q8_0, the tied head in Q8_0, tanh-GELU.
"""

from __future__ import annotations

import math

import numpy as np
from tiny_qwen2 import q4k_blocks, q6k_blocks, write_tensors

VOCAB, CONTEXT, EPS = 300, 2048, 1e-6
WINDOW = 24  # gemma3's sliding window: smaller than most tested contexts
GEMMA_PATTERN = (True, False, True)  # per layer: sliding (True) or global
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
SHAPES = {  # hidden, ffn, heads, kv heads, head_dim, layers
    "llama": (256, 512, 4, 2, 64, 2),
    "qwen3": (256, 512, 4, 2, 128, 2),
    "gemma3": (256, 512, 4, 1, 128, len(GEMMA_PATTERN)),
}
ARCHS = tuple(SHAPES)


def q8_0_blocks(rng, rows: int, cols: int, size: float = 1.0) -> np.ndarray:
    """[rows, cols / 32 * 34] random block_q8_0 bytes (fp16 d, 32 int8), weights of size ≈ size / √cols."""
    blocks = rng.integers(-127, 128, size=(rows, cols // 32, 34)).astype(np.int8).view(np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(size * np.sqrt(3) / (127 * np.sqrt(cols))).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def q5_0_blocks(rng, rows: int, cols: int) -> np.ndarray:
    """[rows, cols / 32 * 22] random block_q5_0 bytes (fp16 d, 4 bytes of high bits, 16 nibble bytes)."""
    blocks = rng.integers(0, 256, size=(rows, cols // 32, 22), dtype=np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(1 / (9.2 * np.sqrt(cols))).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def llama3_factors(head_dim: int) -> np.ndarray:
    """The converter's rope_freqs for :data:`LLAMA3_ROPE` (conversion/llama.py ``generate_extra_tensors``)."""
    p = LLAMA3_ROPE
    freqs = 1.0 / (p["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old, low, high = p["original_max_position_embeddings"], p["low_freq_factor"], p["high_freq_factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(p["factor"])
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / p["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def _norm(rng, n: int, size: float = 1.0) -> tuple:
    return (size * (1 + 0.1 * rng.standard_normal(n))).astype(np.float32), None


def write_tiny(path, arch: str, *, seed: int = 0, vocab: int = VOCAB, head_scale: float = 1.0) -> str:
    """A tiny ``arch`` GGUF (one of :data:`ARCHS`); ``head_scale`` scales the logits (flatter or sharper)."""
    import gguf

    hidden, ffn, heads, kv_heads, head_dim, layers = SHAPES[arch]
    rng = np.random.default_rng(seed)
    Q4K, Q6K, Q8, Q5 = (gguf.GGMLQuantizationType[name] for name in ("Q4_K", "Q6_K", "Q8_0", "Q5_0"))
    gemma = arch == "gemma3"
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    qkv, qkv_type = (q5_0_blocks, Q5) if gemma else (q4k_blocks, Q4K)
    out, out_type = (q8_0_blocks, Q8) if gemma else (q4k_blocks, Q4K)
    # Gemma's embedding is scaled by sqrt(hidden) = 16 on the way in: rows 4x smaller (and the output norm 4x
    # larger, for logits of the usual size) keep a tied head from predicting the current token every time
    embed = (q8_0_blocks(rng, vocab, hidden, 0.25), Q8) if gemma else (q4k_blocks(rng, vocab, hidden), Q4K)
    tensors = {"token_embd.weight": embed, "output_norm.weight": _norm(rng, hidden, 4.0 if gemma else 1.0)}
    if arch == "qwen3":  # llama and gemma3: the head tied to the embedding
        tensors["output.weight"] = (q6k_blocks(rng, vocab, hidden), Q6K)
    if arch == "llama":
        tensors["rope_freqs.weight"] = (llama3_factors(head_dim), None)
    for i in range(layers):
        b = f"blk.{i}"
        tensors |= {
            f"{b}.attn_norm.weight": _norm(rng, hidden),
            f"{b}.attn_q.weight": (qkv(rng, q_rows, hidden), qkv_type),
            f"{b}.attn_k.weight": (qkv(rng, kv_rows, hidden), qkv_type),
            f"{b}.attn_v.weight": ((q6k_blocks if i == 0 and not gemma else qkv)(rng, kv_rows, hidden),
                                   Q6K if i == 0 and not gemma else qkv_type),
            f"{b}.attn_output.weight": (out(rng, hidden, q_rows), out_type),
            f"{b}.ffn_norm.weight": _norm(rng, hidden),
            f"{b}.ffn_gate.weight": (q4k_blocks(rng, ffn, hidden), Q4K),
            f"{b}.ffn_up.weight": (q4k_blocks(rng, ffn, hidden), Q4K),
            f"{b}.ffn_down.weight": (q6k_blocks(rng, hidden, ffn), Q6K),
        }
        if arch in ("qwen3", "gemma3"):
            tensors |= {f"{b}.attn_{x}_norm.weight": _norm(rng, head_dim) for x in "qk"}
        if gemma:
            tensors |= {f"{b}.post_attention_norm.weight": _norm(rng, hidden),
                        f"{b}.post_ffw_norm.weight": _norm(rng, hidden)}
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    if head_scale != 1.0:  # scale every block's fp16 scales in the head: logits × head_scale
        data, qtype = tensors[head]
        size, offsets = {Q6K: (210, (208,)), Q4K: (144, (0, 2)), Q8: (34, (0,))}[qtype]
        blocks = data.reshape(vocab, -1, size)
        for at in offsets:
            d = blocks[:, :, at:at + 2].copy().view(np.float16) * np.float16(head_scale)
            blocks[:, :, at:at + 2] = d.view(np.uint8)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_eos_token_id(vocab - 1)
    if arch == "llama":
        writer.add_rope_freq_base(LLAMA3_ROPE["rope_theta"])
        writer.add_rope_dimension_count(head_dim)
    else:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_freq_base(1_000_000.0)
    if gemma:  # rope.freq_base_swa absent: llama.cpp's default 10000 on the sliding layers
        writer.add_sliding_window(WINDOW)
        writer.add_sliding_window_pattern(list(GEMMA_PATTERN))
    return write_tensors(writer, tensors, path)


def _hf_config(arch: str, vocab: int):
    import transformers

    hidden, ffn, heads, kv_heads, head_dim, layers = SHAPES[arch]
    shape = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                 num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                 max_position_embeddings=CONTEXT, rms_norm_eps=EPS)
    if arch == "llama":
        return transformers.LlamaConfig(**shape, rope_parameters=dict(LLAMA3_ROPE), tie_word_embeddings=True)
    if arch == "qwen3":
        return transformers.Qwen3Config(**shape, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                        tie_word_embeddings=False)
    layer_types = ["sliding_attention" if s else "full_attention" for s in GEMMA_PATTERN]
    return transformers.Gemma3TextConfig(
        **shape, sliding_window=WINDOW, layer_types=layer_types, query_pre_attn_scalar=head_dim,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)


PARTS = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
         "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm"}
NORMS = {"llama": "post_attention_layernorm", "qwen3": "post_attention_layernorm",
         "gemma3": "pre_feedforward_layernorm"}  # where the file's ffn_norm goes


def transformers_twin(path: str, arch: str):
    """The same model in transformers (weights de-quantized to float32 by gguf), the reference forward pass."""
    import torch
    import transformers
    from gguf import GGUFReader, quants
    from transformers.modeling_gguf_pytorch_utils import Gemma2TensorProcessor, LlamaTensorProcessor, TensorProcessor

    heads, kv_heads = SHAPES[arch][2], SHAPES[arch][3]
    processor = {"llama": LlamaTensorProcessor({"num_attention_heads": heads, "num_key_value_heads": kv_heads}),
                 "gemma3": Gemma2TensorProcessor()}.get(arch, TensorProcessor())
    reader = GGUFReader(path)
    vocab = next(int(t.shape[1]) for t in reader.tensors if t.name == "token_embd.weight")
    config = _hf_config(arch, vocab)
    config._attn_implementation = "eager"
    cls = {"llama": transformers.LlamaForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
           "gemma3": transformers.Gemma3ForCausalLM}[arch]
    model = cls(config).eval()
    parts = PARTS | {"ffn_norm": NORMS[arch], "post_attention_norm": "post_attention_layernorm"}
    state = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            continue  # the twin's llama3 rotary computes these itself
        value = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        value = np.ascontiguousarray(processor.process(value, t.name).weights)  # q/k unpermuted, Gemma's 1 + w undone
        if t.name.startswith("blk."):
            _, i, part, kind = t.name.split(".")
            state[f"model.layers.{i}.{parts[part]}.{kind}"] = torch.from_numpy(value)
        else:
            name = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                    "output.weight": "lm_head.weight"}[t.name]
            state[name] = torch.from_numpy(value)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert not unexpected and all("rotary" in m or m in tied for m in missing), (missing, unexpected)
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


def write_other_arch(path, arch: str = "mamba") -> str:
    """A GGUF file of an architecture the native backend does not run (metadata and one tensor)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 16), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)
