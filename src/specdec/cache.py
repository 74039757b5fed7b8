"""specdec's cache folder, and writing into it so that a failure never leaves anything half-written:
a temporary file (or folder) beside the final name, then ``os.replace``; a lock file (:func:`locked`)
serializes the processes that build the same thing, so the one holding it may remove the temporary
leftovers of a killed one (SIGKILL runs no clean-up).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

try:  # POSIX; elsewhere concurrent builds are not serialized (each rename is still atomic)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


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


@contextlib.contextmanager
def locked(lock_path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created if missing; its folder must exist). The kernel
    releases it when its holder dies, however it dies."""
    with open(lock_path, "a+b") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


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
