"""How to load a pair, as one frozen value: which model files, on what device, run by which backend.

Terms: ``target`` and ``draft_model`` name model files (a GGUF file, a transformers model directory,
a cached model id; None = the default pair's); ``with_draft`` says whether the draft model loads at
all (a drafter such as prompt lookup needs none). :data:`BACKENDS` is the one list of backends
(``--backend``, the loader, bench's ``--backends``). Every field is checked where the value is built,
before anything loads, and a bad one is a ValueError naming the value and what is accepted;
:meth:`LoadSettings.for_device` resolves the ``auto`` dtype and quantization for the device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..checks import check_int
from ..models.prefix import DEFAULT_CACHE_GB, check_cache_gb
from ..native.isas import ISAS  # the native backend's instruction sets (--kernels): native, avx2, scalar
from .requantize import DEFAULT_DRAFT_QUANT, DRAFT_QUANTS, check_draft_quant  # noqa: F401 (DRAFT_QUANTS: --draft-quant)

# The draft's output head cut to the most frequent tokens by default (exact: q is zero off them): the default draft's
# one-token call 14.7 -> 10 ms with its 151,936-row head cut to 32,768 (AMD EPYC, 2026-12-06).
DEFAULT_DRAFT_HEAD = 32768


def draft_head_cut(draft_head: int | None, vocab_size: int) -> int:
    """The rows a draft's head keeps (0: all of them): ``draft_head`` as given, None (the default) = the
    DEFAULT_DRAFT_HEAD most frequent tokens where the vocabulary is larger, else the whole head.

    >>> draft_head_cut(None, 151936), draft_head_cut(None, 32000), draft_head_cut(0, 151936), draft_head_cut(8, 64)
    (32768, 0, 0, 8)
    """
    if draft_head is None:
        return DEFAULT_DRAFT_HEAD if vocab_size > DEFAULT_DRAFT_HEAD else 0
    return draft_head

BACKENDS = ("auto", "native", "transformers", "llamacpp")  # auto: native for GGUF files on a CPU, else transformers
RUNNING_BACKENDS = tuple(b for b in BACKENDS if b != "auto")  # what a loaded pair runs on
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZE = ("auto", "int8", "none")


def check_backend(backend: object, accepted: tuple[str, ...] = BACKENDS) -> str:
    if backend not in accepted:
        raise ValueError(f"backend={backend!r} is invalid: choose one of {', '.join(accepted)}")
    return backend


def check_threads(threads: object) -> int | None:
    """``threads`` if None (every core) or an integer >= 1, else the one ValueError naming it."""
    return None if threads is None else check_int("threads", threads, 1)


def _check_choice(name: str, value: object, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ValueError(f"{name}={value!r} is invalid: choose one of {', '.join(accepted)}")


@dataclass(frozen=True)
class LoadSettings:
    """What ``loading.pair.load_pair`` and ``session.load`` load; checked when built."""

    target: str | None = None  # the target model (None: the default pair's 1.5B)
    draft_model: str | None = None  # the draft model (None: the default pair's 0.5B)
    with_draft: bool = True  # load the draft model at all
    device: str = "cpu"
    dtype: str | None = "auto"  # transformers backend: auto = float32 on CPU, bfloat16 on CUDA
    quantize: str | None = "auto"  # transformers backend: auto = int8 on CPU, none on CUDA
    backend: str = "auto"
    threads: int | None = None  # CPU threads for the kernels, torch and llama.cpp (None: every core)
    draft_head: int | None = None  # cut the draft's output head to this many frequent tokens (0: whole; None: the
    # default, DEFAULT_DRAFT_HEAD where the vocabulary is larger and the backend cuts heads, else whole)
    kernels: str = "native"  # the native backend's instruction sets
    cache_gb: float = DEFAULT_CACHE_GB  # the prefix cache's budget (models.prefix; 0 = off)
    progress: bool = True  # report assembly and conversion progress on stderr
    dequantize: bool = False  # native: run matrices of a type without a kernel as float32 (else NoKernelError)
    draft_quant: str = DEFAULT_DRAFT_QUANT  # native: the draft GGUF's matrices re-quantized once (loading.requantize)

    def __post_init__(self) -> None:
        for name in ("target", "draft_model"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}={value!r} is invalid: must be a path or model id (a string) or None")
        check_backend(self.backend)
        _check_choice("dtype", "auto" if self.dtype is None else self.dtype, DTYPES)
        _check_choice("quantize", "auto" if self.quantize is None else self.quantize, QUANTIZE)
        _check_choice("kernels", self.kernels, ISAS)
        check_threads(self.threads)
        if self.draft_head is not None:
            check_int("draft_head", self.draft_head, 0, note=" (0: the whole vocabulary)")
        check_cache_gb(self.cache_gb)
        check_draft_quant(self.draft_quant)
        if not isinstance(self.dequantize, bool):
            raise ValueError(f"dequantize={self.dequantize!r} is invalid: must be True or False")

    def for_device(self) -> LoadSettings:
        """The same settings with ``auto`` dtype and quantization resolved for the device: float32 and
        int8 on a CPU (int8 is 3–4× faster there, rows kept exact), bfloat16 and none on CUDA."""
        cuda = str(self.device).startswith("cuda")
        dtype = ("bfloat16" if cuda else "float32") if self.dtype in (None, "auto") else self.dtype
        quantize = ("none" if cuda else "int8") if self.quantize in (None, "auto") else self.quantize
        return replace(self, dtype=dtype, quantize=quantize)
