#!/usr/bin/env bash
# Builds and runs every CPU test twice: a normal build (build/), then an
# ASan+UBSan build with the libFuzzer targets run for a bounded time
# (build-asan/). Ends with one line: "total: N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0 failed=0 skipped=0
run_suite() { # dir
  local log="$1/ctest.log"
  ctest --test-dir "$1" --output-on-failure -j2 2>&1 | tee "$log"
  local total fail skip
  total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
  fail=$(sed -n 's/.* \([0-9]*\) tests failed out of.*/\1/p' "$log" | tail -1)
  skip=$(grep -c '\*\*\*Skipped' "$log")
  total=${total:-0} fail=${fail:-1}
  passed=$((passed + total - fail - skip)) failed=$((failed + fail)) skipped=$((skipped + skip))
}

if bash tools/build.sh build; then
  run_suite build
else
  echo "test: the normal build failed"; failed=$((failed + 1))
fi
if bash tools/build.sh build-asan -DCMAKE_C_COMPILER=clang -DKILN_SANITIZE=ON -DKILN_FUZZ=ON -DKILN_CUDA=OFF; then
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 run_suite build-asan
else
  echo "test: the sanitizer build failed"; failed=$((failed + 1))
fi
echo "total: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
