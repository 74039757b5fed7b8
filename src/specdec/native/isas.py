"""The instruction sets the kernels compile for (``--kernels``; ``specdec.native.build``), and the compiler flags
each stands for.

Apart from ``build`` so that naming them (the settings, the CLI) imports no compiler driver: ``import specdec``
must not import ``build``, which ``python -m specdec.native.build`` runs as ``__main__`` (runpy warns when
the package's import had already imported it).
"""

ISA_FLAGS = {
    "native": ["-march=native"],
    "avx2": ["-march=x86-64-v3", "-mf16c"],  # AVX2, FMA, F16C, BMI2; no AVX-512, no VNNI
    "scalar": ["-march=x86-64"],
}
ISAS = tuple(ISA_FLAGS)  # native, avx2, scalar
