"""What machine this is: the CPU's model and the instruction-set flags that decide which kernels run.

The speed picture differs between CPUs with AVX2 only, AVX-512 (with VNNI) and AMX, so every
benchmark report records these, and natively built binaries are kept per flag set
(``cpu_flags_key``) so that a build is never reused on a CPU that lacks its instructions.
"""

from __future__ import annotations

import hashlib
import platform

# The flags that change which of ggml's or torch's CPU kernels run, in the order reports show them.
SPEED_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
               "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def _cpuinfo_field(name: str) -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def all_cpu_flags() -> frozenset[str]:
    """Every flag /proc/cpuinfo lists (empty where there is none, e.g. not Linux)."""
    return frozenset((_cpuinfo_field("flags") or "").split())


def cpu_flags() -> list[str]:
    """The speed-relevant flags this CPU has, e.g. ``['avx2', 'fma', 'f16c', 'avx512f', ...]``."""
    have = all_cpu_flags()
    return [flag for flag in SPEED_FLAGS if flag in have]


def cpu_flags_key() -> str:
    """A short name for this CPU's instruction sets, for folders of native builds: ``x86_64-<hash>``."""
    text = " ".join(sorted(all_cpu_flags()))
    return f"{platform.machine()}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def describe_cpu() -> str:
    """One line for reports: ``Intel(R) Xeon(R) Processor; AVX2, AVX-512 (VNNI, BF16), AMX``."""
    flags = set(cpu_flags())
    parts = []
    if "avx2" in flags:
        parts.append("AVX2")
    if "avx512f" in flags:
        extras = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16")) if flag in flags]
        parts.append("AVX-512" + (f" ({', '.join(extras)})" if extras else ""))
    if "amx_tile" in flags:
        parts.append("AMX")
    return f"{cpu_model()}; {', '.join(parts) or 'no AVX2'}"


# ggml's CMake switch for each instruction set it can use, in the order ggml's CMakeLists names them.
GGML_OPTIONS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"),
                ("avx_vnni", "GGML_AVX_VNNI"), ("avx512f", "GGML_AVX512"), ("avx512vbmi", "GGML_AVX512_VBMI"),
                ("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"))


def ggml_cmake_flags() -> list[str]:
    """CMake options that build ggml for this CPU's instruction sets, AMX left out.

    The same as ggml's GGML_NATIVE=ON (``-march=native``) except AMX: on this project's Sapphire Rapids
    machines a native build (llama-cpp-python 0.3.36's ggml) dies with SIGILL at its first AMX
    instruction, a ``tilezero`` in ``ggml_backend_amx_mul_mat`` (most likely in a thread with no tile
    configuration loaded: Linux does grant the tile state, and specdec's own kernels use the tiles).
    """
    have = all_cpu_flags()
    flags = ["-DGGML_NATIVE=OFF"]
    flags += [f"-D{option}={'ON' if flag in have else 'OFF'}" for flag, option in GGML_OPTIONS]
    return flags + ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


if __name__ == "__main__":  # for the build scripts, before specdec is installed: key | ggml-flags | describe
    import sys

    print({"key": cpu_flags_key, "ggml-flags": lambda: " ".join(ggml_cmake_flags()),
           "describe": describe_cpu}[sys.argv[1]]())
