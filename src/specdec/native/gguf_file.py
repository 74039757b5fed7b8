"""A GGUF file's metadata and tensors, memory-mapped, read in well under a second.

``gguf.GGUFReader`` builds a numpy view for every item of every metadata array (450,000 vocabulary
strings and merges in a Qwen2 file): seconds of Python per file. Running a model needs only the
scalar metadata and the tensors, so this reader walks past the arrays (keeping the short numeric
ones) and hands out each tensor as a read-only view of the mapped file: ``[rows, bytes per row]``
uint8 for quantized types, the plain array for F32/F16. Format: ggml's docs/gguf.md (version 2 and 3).

A file that is not whole (an interrupted download or copy) or not GGUF at all is a
:class:`GGUFError`, a ValueError whose one line names the file and what is wrong: a header or
metadata that runs past the end, a tensor whose data ends beyond the file's last byte, an unknown
type. Reading the file is that check (tens of milliseconds for a 150k-token vocabulary), so the
CLI runs it on every GGUF file it is given before anything else reads them.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
# metadata value types (gguf.md): id → struct format of a scalar; 8 = string, 9 = array
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
KEEP_ARRAY = 64  # numeric arrays up to this many items are kept; longer ones (and string arrays) skipped
HEADER_BYTES = 24  # magic, version, tensor count, metadata count


class GGUFError(ValueError):
    """A file that is not a whole, readable GGUF file; the message starts with its path."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] = the length of a row (a matrix's input features)
    qtype: GGMLQuantizationType
    data: np.ndarray  # quantized: uint8 [rows, bytes per row]; F32/F16: the values, [rows, shape[0]]

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1


class GGUFFile:
    def __init__(self, path: str) -> None:
        self.path = path
        size = os.path.getsize(path)
        if size < HEADER_BYTES:
            with open(path, "rb") as f:
                magic = f.read(len(MAGIC))
            if size == 0 or magic != MAGIC:
                raise GGUFError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF'; it has {size} "
                                "bytes)")
            raise GGUFError(f"{path}: truncated or damaged GGUF file: it has {size} bytes, fewer than a GGUF "
                            f"header's {HEADER_BYTES}")
        try:
            self._read(path)
        except GGUFError:
            raise
        except struct.error as err:
            raise GGUFError(f"{path}: truncated or damaged GGUF file: its metadata runs past the end of the file "
                            f"({size:,} bytes; an interrupted download or copy?)") from err
        except (IndexError, KeyError, OverflowError, TypeError, ValueError, ZeroDivisionError) as err:
            # values no GGUF writer produces (a size beyond any file, an alignment of 0, ...)
            raise GGUFError(f"{path}: truncated or damaged GGUF file ({type(err).__name__}: {err}); "
                            f"it has {size:,} bytes") from err

    def _read(self, path: str) -> None:
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        buf = memoryview(self._map)
        if bytes(buf[:4]) != MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")
        version, n_tensors, n_fields = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        self._buf, pos = buf, 24
        self.fields: dict[str, object] = {}
        self.spans: dict[str, tuple[int, int]] = {}  # key → its value's bytes in the file (start, end)
        for _ in range(n_fields):
            key, pos = self._string(pos)
            (kind,), start = struct.unpack_from("<I", buf, pos), pos + 4
            self.fields[key], pos = self._value(kind, start)
            self.spans[key] = (start, pos)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            shape = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            qtype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            if qtype not in GGMLQuantizationType._value2member_map_ or not shape:
                raise GGUFError(f"{path}: damaged GGUF file: tensor {name!r} has type {qtype} and shape "
                                f"{list(shape)}, which no GGUF writer produces")
            infos.append((name, tuple(int(d) for d in shape), GGMLQuantizationType(qtype), int(offset)))
        align = int(self.fields.get("general.alignment", 32))
        start = (pos + align - 1) // align * align
        self.tensors = {name: self._tensor(name, shape, qtype, start + offset) for name, shape, qtype, offset in infos}

    def field(self, name: str):
        if name not in self.fields:
            raise GGUFError(f"{self.path}: GGUF metadata {name!r} is missing")
        return self.fields[name]

    def _tensor(self, name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType, at: int) -> TensorInfo:
        block, size = GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        if shape[0] % block:
            raise GGUFError(f"{self.path}: tensor {name} rows of {shape[0]} are not whole {qtype.name} blocks")
        row_bytes = shape[0] // block * size
        end = at + rows * row_bytes
        if end > len(self._map):
            raise GGUFError(f"{self.path}: truncated GGUF file: tensor {name}'s data ends at byte {end:,}, but the "
                            f"file has {len(self._map):,} bytes (an interrupted download or copy?)")
        raw = self._map[at:end].reshape(rows, row_bytes)
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            raw = raw.view(np.float32 if qtype == GGMLQuantizationType.F32 else np.float16)
        return TensorInfo(name, shape, qtype, raw)

    def raw_value(self, key: str) -> bytes | None:
        """The bytes of metadata ``key``'s value as stored (e.g. a vocabulary, compared whole), None if absent."""
        return bytes(self._buf[slice(*self.spans[key])]) if key in self.spans else None

    def strings(self, key: str) -> list[str]:
        """An array of strings of the metadata (e.g. ``tokenizer.ggml.tokens``), decoded; [] if absent."""
        if key not in self.spans:
            return []
        pos = self.spans[key][0]
        (count,), pos = struct.unpack_from("<4xQ", self._buf, pos), pos + 12
        out = []
        for _ in range(count):
            text, pos = self._string(pos)
            out.append(text)
        return out

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._buf, pos)
        return bytes(self._buf[pos + 8 : pos + 8 + n]).decode("utf-8", errors="replace"), pos + 8 + n

    def _value(self, kind: int, pos: int) -> tuple[object, int]:
        if kind in SCALARS:
            fmt = "<" + SCALARS[kind]
            return struct.unpack_from(fmt, self._buf, pos)[0], pos + struct.calcsize(fmt)
        if kind == STRING:
            return self._string(pos)
        if kind != ARRAY:
            raise GGUFError(f"{self.path}: unknown GGUF metadata type {kind}")
        item, count = struct.unpack_from("<IQ", self._buf, pos)
        pos += 12
        if item in SCALARS:
            fmt = "<" + SCALARS[item]
            size = struct.calcsize(fmt)
            kept = list(struct.unpack_from(f"<{count}{SCALARS[item]}", self._buf, pos)) if count <= KEEP_ARRAY else None
            return kept, pos + size * count
        if item == STRING:  # e.g. a vocabulary: walked past without decoding
            for _ in range(count):
                pos += 8 + struct.unpack_from("<Q", self._buf, pos)[0]
            return None, pos
        for _ in range(count):  # nested arrays: walked past, not kept
            _, pos = self._value(item, pos)
        return None, pos


def check_gguf(path: str, *, tokenizer: bool = False) -> GGUFFile:
    """``path`` read as a GGUF file: a GGUFError when it is truncated, damaged or not GGUF, or with
    ``tokenizer`` when it carries no tokenizer (a target's prompts are encoded with the one in its file)."""
    gguf = GGUFFile(path)
    if tokenizer and "tokenizer.ggml.tokens" not in gguf.fields:
        raise GGUFError(f"{path}: this GGUF file has no tokenizer (no tokenizer.ggml.tokens metadata), and a target's "
                        "prompts are encoded with the tokenizer in its file")
    return gguf
