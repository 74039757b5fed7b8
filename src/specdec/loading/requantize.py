"""A draft GGUF file re-quantized once to fewer bits (Q4_0), kept in the cache: a cheaper draft, still exact.

Why. Once α is high, the draft's cost c (one draft call as a fraction of a target call) is the speed-up's lever
(the paper's formula, ``specdec.theory``). The default draft stores its 896-wide matrices in Q5_0 and Q8_0 and its
feed-forward down matrices in Q4_K and Q6_K (5.5–8.5 bits a weight): its 24 layers read ≈ 247 MB a token, and at
k = 1 the kernels are bound by those bytes. In Q4_0 (4.5 bits a weight) the layers read ≈ 200 MB.

Exactness. The rule needs only that each drafted token is drawn from the q the draft reports; a re-quantized
draft reports its own q, so the output is exactly the target's distribution whatever the draft's bits (only α
may move; ``benchmarks/draft_quant.py`` measures α, c and the speed-up of both side by side).

What is re-quantized: every matrix (a 2-D ``.weight``) stored in more than Q4_0's 4.5 bits a weight whose rows
are a multiple of 32 weights, de-quantized and quantized to Q4_0 by the ``gguf`` package (llama.cpp's reference
arithmetic, as ``llama-quantize`` without an importance matrix); matrices of 4.5 bits or fewer (Q4_K, Q4_0, …),
norms and biases are copied as they are, and so are the token embedding (only its rows are gathered: bytes
read per token do not depend on it) and the output head (the draft's q is drawn from it). The metadata is copied
as it is. The file is written once to a temporary name and renamed (nothing half-written is ever read), under
a lock (two processes write it once); its name carries the source's size and modification time, so a changed
source gets a new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import sys

import numpy as np

from ..cache import cache_dir, locked

DRAFT_QUANTS = ("q4_0", "none")  # --draft-quant: q4_0 = re-quantize the draft's matrices once; none = as stored
DEFAULT_DRAFT_QUANT = "q4_0"
KEPT = ("token_embd.weight", "output.weight")  # copied as stored (see the module's docstring)
Q4_0_BITS = 4.5

__all__ = ["DEFAULT_DRAFT_QUANT", "DRAFT_QUANTS", "check_draft_quant", "requantized", "requantized_path"]


def check_draft_quant(value: object) -> str:
    if value not in DRAFT_QUANTS:
        raise ValueError(f"draft_quant={value!r} is invalid: choose one of {', '.join(DRAFT_QUANTS)}")
    return value


def _bits(qtype) -> float:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    return 8.0 * size / block


def _requantizes(tensor) -> bool:
    """Whether ``tensor`` (a ``gguf.ReaderTensor``) becomes Q4_0."""
    shape = [int(n) for n in tensor.shape]  # GGUF order: [cols, rows]
    return (tensor.name.endswith(".weight") and tensor.name not in KEPT and len(shape) == 2
            and shape[0] % 32 == 0 and _bits(tensor.tensor_type) > Q4_0_BITS)


def requantized_path(source: str, quant: str = DEFAULT_DRAFT_QUANT) -> pathlib.Path:
    """Where the re-quantized copy of ``source`` lives in the cache (written or not)."""
    st = os.stat(source)
    key = hashlib.sha256(f"{os.path.realpath(source)}|{st.st_size}|{st.st_mtime_ns}|{quant}|1".encode())
    return cache_dir() / "requantized" / f"{pathlib.Path(source).stem}.{quant}.{key.hexdigest()[:12]}.gguf"


def requantized(source: str, quant: str = DEFAULT_DRAFT_QUANT, *, progress: bool = True) -> str:
    """The path of ``source`` with its matrices in ``quant`` (``none``: ``source`` itself), written once to the
    cache on first use; a file with nothing to re-quantize is ``source`` itself."""
    check_draft_quant(quant)
    if quant == "none":
        return source
    path = requantized_path(source, quant)
    if path.is_file():
        return str(path)
    import gguf

    reader = gguf.GGUFReader(source)
    if not any(_requantizes(t) for t in reader.tensors):
        return source
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_suffix(".lock")):
        if path.is_file():  # another process wrote it while we waited
            return str(path)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # we hold the lock: a killed writer's leftovers
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            _write(reader, tmp, pathlib.Path(source).name, progress)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        for old in path.parent.glob(f"{pathlib.Path(source).stem}.{quant}.*.gguf"):  # copies of an older source
            if old != path:
                with contextlib.suppress(FileNotFoundError):
                    old.unlink()
    return str(path)


def _write(reader, out: pathlib.Path, name: str, progress: bool) -> None:
    import gguf
    from tqdm import tqdm

    Q4_0 = gguf.GGMLQuantizationType.Q4_0
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    plan = [(t, _requantizes(t)) for t in reader.tensors]
    for t, requant in plan:
        if requant:
            cols, rows = (int(n) for n in t.shape)
            nbytes = rows * cols // 32 * 18  # block_q4_0: an fp16 scale and 16 bytes of nibbles per 32 weights
            writer.add_tensor_info(t.name, (rows, cols // 32 * 18), np.dtype(np.uint8), nbytes, Q4_0)
        else:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    bar = tqdm(plan, desc=f"re-quantizing the draft to Q4_0 once ({name})",
               unit="tensor", file=sys.stderr, disable=not progress, leave=False)
    for t, requant in bar:
        data = gguf.quants.quantize(gguf.quants.dequantize(t.data, t.tensor_type), Q4_0) if requant else t.data
        writer.write_tensor_data(np.ascontiguousarray(data), tensor_endianess=reader.endianess)
    writer.close()
    with open(out, "rb") as f:  # on disk before the rename
        os.fsync(f.fileno())
