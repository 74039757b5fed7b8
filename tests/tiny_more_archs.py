"""Tiny random Phi-3 and Granite GGUF files for the native backend, and their transformers twins (no downloads).

As ``tiny_archs``: random blocks of the kernels' types (or float32 weights, for llama.cpp itself), the
de-quantized weights a model that transformers runs too.

- ``phi3``: Phi-4-mini's layout at a small size: q, k and v fused in ``attn_qkv`` (Q4_K in layer 0, Q8_0 in layer
  1), gate and up fused in ``ffn_up``, NEOX rotary over :data:`ROPE_DIMS` of 64 head dimensions, LongRoPE's
  short and long factors with an original context of :data:`ORIGINAL` (so the tests cross it) and its attention
  factor; a sliding window of :data:`WINDOW` (``window``; Phi-3-mini-4k's kind); an untied Q6_K head;
- ``granite``: Llama's layout (separate q/k/v in llama.cpp's adjacent-pair rotary layout, which the twin undoes
  with transformers' ``LlamaTensorProcessor``) with Granite 3.x's four multipliers (:data:`GRANITE_SCALES`) and the
  head tied to the embedding.

``qtype="f32"`` / ``"q8_0"``: every matrix float32 / Q8_0 (gguf's quantizer; the embedding and head float32, as
``tiny_gguf``'s) and a letter
vocabulary (at most 26 tokens) that llama.cpp loads.
"""

from __future__ import annotations

import math
import string

import numpy as np
from tiny_archs import q8_0_blocks
from tiny_qwen2 import q4k_blocks, q6k_blocks, write_tensors

VOCAB, CONTEXT, EPS = 300, 2048, 1e-6
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 256, 512, 4, 2, 64, 2
ROPE_DIMS = 48  # Phi-4-mini's partial rotary factor, 0.75, of 64
ORIGINAL = 32  # phi3's original context: the long factors from this position on
WINDOW = 24
GRANITE_SCALES = {"embedding": 12.0, "residual": 0.22, "attention": 0.03125, "logit": 8.0}  # 1/32, not 1/sqrt(64)
ARCHS = ("phi3", "granite")


def longrope_factors(seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Short factors near 1, long factors growing to ~40 from the fast frequencies to the slow (as Phi's are)."""
    rng = np.random.default_rng(seed)
    half = ROPE_DIMS // 2
    short = 1.0 + 0.5 * rng.random(half)
    long = np.linspace(1.0, 40.0, half) * (1.0 + 0.1 * rng.random(half))
    return short.astype(np.float32), long.astype(np.float32)


def attn_factor(context: int, original: int) -> float:
    """The converter's LongRoPE attention factor (transformers' default for ``longrope``)."""
    scale = context / original
    return math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0


def _norm(rng, n: int, size: float = 1.0) -> tuple:
    return (size * (1 + 0.1 * rng.standard_normal(n))).astype(np.float32), None


def write_tiny_more(path, arch: str, *, seed: int = 0, vocab: int = VOCAB, head_scale: float = 1.0,
                    qtype: str = "mixed", window: int = WINDOW, original: int = ORIGINAL,
                    context: int = CONTEXT, layers: int = LAYERS) -> str:
    """A tiny ``arch`` GGUF (one of :data:`ARCHS`); ``head_scale`` scales the logits; ``window`` 0: none;
    ``layers`` below :data:`LAYERS` with the same seed: the first layers, embedding and head of that model (a draft
    that agrees with it often, not always)."""
    import gguf

    rng = np.random.default_rng(seed)
    Q4K, Q6K, Q8 = (gguf.GGMLQuantizationType[name] for name in ("Q4_K", "Q6_K", "Q8_0"))
    phi = arch == "phi3"

    def matrix(rows, cols, kind=q4k_blocks, kind_type=Q4K, size=1.0, embedding=False):
        if qtype in ("f32", "q8_0"):
            weights = (size * rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
            return (weights, None) if qtype == "f32" or embedding else (gguf.quants.quantize(weights, Q8), Q8)
        return kind(rng, rows, cols), kind_type

    q_rows, kv_rows = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    embed_size = 1.0 if phi else 0.08  # Granite's rows are times 12 on the way in
    if qtype in ("f32", "q8_0"):
        tensors = {"token_embd.weight": matrix(vocab, HIDDEN, size=embed_size * np.sqrt(HIDDEN) / 4, embedding=True)}
    else:
        tensors = {"token_embd.weight": (q4k_blocks(rng, vocab, HIDDEN), Q4K) if phi else
                   (q8_0_blocks(rng, vocab, HIDDEN, embed_size), Q8)}
    tensors["output_norm.weight"] = _norm(rng, HIDDEN, 1.0 if phi else 40.0)  # Granite: logits / 8, a small tied head
    if phi:
        tensors["output.weight"] = matrix(vocab, HIDDEN, q6k_blocks, Q6K, embedding=True)  # q8_0: float32 too
        short, long = longrope_factors()
        tensors |= {"rope_factors_short.weight": (short, None), "rope_factors_long.weight": (long, None)}
    for i in range(layers):
        b = f"blk.{i}"
        tensors[f"{b}.attn_norm.weight"] = _norm(rng, HIDDEN)
        if phi:
            tensors[f"{b}.attn_qkv.weight"] = matrix(q_rows + 2 * kv_rows, HIDDEN, *((q8_0_blocks, Q8) if i else ()))
        else:
            tensors |= {f"{b}.attn_q.weight": matrix(q_rows, HIDDEN), f"{b}.attn_k.weight": matrix(kv_rows, HIDDEN),
                        f"{b}.attn_v.weight": matrix(kv_rows, HIDDEN, q6k_blocks, Q6K)}
        tensors[f"{b}.attn_output.weight"] = matrix(HIDDEN, q_rows, q8_0_blocks, Q8)
        tensors[f"{b}.ffn_norm.weight"] = _norm(rng, HIDDEN)
        if phi:
            tensors[f"{b}.ffn_up.weight"] = matrix(2 * FFN, HIDDEN)  # the gate's rows, then up's
        else:
            tensors |= {f"{b}.ffn_gate.weight": matrix(FFN, HIDDEN), f"{b}.ffn_up.weight": matrix(FFN, HIDDEN)}
        tensors[f"{b}.ffn_down.weight"] = matrix(HIDDEN, FFN, q6k_blocks, Q6K)
    head = "output.weight" if phi else "token_embd.weight"
    if head_scale != 1.0:
        data, kind = tensors[head]
        if kind is None:
            tensors[head] = (data * np.float32(head_scale), None)
        else:  # every block's fp16 scales times head_scale
            size, offsets = {Q6K: (210, (208,)), Q4K: (144, (0, 2)), Q8: (34, (0,))}[kind]
            blocks = data.reshape(vocab, -1, size)
            for at in offsets:
                blocks[:, :, at:at + 2] = (blocks[:, :, at:at + 2].copy().view(np.float16)
                                           * np.float16(head_scale)).view(np.uint8)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(context)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(10_000.0)
    if phi:  # as the converter writes them
        writer.add_rope_dimension_count(ROPE_DIMS)
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(attn_factor(context, original))
        writer.add_sliding_window(window)
    else:
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_embedding_scale(GRANITE_SCALES["embedding"])
        writer.add_residual_scale(GRANITE_SCALES["residual"])
        writer.add_attention_scale(GRANITE_SCALES["attention"])
        writer.add_logit_scale(GRANITE_SCALES["logit"])
    if qtype != "mixed":  # for llama.cpp: a vocabulary
        letters = list(string.ascii_lowercase[:vocab])
        writer.add_vocab_size(vocab)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(letters)
        writer.add_token_types([gguf.TokenType.NORMAL] * vocab)
        writer.add_token_merges([f"{letters[0]} {letters[1]}"])
        writer.add_bos_token_id(0)
        writer.add_add_bos_token(False)
    writer.add_eos_token_id(vocab - 1)
    return write_tensors(writer, tensors, path)


def _hf_config(arch: str, vocab: int, window: int, original: int, context: int, factors=None):
    import transformers

    shape = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=context,
                 rms_norm_eps=EPS, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    if arch == "phi3":
        short, long = factors or longrope_factors()
        rope = {"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": ROPE_DIMS / HEAD_DIM,
                "factor": context / original,  # transformers' default from the two lengths, said so
                "short_factor": short.tolist(), "long_factor": long.tolist()}
        return transformers.Phi3Config(**shape, original_max_position_embeddings=original, rope_parameters=rope,
                                       sliding_window=window or None, tie_word_embeddings=False)
    s = GRANITE_SCALES
    return transformers.GraniteConfig(**shape, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                                      embedding_multiplier=s["embedding"], residual_multiplier=s["residual"],
                                      attention_multiplier=s["attention"], logits_scaling=s["logit"],
                                      tie_word_embeddings=True)


PARTS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_qkv": "self_attn.qkv_proj",
         "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_down": "mlp.down_proj", "ffn_gate": "mlp.gate_proj"}


def transformers_twin(path: str, arch: str, *, window: int = WINDOW, original: int = ORIGINAL,
                      context: int = CONTEXT, factors: tuple | None = None):
    """The same model in transformers (weights de-quantized to float32 by gguf), the reference forward pass;
    ``factors``: phi3's (short, long) LongRoPE factors in its config instead of the file's."""
    import torch
    import transformers
    from gguf import GGUFReader, quants
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, TensorProcessor

    phi = arch == "phi3"
    processor = TensorProcessor() if phi else LlamaTensorProcessor({"num_attention_heads": HEADS,
                                                                    "num_key_value_heads": KV_HEADS})
    reader = GGUFReader(path)
    vocab = next(int(t.shape[1]) for t in reader.tensors if t.name == "token_embd.weight")
    config = _hf_config(arch, vocab, window, original, context, factors)
    config._attn_implementation = "eager"
    model = (transformers.Phi3ForCausalLM if phi else transformers.GraniteForCausalLM)(config).eval()
    parts = PARTS | {"ffn_up": "mlp.gate_up_proj" if phi else "mlp.up_proj"}
    state = {}
    for t in reader.tensors:
        if t.name.startswith("rope_factors"):
            continue  # the twin's longrope has them in its config
        value = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        value = torch.from_numpy(np.ascontiguousarray(processor.process(value, t.name).weights))  # q/k unpermuted
        if t.name.startswith("blk."):
            _, i, part, kind = t.name.split(".")
            state[f"model.layers.{i}.{parts[part]}.{kind}"] = value
        else:
            state[{"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}[t.name]] = value
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert not unexpected and all("rotary" in m or m in tied for m in missing), (missing, unexpected)
    if config.tie_word_embeddings:
        model.tie_weights()
    return model
