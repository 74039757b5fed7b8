"""Which of a GGUF file's matrices the native backend multiplies as stored, and what the others would cost.

The kernels of ``specdec.native.kernels`` (its table ``KERNELS``; ``has_kernel`` says which are built here)
multiply a matrix straight over the file's blocks. A matrix of any other type runs only as a float32 copy:
4 bytes a weight (3–8× the file's size) and far slower. That path is never taken silently.
:func:`float32_matrices` finds such matrices from the file's tensor infos alone (nothing of the weights is
read), and :func:`check_native_types` refuses the file with :class:`NoKernelError`, whose one line names the
types, the file, the types read natively and the float32 memory, unless the caller allows de-quantizing
(``dequantize=True``; the CLI's ``--dequantize``), which then prints the same line as a warning.

The list of types read natively is taken from ``KERNELS`` when asked, so a kernel added there is read
natively from then on, with no list to update here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from ..native.gguf_file import GGUFFile
from ..native.kernels import KERNELS, has_kernel

F32 = GGMLQuantizationType.F32
EMBEDDING, HEAD = "token_embd.weight", "output.weight"


class NoKernelError(ValueError):
    """A GGUF file with matrices of a type the native kernels do not read, refused rather than de-quantized
    to float32 (``dequantize=True``, the CLI's ``--dequantize``, allows that); its message is one line."""


def reads_natively(qtype: GGMLQuantizationType, cols: int) -> bool:
    """Whether a matrix of ``qtype`` with rows of ``cols`` weights is multiplied over its stored blocks."""
    return has_kernel(qtype) and cols % KERNELS[qtype][1] == 0


def native_types() -> list[str]:
    """The GGUF tensor types the kernels built here read (``KERNELS``, as ``has_kernel`` finds them)."""
    return [qtype.name for qtype in KERNELS if has_kernel(qtype)]


def matrices(file: GGUFFile) -> list:
    """The tensors the native runner multiplies: every tensor of two or more dimensions but the token
    embedding, which is looked up row by row (a matrix only when it is the tied output head: no output.weight)."""
    tied = HEAD not in file.tensors
    return [t for t in file.tensors.values() if len(t.shape) >= 2 and (t.name != EMBEDDING or tied)]


@dataclass(frozen=True)
class Float32Matrices:
    """A file's matrices that the kernels do not read as stored: their types, how many, their weights."""

    path: str
    types: tuple[str, ...]  # e.g. ("Q4_0",), or "F16 (rows of 8 weights)" for a type read in other shapes
    count: int  # matrices
    elements: int  # weights in all of them

    @property
    def gb(self) -> float:
        """Their float32 copies, in GB (10⁹ bytes)."""
        return self.elements * 4 / 1e9

    def message(self, *, allowed: bool = False) -> str:
        """The one line: refused (``allowed`` False) or, as a warning, de-quantized."""
        kinds = " and ".join(self.types) if len(self.types) <= 2 else ", ".join(self.types)
        size = f"{self.gb:.2f} GB" if self.gb >= 0.01 else "under 0.01 GB"
        line = (f"{self.path}: {self.count} {'matrix' if self.count == 1 else 'matrices'} of type"
                f"{'s' if len(self.types) > 1 else ''} {kinds}, which specdec's native kernels do not read (they "
                f"read {', '.join(native_types())}); as float32 they would take {size}")
        if allowed:
            return f"{line}; de-quantizing them to float32 (--dequantize): slower, and that much memory"
        return (f"{line}; pass --dequantize (dequantize=True) to run them de-quantized to float32, or "
                "--backend llamacpp, which reads every GGUF type as stored")


def float32_matrices(file: GGUFFile | str) -> Float32Matrices | None:
    """The matrices of ``file`` (a GGUFFile or a path) that only a float32 copy would run; None when every
    matrix is read as stored. F32 matrices are float32 already and never counted."""
    file = file if isinstance(file, GGUFFile) else GGUFFile(str(file))
    found = [t for t in matrices(file) if t.qtype != F32 and not reads_natively(t.qtype, t.shape[0])]
    if not found:
        return None
    types: dict[str, None] = {}
    for t in found:
        shaped = has_kernel(t.qtype)  # a kernel for the type, not for rows of this length
        types.setdefault(f"{t.qtype.name} (rows of {t.shape[0]} weights)" if shaped else t.qtype.name)
    elements = sum(int(np.prod(t.shape, dtype=np.int64)) for t in found)
    return Float32Matrices(file.path, tuple(sorted(types)), len(found), elements)


def check_native_types(file: GGUFFile | str, *, dequantize: bool = False) -> Float32Matrices | None:
    """:func:`float32_matrices` of ``file``: a :class:`NoKernelError` when there are any and ``dequantize``
    is False; else them (None when there are none), for the caller's warning."""
    found = float32_matrices(file)
    if found is not None and not dequantize:
        raise NoKernelError(found.message())
    return found


def float32_gb(file: GGUFFile | str) -> float:
    """Every tensor of ``file`` as float32, in GB: what the transformers backend's conversion of it holds."""
    file = file if isinstance(file, GGUFFile) else GGUFFile(str(file))
    return sum(int(np.prod(t.shape, dtype=np.int64)) for t in file.tensors.values()) * 4 / 1e9
