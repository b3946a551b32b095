# Helpers sourced by the tests/e2e/serve_*.sh scripts after common.bash (not
# a test itself): a tiny engine built from tests/data/llm/qwen2 (random
# weights, its own ChatML template) and `kiln serve` started on a free port.

if ! "$KILN" --help | grep -q '^  serve '; then
  echo "SKIP: this kiln was built without libmicrohttpd (no kiln serve)"
  exit 77
fi

# KILN_SERVE_ENGINE: another engine to serve instead (the load test's soak
# on a real model); it is served under the same name, "tiny".
SERVE_ENGINE=${KILN_SERVE_ENGINE:-$TMP/tiny.engine}
SERVE_PID=
trap '[ -n "$SERVE_PID" ] && kill -KILL "$SERVE_PID" 2>/dev/null; rm -rf "$TMP"' EXIT

serve_engine() {
  [ -f "$SERVE_ENGINE" ] && return 0
  if ! "$KILN" build "$KILN_SOURCE_DIR/tests/data/llm/qwen2" -o "$SERVE_ENGINE" >"$TMP/build.out" 2>&1; then
    echo "cannot build the test engine: $(cat "$TMP/build.out")"
    exit 1
  fi
}

# serve_start ARGS...: starts `kiln serve` on the tiny engine on a free port
# with ARGS; sets SERVE_PID, SERVE_PORT and SERVE_URL (http://127.0.0.1:PORT).
serve_start() {
  serve_engine
  SERVE_PORT=
  # emptied here, not by the background job's redirection: the loop below
  # may read the file before the job has opened it, and would find the
  # previous server's port there (a connection refused, seen in CI)
  : >"$TMP/serve.err"
  "$KILN" serve "$SERVE_ENGINE" --port 0 --model-name tiny "$@" >"$TMP/serve.out" 2>"$TMP/serve.err" &
  SERVE_PID=$!
  for _ in $(seq 1 400); do
    SERVE_PORT=$(sed -n 's|.* on http://[^ ]*:\([0-9][0-9]*\)/v1 .*|\1|p' "$TMP/serve.err")
    [ -n "$SERVE_PORT" ] && break
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.05
  done
  if [ -z "$SERVE_PORT" ]; then
    echo "kiln serve did not start: $(cat "$TMP/serve.err")"
    exit 1
  fi
  SERVE_URL=http://127.0.0.1:$SERVE_PORT
}

# serve_stop: SIGTERM, then waits; the exit status is in SERVE_RC.
serve_stop() {
  kill -TERM "$SERVE_PID"
  wait "$SERVE_PID"
  SERVE_RC=$?
  SERVE_PID=
}

# metric NAME: the value of a metric on /metrics: its first series, or the
# series NAME names with its labels (kiln_requests_total{model="tiny",outcome="cancelled"}).
metric() {
  curl -s "$SERVE_URL/metrics" | awk -v n="$1" 'index($1, n) == 1 && (length($1) == length(n) || substr($1, length(n) + 1, 1) == "{") {print $2; exit}'
}

# need_openai: OpenAI's Python client, pinned, in the project's .venv
# (installed once; under a lock, as the serve tests may run in parallel).
# Sets venv; skips the test when it cannot be had.
need_openai() {
  venv=$KILN_SOURCE_DIR/.venv
  local pin=openai==3.51.0
  local have="import importlib.metadata as m, sys; sys.exit(m.version('openai') != '${pin#*==}')"
  "$venv/bin/python" -c "$have" 2>/dev/null && return 0
  (
    flock 9
    "$venv/bin/python" -c "$have" 2>/dev/null && exit 0
    if [[ ! -x $venv/bin/python ]] && ! python3 -m venv "$venv"; then
      echo "SKIP: cannot create a Python venv at $venv"
      exit 77
    fi
    if ! "$venv/bin/pip" install --quiet "$pin"; then
      echo "SKIP: pip could not install $pin (no access to the package registry?)"
      exit 77
    fi
  ) 9>"$KILN_SOURCE_DIR/.venv.lock" || exit $?
}
