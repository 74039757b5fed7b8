"""Which backend runs a pair's model values: native (specdec's kernels over the GGUF blocks), transformers or
llama.cpp. :func:`resolve_backend` turns ``--backend`` (auto or one of them) into the one that runs, or refuses,
naming why; :func:`native_available` and :func:`native_runs` say whether the native backend can run here and
whether it runs a file's architecture; :func:`refuse_float32` whether it would need float32 copies of a file's
matrices (``specdec.models.kernel_types``), which it makes only when asked to (``dequantize``).
"""

from __future__ import annotations

import os
import sys
from functools import cache

from . import zoo
from .locate import names_gguf
from .settings import check_backend


def resolve_backend(backend: str, *specs: str | None, device: str = "cpu", dequantize: bool = False) -> str:
    """native, transformers or llamacpp for these --target/--draft values (None = a default GGUF file).

    auto = native (specdec's own kernels over the GGUF blocks) when the device is the CPU, every model
    is a GGUF file of an architecture it runs (``models.native.SUPPORTED_ARCHS``) and the kernels build here;
    transformers otherwise (on the CPU, a GGUF file going there is one line on stderr: transformers runs it
    de-quantized to float32, with the memory that takes).
    When only the kernels stand in the way, auto says so on stderr in one line naming the compiler's
    error (transformers is 3-5x slower there). native and llamacpp refuse anything else, naming what is
    wrong (native: the same one line). native, and auto where it would pick native, refuse a file with
    matrices of a type the kernels do not read unless ``dequantize`` (:func:`refuse_float32`).
    """
    from ..models import llamacpp

    check_backend(backend)
    all_gguf = all(names_gguf(spec) for spec in specs)
    on_cpu = str(device).startswith("cpu")
    if backend == "auto":
        if not (all_gguf and on_cpu and all(native_runs(spec) for spec in specs)):
            if on_cpu:
                note_float32(specs)
            return "transformers"
        refuse_float32(backend, *specs, device=device, dequantize=dequantize)  # never float32 by itself
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
        refuse_float32(backend, *specs, device=device, dequantize=dequantize)
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

    if spec is None:
        return True
    named = zoo.named_model(spec)
    if named is not None:
        return named.architecture in SUPPORTED_ARCHS
    file = gguf_header(spec)
    return file is None or file.fields.get("general.architecture") in SUPPORTED_ARCHS


def gguf_header(spec: str | None):
    """The GGUFFile (metadata and tensor infos; no weights read) a --target/--draft-model value names, or None
    when it names none that is readable now (None, a named model not assembled yet, a directory, a bad path)."""
    from ..native.gguf_file import GGUFFile

    if spec is None:
        return None
    named = zoo.named_model(spec)
    try:
        path = zoo.named_path(named, assemble=False) if named is not None else os.path.expanduser(str(spec))
        if path is not None and os.path.isdir(path):
            files = [name for name in os.listdir(path) if name.lower().endswith(".gguf")]
            path = os.path.join(path, files[0]) if len(files) == 1 else None
        return GGUFFile(path) if path is not None else None
    except (OSError, ValueError):
        return None


def refuse_float32(backend: str, *specs: str | None, device: str = "cpu", dequantize: bool = False) -> None:
    """A ``NoKernelError`` (``specdec.models.kernel_types``: one line naming the types, the file, the types read
    natively and the float32 memory) when ``backend`` (native, or auto where it picks native) would run one of
    these values with matrices of a type the kernels do not read, unless ``dequantize``. It reads the files'
    tensor infos only; a file not there yet (the default pair, a named model not assembled) is checked when it
    loads (``NativeModel``)."""
    if dequantize or backend not in ("auto", "native") or not str(device).startswith("cpu"):
        return
    if backend == "auto" and not all(names_gguf(spec) and native_runs(spec) for spec in specs):
        return  # auto runs them on transformers
    from ..models.kernel_types import check_native_types

    for spec in specs:
        file = gguf_header(spec)
        if file is not None:
            check_native_types(file)


def note_float32(specs) -> None:
    """One line on stderr for each GGUF file that ``auto`` leaves to transformers on the CPU: transformers runs it
    de-quantized to float32 (every tensor), and how much memory that takes."""
    from ..models.kernel_types import float32_gb
    from ..models.native import SUPPORTED_ARCHS

    for spec in specs:
        file = gguf_header(spec)
        if file is None:
            continue
        arch = file.fields.get("general.architecture")
        why = (f"the native backend does not run its architecture {arch!r} (it runs {', '.join(SUPPORTED_ARCHS)})"
               if arch not in SUPPORTED_ARCHS else "the native backend runs GGUF files only, and the other model "
               "is none")
        print(f"specdec: --backend auto runs {file.path} on transformers, de-quantized to float32 "
              f"({float32_gb(file):.2f} GB): {why}", file=sys.stderr, flush=True)
