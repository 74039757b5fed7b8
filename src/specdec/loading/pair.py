"""A target/draft pair of real models with their tokenizer: loading, compatibility, prompts.

``--target`` / ``--draft-model`` values are located and checked by ``specdec.loading.locate`` before
anything loads.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from dataclasses import dataclass, field

import torch

from ..cache import converted_dir
from ..models.base import LanguageModel, check_same_vocabulary
from ..models.hf import HFModel
from .backend import resolve_backend
from .chat import chat_prompt_ids
from .locate import check_device, gguf_path, locate_model, model_source
from .settings import LoadSettings


@dataclass
class ModelPair:
    target: LanguageModel  # an HFModel, a NativeModel (backend native) or a LlamaCppModel (backend llamacpp)
    draft: LanguageModel | None
    tokenizer: object  # the target's transformers tokenizer
    eos_token_ids: list[int] = field(default_factory=list)
    backend: str = "transformers"  # what runs the models: native, transformers or llamacpp

    def encode(self, text: str, chat: bool = True) -> list[int]:
        """Prompt ids; with ``chat`` the text becomes one user turn of the chat template (as text:
        special-token text in it is no role marker, ``specdec.loading.chat``)."""
        if chat and getattr(self.tokenizer, "chat_template", None):
            return chat_prompt_ids(self.tokenizer, [{"role": "user", "content": text}])
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))


def load_model(spec: str | None, role: str, *, device: str = "cpu", dtype=None, progress: bool = True) -> HFModel:
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


def load_pair(settings: LoadSettings | None = None) -> ModelPair:
    """Load target and draft (the default Qwen2.5-Coder pair when None) and check they match.

    ``settings`` (:class:`LoadSettings`; None = all defaults): ``quantize="int8"`` (CPU): the target's
    linear layers become row-exact int8 and the draft's torch dynamic int8 (``specdec.models.quantize``
    explains why the two differ). ``backend``: see :func:`resolve_backend`; llama.cpp runs the GGUF
    files as they are (their own quantization; ``dtype`` and ``quantize`` do not apply) with ``threads``
    threads (None: all cores). ``draft_head``: cut the draft's output head to that many of the most
    frequent tokens (``specdec.models.head``; None or 0: the whole vocabulary).
    """
    s = (settings or LoadSettings()).for_device()
    target, draft, with_draft, device, progress = s.target, s.draft_model, s.with_draft, s.device, s.progress
    check_device(device)
    locate_model(target, "target", assemble=False)  # both checked before either loads
    if with_draft:
        locate_model(draft, "draft", assemble=False)
    resolved = resolve_backend(s.backend, target, draft if with_draft else None, device=device)
    if resolved == "native":
        from .native_pair import load_native_models

        models = load_native_models(gguf_path(target, "target", progress=progress),
                                    gguf_path(draft, "draft", progress=progress) if with_draft else None,
                                    threads=s.threads, draft_head=s.draft_head, kernels=s.kernels)
        return ModelPair(*models, backend="native")
    if resolved == "llamacpp":
        if s.draft_head:
            raise ValueError(f"draft_head={s.draft_head} is invalid with the llamacpp backend: the cut draft head "
                             "runs on the transformers backend only (leave it at 0)")
        return load_llamacpp_pair(target, draft, with_draft=with_draft, threads=s.threads, progress=progress)
    dtype, quantize, draft_head = s.dtype, s.quantize, s.draft_head
    int8 = quantize == "int8"
    if int8 and not str(device).startswith("cpu"):
        raise ValueError(f"quantize=int8 runs on the CPU only (fbgemm), not on device={device!r}")
    if int8:
        dtype = "float32"
    target_model = load_model(target, "target", device=device, dtype=dtype, progress=progress)
    draft_model = load_model(draft, "draft", device=device, dtype=dtype, progress=progress) if with_draft else None
    if draft_model is not None and draft_head:
        from ..models.head import cut_head
        from .frequent import frequent_tokens

        cut_head(draft_model.model, frequent_tokens(target_model.tokenizer, draft_head))
    if int8:
        from ..models.quantize import int8_dynamic, int8_row_exact
        from ..models.row_attention import use_rowwise_attention

        target_model.model = int8_row_exact(target_model.model)
        use_rowwise_attention(target_model.model)
        if draft_model is not None:
            draft_model.model = int8_dynamic(draft_model.model)
    if draft_model is not None:
        check_compatible(target_model, draft_model)
    return ModelPair(target_model, draft_model, target_model.tokenizer, eos_ids(target_model))


def load_llamacpp_pair(target: str | None, draft: str | None, *, with_draft: bool = True,
                       threads: int | None = None, progress: bool = True) -> ModelPair:
    """Target and draft run by llama.cpp; prompts and text go through the target's transformers tokenizer."""
    from ..models.llamacpp import LlamaCppModel, LlamaCppSettings
    from .tokenizer import load_tokenizer

    # The target's rows must not depend on the block size (the rule's exactness; specdec.models.llamacpp
    # explains); a draft needs no such care.
    target_settings = LlamaCppSettings(n_threads=threads, batch_invariant=True)
    target_model = LlamaCppModel(gguf_path(target, "target", progress=progress), target_settings)
    draft_model = None
    if with_draft:
        draft_model = LlamaCppModel(gguf_path(draft, "draft", progress=progress), LlamaCppSettings(n_threads=threads))
    if draft_model is not None:
        check_same_vocabulary(target_model, draft_model)
    tokenizer = load_tokenizer(target, progress=progress)
    eos = set(target_model.end_of_generation_ids())
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(int(tokenizer.eos_token_id))
    return ModelPair(target_model, draft_model, tokenizer, sorted(eos), backend="llamacpp")


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


def check_compatible(target: LanguageModel, draft: LanguageModel) -> None:
    """Refuse a pair whose draft speaks a different token language than the target (any backend).

    The one vocabulary check: :func:`specdec.models.base.check_same_vocabulary`.
    """
    check_same_vocabulary(target, draft)
