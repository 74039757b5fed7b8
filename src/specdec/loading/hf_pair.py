"""The transformers backend's models: a model directory or cached model id as it is; a GGUF file converted
by transformers once (every tensor de-quantized to float32, the tokenizer llama.cpp's reading of the file)
and kept as safetensors in the cache (``specdec.cache.converted_dir``), so later runs load in seconds.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import torch

from ..cache import converted_dir
from ..models.hf import HFModel
from .locate import model_source
from .settings import draft_head_cut


def load_hf_model(spec: str | None, role: str, *, device: str = "cpu", dtype=None, progress: bool = True) -> HFModel:
    """Load one model: ``spec`` None means the default of that role (target or draft).

    A GGUF file is converted by transformers once (minutes: every tensor is de-quantized and the
    tokenizer rebuilt) and the result kept as safetensors beside the cache, so later runs load in
    seconds; the GGUF file stays the source of truth (the conversion is keyed by its size and
    modification time).
    """
    name_or_path, gguf_file = model_source(spec, role, progress=progress)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub at run time
    if gguf_file is None:
        return HFModel.from_pretrained(name_or_path, device=device, dtype=dtype)
    converted = converted_dir(os.path.join(name_or_path, gguf_file))
    if not (converted / "config.json").is_file():
        convert_gguf(os.path.join(name_or_path, gguf_file), converted)
    model = HFModel.from_pretrained(str(converted), device=device, dtype=dtype)
    model.name = gguf_file
    return model


def convert_gguf(gguf_path: str, out_dir: pathlib.Path) -> None:
    """De-quantize a GGUF file through transformers and save it (atomically) as safetensors.

    Always float32, the exact value of every de-quantized weight; a run casts to its own dtype.
    """
    from transformers import AutoModelForCausalLM

    from .tokenizer import gguf_tokenizer, save_tokenizer

    directory, name = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    tmp = out_dir.parent / f".{out_dir.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32,
                                                     local_files_only=True)
        save_tokenizer(gguf_tokenizer(gguf_path), tmp)  # llama.cpp's reading of it, as the native backend's
        # The weights are plain tensors now; drop the GGUF marker that blocks saving them.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        del model
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_hf_models(target: str | None, draft: str | None, *, with_draft: bool = True, device: str = "cpu",
                   dtype: str | None = None, quantize: str | None = None, draft_head: int | None = None,
                   progress: bool = True) -> tuple:
    """(target, draft or None, tokenizer, end-of-generation ids) for two --target/--draft-model values, with
    ``quantize="int8"`` (CPU only: the weights float32 first) and the draft's head cut to ``draft_head`` tokens
    (``specdec.loading.pair.load_pair`` says what each does)."""
    int8 = quantize == "int8"
    if int8 and not str(device).startswith("cpu"):
        raise ValueError(f"quantize=int8 runs on the CPU only (fbgemm), not on device={device!r}")
    if int8:
        dtype = "float32"
    target_model = load_hf_model(target, "target", device=device, dtype=dtype, progress=progress)
    draft_model = load_hf_model(draft, "draft", device=device, dtype=dtype, progress=progress) if with_draft else None
    cut = draft_head_cut(draft_head, draft_model.vocab_size) if draft_model is not None else 0
    if cut:
        from ..models.head import cut_head
        from .frequent import frequent_tokens

        cut_head(draft_model.model, frequent_tokens(target_model.tokenizer, cut))
    if int8:
        from ..models.quantize import int8_dynamic, int8_row_exact
        from ..models.row_attention import use_rowwise_attention

        target_model.model = int8_row_exact(target_model.model)
        use_rowwise_attention(target_model.model)
        if draft_model is not None:
            draft_model.model = int8_dynamic(draft_model.model)
    return target_model, draft_model, target_model.tokenizer, eos_ids(target_model)


def eos_ids(model: HFModel) -> list[int]:
    """Every id that ends a turn: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    tok_eos = getattr(model.tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(int(tok_eos))
    gen_eos = getattr(getattr(model.model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    return sorted(ids)
