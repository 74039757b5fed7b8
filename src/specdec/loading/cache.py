"""specdec's cache folder, and writing a file so that a failure never leaves it half-written
(a temporary file beside it, then ``os.replace``)."""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
from collections.abc import Callable
from typing import BinaryIO


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object], prefix: str = ".specdec-") -> None:
    """Call ``write(binary file)`` on a temporary file beside ``path``, then move it into place."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def cache_dir() -> pathlib.Path:
    """``$SPECDEC_CACHE``, else ``$XDG_CACHE_HOME/specdec``, else ``~/.cache/specdec`` (not created)."""
    explicit = os.environ.get("SPECDEC_CACHE")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return pathlib.Path(xdg).expanduser() / "specdec"
    return pathlib.Path.home() / ".cache" / "specdec"


def converted_dir(gguf_path: str) -> pathlib.Path:
    """Where transformers' float32 conversion of a GGUF file is kept (keyed by its path, size and mtime)."""
    return derived_dir(gguf_path, "converted")


def derived_dir(gguf_path: str, kind: str) -> pathlib.Path:
    """``<cache>/<kind>/<file stem>-<key>``: data derived from a GGUF file, keyed by its path, size and mtime."""
    st = os.stat(gguf_path)
    key = hashlib.sha256(f"{os.path.abspath(gguf_path)}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    stem = os.path.basename(gguf_path)[: -len(".gguf")]
    return cache_dir() / kind / f"{stem}-{key}"
