"""Which backend runs a pair's model values: native (specdec's kernels over the GGUF blocks), transformers or
llama.cpp. :func:`resolve_backend` turns ``--backend`` (auto or one of them) into the one that runs, or refuses,
naming why; :func:`native_available` and :func:`native_runs` say whether the native backend can run here and
whether it runs a file's architecture.
"""

from __future__ import annotations

import os
import sys
from functools import cache

from . import zoo
from .locate import names_gguf
from .settings import check_backend


def resolve_backend(backend: str, *specs: str | None, device: str = "cpu") -> str:
    """native, transformers or llamacpp for these --target/--draft values (None = a default GGUF file).

    auto = native (specdec's own kernels over the GGUF blocks) when the device is the CPU, every model
    is a GGUF file of an architecture it runs (``models.native.SUPPORTED_ARCHS``) and the kernels build here;
    transformers otherwise.
    When only the kernels stand in the way, auto says so on stderr in one line naming the compiler's
    error (transformers is 3-5x slower there). native and llamacpp refuse anything else, naming what is
    wrong (native: the same one line).
    """
    from ..models import llamacpp

    check_backend(backend)
    all_gguf = all(names_gguf(spec) for spec in specs)
    on_cpu = str(device).startswith("cpu")
    if backend == "auto":
        if not (all_gguf and on_cpu and all(native_runs(spec) for spec in specs)):
            return "transformers"
        why_not = native_available()
        if why_not:
            print(f"specdec: --backend auto falls back to transformers (3-5x slower): the native backend is "
                  f"unavailable: {why_not}", file=sys.stderr, flush=True)
            return "transformers"
        return "native"
    if backend == "native":
        if not on_cpu:
            raise ValueError(f"backend=native runs on the CPU, not on device={device!r} (use transformers there)")
        not_gguf = next((spec for spec in specs if not names_gguf(spec)), None)
        if not_gguf is not None:
            raise ValueError(f"backend=native runs GGUF files only: {not_gguf!r} is not a .gguf file")
        why_not = native_available()
        if why_not:
            raise ValueError(f"backend=native is unavailable: {why_not}")
    if backend == "llamacpp":
        if not on_cpu:
            raise ValueError(f"backend=llamacpp runs on the CPU here, not on device={device!r}")
        not_gguf = next((spec for spec in specs if not names_gguf(spec)), None)
        if not_gguf is not None:
            raise ValueError(f"backend=llamacpp runs GGUF files only: {not_gguf!r} is not a .gguf file")
        if not llamacpp.available():
            raise ValueError("backend=llamacpp needs llama-cpp-python, which is not installed: "
                             f"{llamacpp.INSTALL_HINT}")
    return backend


@cache
def native_available() -> str | None:
    """None when the native backend can run here (its kernels are compiled, or compile now), else why not."""
    from ..native import build

    if build.compiler() is None:
        return "the native backend compiles its kernels here and needs a C++ compiler (g++); none was found"
    try:
        for name in build.sources():
            build.build(name)
    except build.KernelBuildError as err:
        return str(err).splitlines()[0]
    return None


def native_runs(spec: str | None) -> bool:
    """Whether the native backend runs the architecture of a --target/--draft-model GGUF value (None: the
    default pair, Qwen2; a named model: its recorded architecture). A value that does not name a readable
    GGUF file counts as runnable, so that the model locator reports it with its own error."""
    from ..models.native import SUPPORTED_ARCHS
    from ..native.gguf_file import GGUFFile

    if spec is None:
        return True
    named = zoo.named_model(spec)
    if named is not None:
        return named.architecture in SUPPORTED_ARCHS
    path = os.path.expanduser(str(spec))
    if os.path.isdir(path):
        files = [name for name in os.listdir(path) if name.lower().endswith(".gguf")]
        path = os.path.join(path, files[0]) if len(files) == 1 else path
    try:
        return GGUFFile(path).fields.get("general.architecture") in SUPPORTED_ARCHS
    except (OSError, ValueError):
        return True
