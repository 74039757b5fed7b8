"""A target/draft pair of real models with their tokenizer (:class:`ModelPair`: prompts in, text out), and
:func:`load_pair`, which loads one and checks that the two match.

The model values are located and checked by ``specdec.loading.locate`` before anything loads, the backend
chosen by ``specdec.loading.backend``; each backend's models load in their own module: ``native_pair``
(specdec's kernels), ``hf_pair`` (transformers) and ``llamacpp_pair`` (llama.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models.base import LanguageModel, check_same_vocabulary
from .backend import resolve_backend
from .chat import chat_prompt_ids
from .hf_pair import load_hf_models
from .llamacpp_pair import load_llamacpp_models
from .locate import check_device, gguf_path, locate_model
from .requantize import requantized
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


def load_pair(settings: LoadSettings | None = None) -> ModelPair:
    """Load target and draft (the default Qwen2.5-Coder pair when None) and check they match.

    ``settings`` (:class:`LoadSettings`; None = all defaults): ``quantize="int8"`` (CPU): the target's
    linear layers become row-exact int8 and the draft's torch dynamic int8 (``specdec.models.quantize``
    explains why the two differ). ``backend``: see :func:`resolve_backend`; llama.cpp runs the GGUF
    files as they are (their own quantization; ``dtype`` and ``quantize`` do not apply) with ``threads``
    threads (None: all cores). ``draft_head``: cut the draft's output head to that many of the most
    frequent tokens (``specdec.models.head``; None or 0: the whole vocabulary). ``dequantize``: the native
    backend may run matrices of a type its kernels do not read as float32 copies (with a warning); without it
    such a file is a ``specdec.models.kernel_types.NoKernelError`` before anything loads. ``draft_quant``
    (native): the draft file's matrices re-quantized once to Q4_0 and kept in the cache (``loading.requantize``:
    a cheaper draft, still exact); ``none``: the draft as its file stores it.
    """
    s = (settings or LoadSettings()).for_device()
    target, draft, with_draft, device, progress = s.target, s.draft_model, s.with_draft, s.device, s.progress
    check_device(device)
    locate_model(target, "target", assemble=False)  # both checked before either loads
    if with_draft:
        locate_model(draft, "draft", assemble=False)
    resolved = resolve_backend(s.backend, target, draft if with_draft else None, device=device,
                               dequantize=s.dequantize)
    if resolved == "native":
        from .native_pair import load_native_models

        models = load_native_models(gguf_path(target, "target", progress=progress),
                                    requantized(gguf_path(draft, "draft", progress=progress), s.draft_quant,
                                                progress=progress) if with_draft else None,
                                    threads=s.threads, draft_head=s.draft_head, kernels=s.kernels,
                                    dequantize=s.dequantize)
        return ModelPair(*models, backend="native")
    if resolved == "llamacpp":
        if s.draft_head:
            raise ValueError(f"draft_head={s.draft_head} is invalid with the llamacpp backend: the cut draft head "
                             "runs on the transformers backend only (leave it at 0)")
        models = load_llamacpp_models(target, draft, with_draft=with_draft, threads=s.threads, progress=progress)
        return ModelPair(*models, backend="llamacpp")
    target_model, draft_model, tokenizer, eos = load_hf_models(
        target, draft, with_draft=with_draft, device=device, dtype=s.dtype, quantize=s.quantize,
        draft_head=s.draft_head, progress=progress)
    if draft_model is not None:
        check_compatible(target_model, draft_model)
    return ModelPair(target_model, draft_model, tokenizer, eos)


def check_compatible(target: LanguageModel, draft: LanguageModel) -> None:
    """Refuse a pair whose draft speaks a different token language than the target (any backend).

    The one vocabulary check: :func:`specdec.models.base.check_same_vocabulary`.
    """
    check_same_vocabulary(target, draft)
