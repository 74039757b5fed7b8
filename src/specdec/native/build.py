"""Compile the kernels of this folder for the CPU they run on, once, into specdec's cache.

Each ``<name>.cpp`` here becomes ``lib<name>.so`` under ``<cache>/kernels/<isa>-<cpu flags key>-<source hash>/``.
``isa`` chooses the instruction sets the compiler may use:

- ``native`` (default): everything this CPU has (``-march=native``); the sources pick their
  AVX-512 VNNI path where the CPU has it, else AVX2, else plain C++;
- ``avx2``: AVX2 + FMA + F16C only (what every x86 CPU of the last decade has), for tests that the
  AVX2 path gives the same bits as the AVX-512 one;
- ``scalar``: no vector extensions beyond x86-64's baseline.

(their compiler flags: ``specdec.native.isas``, which the settings and the CLI import instead of this module:
``import specdec`` does not import it, so ``python -m specdec.native.build`` runs without runpy's warning).

``-ffp-contract=off``: no fused multiply-adds the sources did not write, so the float arithmetic is
the one written down (the kernels' batch-invariance and their scalar references rely on it).
The compiled file is written beside its final name and moved into place (never half-written: a build
killed mid-compile leaves only a temporary file, which the next build of that library removes);
concurrent builds of the same library are serialized by a lock file. The sources are read from this
installed package's folder (the wheel carries the ``.cpp`` files and the ``.h`` headers they include).
``$CXX`` names the compiler (else g++, else c++); a failed build is a :class:`KernelBuildError` whose
first line names the compiler's first error line.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

from ..cache import cache_dir, locked
from ..machine import cpu_flags_key
from .isas import ISA_FLAGS

HERE = pathlib.Path(__file__).resolve().parent
COMMON_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
_loaded: dict[tuple[str, str], ctypes.CDLL] = {}


class KernelBuildError(RuntimeError):
    """The kernels could not be compiled here (no C++ compiler, or the compiler failed). The first line of
    the message says why in one line (the compiler's first error line); the lines after it give the
    command and the compiler's output."""


@functools.cache
def sources() -> list[str]:
    """Names of the kernel sources in this folder (``q4k`` for ``q4k.cpp``); ``*.h`` are shared headers. Read once
    a process (asked for by every matrix a model loads)."""
    return sorted(p.stem for p in HERE.glob("*.cpp"))


def compiler() -> str | None:
    """``$CXX`` when set (whatever it names: a missing program is reported by :func:`build`), else g++ or c++."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def library_path(name: str, isa: str = "native") -> pathlib.Path:
    if isa not in ISA_FLAGS:
        raise ValueError(f"isa={isa!r} is invalid: choose one of {', '.join(ISA_FLAGS)}")
    source = HERE / f"{name}.cpp"
    if not source.is_file():
        raise ValueError(f"no kernel source {name!r}: choose one of {', '.join(sources())}")
    headers = b"".join(h.read_bytes() for h in sorted(HERE.glob("*.h")))  # lanes.h: shared by several sources
    digest = hashlib.sha256(source.read_bytes() + headers + " ".join(ISA_FLAGS[isa] + COMMON_FLAGS).encode())
    digest = digest.hexdigest()[:12]
    return cache_dir() / "kernels" / f"{isa}-{cpu_flags_key()}-{digest}" / f"lib{name}.so"


def build(name: str, isa: str = "native", *, quiet: bool = True) -> pathlib.Path:
    """Compile ``<name>.cpp`` for ``isa`` unless already compiled; return the library's path."""
    path = library_path(name, isa)
    if path.is_file():
        return path
    cxx = compiler()
    if cxx is None:
        raise KernelBuildError("specdec's CPU kernels need a C++ compiler (g++) and none was found: "
                               "install one (Debian: apt-get install g++) or choose --backend transformers")
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_suffix(".lock")):
        if path.is_file():
            return path
        # We hold the lock: a temporary file of this library is the leftover of a build that was killed.
        for stale in path.parent.glob(f".{path.name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        cmd = [cxx, *COMMON_FLAGS, *ISA_FLAGS[isa], "-I", str(HERE), "-o", str(tmp), str(HERE / f"{name}.cpp")]
        if not quiet:
            print(" ".join(cmd), file=sys.stderr)
        try:
            _compile(name, cmd, tmp)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return path


def _compile(name: str, cmd: list[str], out: pathlib.Path) -> None:
    """Run the compiler ``cmd`` writing ``out``, and flush ``out`` to disk; a failure is a KernelBuildError."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as err:  # $CXX names a program that is missing or cannot be run
        raise KernelBuildError(f"compiling {name}.cpp failed: the C++ compiler {cmd[0]!r} cannot be run "
                               f"({err.strerror or err}); set CXX to a working one or choose --backend "
                               "transformers") from None
    if done.returncode != 0:
        raise KernelBuildError(f"compiling {name}.cpp failed: {first_error(done.stderr, done.returncode)}\n"
                               f"{' '.join(cmd)}\n{done.stderr[-4000:]}")
    if not out.is_file():
        raise KernelBuildError(f"compiling {name}.cpp failed: {cmd[0]!r} exited with status 0 but wrote no "
                               f"library\n{' '.join(cmd)}")
    with open(out, "rb") as f:  # on disk before the rename, so that even a power cut leaves no torn library
        os.fsync(f.fileno())


def first_error(stderr: str, returncode: int) -> str:
    """The compiler's first line naming an error (g++: ``file:line:col: error: …``), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return f"the compiler exited with status {returncode} and printed nothing"
    return next((line for line in lines if "error" in line.lower()), lines[-1])


def load(name: str, isa: str = "native") -> ctypes.CDLL:
    """The compiled library (built first if needed), loaded once per process."""
    key = (name, isa)
    if key not in _loaded:
        import torch  # noqa: F401  (torch's OpenMP runtime first: the kernels then share its thread pool)

        _loaded[key] = ctypes.CDLL(str(build(name, isa)))
    return _loaded[key]


def prune(isa: str) -> list[pathlib.Path]:
    """Remove this CPU's builds for ``isa`` from older sources (folders of another hash); returns them.
    A process still running an old library keeps it: an unlinked ``.so`` stays mapped."""
    keep = {library_path(name, isa).parent for name in sources()}  # one folder per source (hash of it)
    kernels = next(iter(keep)).parent
    stale = sorted(d for d in kernels.glob(f"{isa}-{cpu_flags_key()}-*") if d.is_dir() and d not in keep)
    for d in stale:
        shutil.rmtree(d, ignore_errors=True)
    return stale


def main(argv: list[str] | None = None) -> int:
    """``python -m specdec.native.build [isa]``: compile every kernel (the set-up script runs this), then
    remove this CPU's builds of older sources for that isa."""
    isa = (argv if argv is not None else sys.argv[1:] or ["native"])[0]
    for name in sources():
        print(f"kernel {name} ({isa}): {build(name, isa, quiet=False)}")
    stale = prune(isa)
    if stale:
        print(f"removed {len(stale)} build(s) of older sources ({isa})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
