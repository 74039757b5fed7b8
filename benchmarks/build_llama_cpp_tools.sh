#!/usr/bin/env bash
# Build llama.cpp's own command-line tools (llama-completion, llama-bench, llama-perplexity,
# llama-speculative, llama-speculative-simple, llama-lookup, llama-tokenize) for the benchmark rows that run
# llama.cpp's own plain and speculative modes, and llama-server for the serving comparison
# (benchmarks/serve_compare.py): the CPU user's anchors. The source is the llama.cpp tree vendored in
# llama-cpp-python's PyPI source distribution (fetched with `pip download`, so the tools are the same
# llama.cpp version as specdec's llama.cpp backend).
#
# Built for this machine's instruction sets (AVX2, AVX-512, VNNI where the CPU has them: what
# GGML_NATIVE=ON gives, as llama.cpp's users build it, except AMX: a native build dies with SIGILL here on its
# first AMX instruction, a tilezero in ggml_backend_amx_mul_mat; see specdec.machine).
# The binaries only run on the CPU they were built for, so they live in a
# folder named by this CPU's instruction-set flags, and a machine with other flags builds its own.
# Usage: bash benchmarks/build_llama_cpp_tools.sh [LLAMA_CPP_PYTHON_VERSION]
#        → binaries in ~/.cache/specdec/llama.cpp-tools/native-<flags>/bin (about 15 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-0.3.36}"
py=$(command -v .venv/bin/python || command -v python3)
flags=$("$py" src/specdec/machine.py key)
root="${SPECDEC_CACHE:-$HOME/.cache/specdec}/llama.cpp-tools"
out="$root/native-$flags"
tools=(llama-completion llama-bench llama-perplexity llama-speculative llama-speculative-simple llama-lookup llama-tokenize
       llama-server)
# -rdynamic: the executables export their symbols, so the log-draining library that the bench preloads
# (specdec.bench.llamacpp_cli.FLUSH_LOG_SOURCE) finds common_log_main/common_log_pause; without it the
# drain is a no-op and the end of a tool's output is lost in about one run of seven.
build_id="$version rdynamic"
if [ -x "$out/bin/llama-server" ] && [ "$(cat "$out/bin/VERSION" 2>/dev/null)" = "$version" ] \
   && [ "$(cat "$out/bin/BUILD" 2>/dev/null)" = "$build_id" ]; then
  echo "llama.cpp tools (llama-cpp-python $version, native) already built in $out/bin"; exit 0
fi
mkdir -p "$root/sdist"
sdist="$root/sdist/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  "$py" -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$root/sdist"
fi
work="$out.build"
rm -rf "$work" && mkdir -p "$work/src"
tar xzf "$sdist" -C "$work/src" --strip-components=1
cmake -S "$work/src/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release $("$py" src/specdec/machine.py ggml-flags) \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_EXE_LINKER_FLAGS=-rdynamic >/dev/null
cmake --build "$work/build" -j "$(nproc)" --target "${tools[@]}"
rm -rf "$out/bin" && mkdir -p "$out/bin"
for t in "${tools[@]}"; do cp "$work/build/bin/$t" "$out/bin/"; done
if [ "$(nm -D "$out/bin/llama-completion" | grep -c common_log_pause)" = "0" ]; then
  echo "error: llama-completion does not export common_log_pause (-rdynamic): the bench would lose tool output" >&2
  exit 1
fi
echo "$version" > "$out/bin/VERSION"
echo "$build_id" > "$out/bin/BUILD"
"$py" src/specdec/machine.py ggml-flags > "$out/bin/CMAKE_FLAGS"
rm -rf "$work"
echo "built llama.cpp tools (llama-cpp-python $version, native for $flags) in $out/bin"
