"""specdec's cache folder, and writing a file so that a failure never leaves it half-written
(a temporary file beside it, then ``os.replace``)."""

from __future__ import annotations

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
