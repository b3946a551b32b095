# Helpers sourced by the tests/e2e/*.sh scripts (not a test itself).
# Each script: `source "$(dirname "$0")/common.bash"`, then `check ...`
# calls, then `finish`.

KILN_BUILD_DIR=${KILN_BUILD_DIR:-build}
KILN_SOURCE_DIR=${KILN_SOURCE_DIR:-.}
KILN="$KILN_BUILD_DIR/bin/kiln"
EXAMPLE_LIB="$KILN_BUILD_DIR/lib/libkiln_scale_bias.so"
TEST_PLUGINS="$KILN_BUILD_DIR/tests/plugins"
NET="$KILN_SOURCE_DIR/examples/scale_bias/net.json"

if [ ! -x "$KILN" ]; then
  echo "SKIP: $KILN is not built"
  exit 77
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-e2e.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
FAILED=0
PASSED=0
OUT="$TMP/stdout"
ERR="$TMP/stderr"

fail() {
  echo "  FAIL: $*"
  FAILED=$((FAILED + 1))
}

# run CMD...: runs it, keeping stdout/stderr in $OUT/$ERR and the exit
# status in $RC.
run() {
  "$@" >"$OUT" 2>"$ERR"
  RC=$?
}

# expect_ok WHAT CMD...: exit status 0.
expect_ok() {
  local what=$1
  shift
  echo "case: $what"
  run "$@"
  if [ "$RC" -ne 0 ]; then
    fail "$what: exit $RC, expected 0; stderr: $(cat "$ERR")"
    return 1
  fi
  PASSED=$((PASSED + 1))
  return 0
}

# check_json WHAT PYTHON-CONDITIONS...: every condition (a Python
# expression over r, the JSON object in $OUT) holds.
check_json() {
  local what=$1
  shift
  echo "case: $what"
  if python3 - "$OUT" "$@" <<'PY'; then PASSED=$((PASSED + 1)); else fail "$what: $(cat "$OUT")"; fi
import json, sys
r = json.load(open(sys.argv[1]))
for cond in sys.argv[2:]:
    if not eval(cond, dict(r=r)):
        print("failed:", cond, file=sys.stderr)
        sys.exit(1)
PY
}

# expect_error CODE WHAT 'KEYWORD|KEYWORD...' CMD...: exit status exactly
# CODE (so a crash, >= 128, never passes), stderr exactly one line
# starting "kiln: error:" and containing every keyword.
expect_error() {
  local code=$1 what=$2 keys=$3
  shift 3
  echo "case: $what"
  run "$@"
  local ok=1
  if [ "$RC" -ne "$code" ]; then
    fail "$what: exit $RC, expected $code"
    ok=0
  fi
  local lines
  lines=$(wc -l <"$ERR")
  if [ "$lines" -ne 1 ]; then
    fail "$what: stderr has $lines lines, expected 1"
    ok=0
  fi
  if ! head -n 1 "$ERR" | grep -q '^kiln: error: '; then
    fail "$what: stderr does not start with 'kiln: error:'"
    ok=0
  fi
  local IFS='|' key
  for key in $keys; do
    if ! grep -qF -- "$key" "$ERR"; then
      fail "$what: stderr lacks \"$key\""
      ok=0
    fi
  done
  [ "$ok" -eq 1 ] || echo "  stderr was: $(cat "$ERR")"
  [ "$ok" -eq 1 ] && PASSED=$((PASSED + 1))
  return 0
}

# expect_stdout WHAT PATTERN: the last command's stdout matches (grep -E).
expect_stdout() {
  if grep -qE -- "$2" "$OUT"; then
    PASSED=$((PASSED + 1))
  else
    fail "$1: stdout does not match /$2/; stdout: $(head -c 2000 "$OUT")"
  fi
}

need_file() {
  if [ ! -f "$1" ]; then
    echo "SKIP: $1 is not built"
    exit 77
  fi
}

finish() {
  echo "$PASSED checks passed, $FAILED failed"
  [ "$FAILED" -eq 0 ] && exit 0
  exit 1
}
