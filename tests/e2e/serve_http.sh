#!/usr/bin/env bash
# kiln serve through curl on a tiny engine: the routes, answers that match
# `kiln run` token for token (greedy), streaming (server-sent events ending
# in [DONE], usage when asked), stop strings, every kind of bad request
# with its status and OpenAI error object, the API key, the size limits,
# 429 with Retry-After when the queue is full, a client that disconnects
# (its request cancelled, its KV blocks freed), a stalled client closed
# (--timeout), and SIGTERM draining.
set -u
source "$(dirname "$0")/common.bash"
source "$(dirname "$0")/serve_common.bash"
command -v curl >/dev/null || { echo "SKIP: curl is not installed (tools/setup.sh installs it)"; exit 77; }

# jcheck WHAT FILE EXPR: the JSON in FILE satisfies the Python expression
# EXPR over `o`.
jcheck() {
  if python3 - "$2" "$3" <<'PY'; then PASSED=$((PASSED + 1)); else fail "$1: $(head -c 600 "$2")"; fi
import json, sys
o = json.load(open(sys.argv[1]))
sys.exit(0 if eval(sys.argv[2]) else 1)
PY
}

# post PATH BODY [CURL ARGS...]: status in $CODE, body in $TMP/body, headers in $TMP/headers.
post() {
  local path=$1 body=$2
  shift 2
  CODE=$(curl -s -o "$TMP/body" -D "$TMP/headers" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary "$body" "$@" "$SERVE_URL$path")
}
get() {
  local path=$1
  shift
  CODE=$(curl -s -o "$TMP/body" -D "$TMP/headers" -w '%{http_code}' "$@" "$SERVE_URL$path")
}
expect_code() { # WHAT CODE
  echo "case: $1"
  if [ "$CODE" = "$2" ]; then PASSED=$((PASSED + 1)); else fail "$1: status $CODE, expected $2: $(head -c 400 "$TMP/body")"; fi
}
# An OpenAI error object naming `param` (or null) whose message contains KEY.
expect_error_body() { # WHAT PARAM KEY
  jcheck "$1 error object" "$TMP/body" "set(o['error']) == {'message', 'type', 'param', 'code'} and o['error']['param'] == (None if '$2' == 'null' else '$2') and '$3' in o['error']['message']"
}

expect_ok "serve --help" "$KILN" serve --help
expect_stdout "serve --help" 'usage: kiln serve ENGINE'
expect_error 2 "serve: unknown option" "unknown option --bogus" "$KILN" serve x.engine --bogus
expect_error 2 "serve: port out of range" "--port 70000 is outside its limits 0..65535" "$KILN" serve x.engine --port 70000
expect_error 1 "serve: missing engine" "nope.engine" "$KILN" serve "$TMP/nope.engine" --port 0

serve_start --max-body-mb 1
blocks_total=$(metric kiln_kv_cache_blocks_total)
expect_error 1 "serve: the port is taken" "cannot listen on 127.0.0.1:$SERVE_PORT|Address already in use" \
  "$KILN" serve "$SERVE_ENGINE" --port "$SERVE_PORT"

get /health
expect_code "GET /health" 200
jcheck "health body" "$TMP/body" "o == {'status': 'ok'}"
echo "case: HTTP/1.1 keep-alive (curl reuses the connection)"
conns=$(curl -s -o /dev/null -o /dev/null -w '%{num_connects} ' "$SERVE_URL/health" "$SERVE_URL/v1/models")
if [ "$conns" = "1 0 " ]; then PASSED=$((PASSED + 1)); else fail "keep-alive: connections made per request: $conns"; fi
get /v1/models
expect_code "GET /v1/models" 200
jcheck "models list" "$TMP/body" "o['object'] == 'list' and [m['id'] for m in o['data']] == ['tiny'] and o['data'][0]['object'] == 'model'"
get /v1/models/tiny
expect_code "GET /v1/models/tiny" 200
get /v1/models/other
expect_code "GET /v1/models/other" 404

# Greedy answers equal `kiln run`'s (kiln_llm_generate, another path through the library).
expect_ok "kiln run reference" "$KILN" run "$SERVE_ENGINE" -p "Hello world" -n 12 --temperature 0 --ignore-eos --json
cp "$OUT" "$TMP/ref.json"
ref_text=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"], end="")' "$TMP/ref.json")
post /v1/completions '{"model":"tiny","prompt":"Hello world","max_tokens":12,"temperature":0,"ignore_eos":true}'
expect_code "POST /v1/completions" 200
cp "$TMP/body" "$TMP/cmpl.json"
jcheck "completion = kiln run" "$TMP/cmpl.json" "o['choices'][0]['text'] == json.load(open('$TMP/ref.json'))['text']"
jcheck "completion object" "$TMP/cmpl.json" "o['object'] == 'text_completion' and o['id'].startswith('cmpl-') and o['model'] == 'tiny' and o['choices'][0]['finish_reason'] == 'length' and o['choices'][0]['index'] == 0 and o['choices'][0]['logprobs'] is None"
jcheck "completion usage" "$TMP/cmpl.json" "o['usage'] == {'prompt_tokens': len(json.load(open('$TMP/ref.json'))['prompt_ids']), 'completion_tokens': 12, 'total_tokens': len(json.load(open('$TMP/ref.json'))['prompt_ids']) + 12}"

# The same prompt as token ids.
ids=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["prompt_ids"]))' "$TMP/ref.json")
post /v1/completions "{\"prompt\":$ids,\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}"
expect_code "prompt as token ids" 200
jcheck "token ids give the same text" "$TMP/body" "o['choices'][0]['text'] == json.load(open('$TMP/ref.json'))['text']"

# A stop string from the middle of the greedy text: the answer ends before it, "stop".
stop=$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["text"]; print(json.dumps(t[len(t)//2:len(t)//2+2]))' "$TMP/ref.json")
post /v1/completions "{\"prompt\":\"Hello world\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,\"stop\":[$stop]}"
expect_code "stop string" 200
jcheck "stop string ends the text" "$TMP/body" "o['choices'][0]['finish_reason'] == 'stop' and json.load(open('$TMP/ref.json'))['text'].startswith(o['choices'][0]['text']) and $stop not in o['choices'][0]['text'] and len(o['choices'][0]['text']) < len(json.load(open('$TMP/ref.json'))['text'])"

# Streaming: events are "data: {json}", the last "data: [DONE]"; the
# pieces make the same text; with include_usage a last chunk has usage.
echo "case: streaming completion"
curl -s -N -H 'Content-Type: application/json' --data-binary '{"prompt":"Hello world","max_tokens":12,"temperature":0,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' "$SERVE_URL/v1/completions" >"$TMP/sse"
if python3 - "$TMP/sse" "$TMP/ref.json" <<'PY'; then PASSED=$((PASSED + 1)); else fail "streaming completion: $(head -c 800 "$TMP/sse")"; fi
import json, sys
raw = open(sys.argv[1]).read()
ref = json.load(open(sys.argv[2]))
events = raw.split("\n\n")
assert events[-1] == "" and events[-2] == "data: [DONE]", "must end with data: [DONE]"
chunks = [json.loads(e[len("data: "):]) for e in events[:-2]]
assert all(e.startswith("data: ") for e in events[:-1])
text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
assert text == ref["text"], (text, ref["text"])
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
assert chunks[-2]["choices"][0]["finish_reason"] == "length"
assert all(c["usage"] is None for c in chunks[:-1]) and all(c["object"] == "text_completion" for c in chunks)
PY

# Chat: the same answer as `kiln run --chat`; streamed, the first delta has the role.
expect_ok "kiln run --chat reference" "$KILN" run "$SERVE_ENGINE" --chat --system "Be brief." -p "What is the capital of France?" -n 10 --temperature 0 --ignore-eos --json
cp "$OUT" "$TMP/chatref.json"
chat='{"model":"tiny","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is the capital of France?"}],"max_tokens":10,"temperature":0,"ignore_eos":true'
post /v1/chat/completions "$chat}"
expect_code "POST /v1/chat/completions" 200
jcheck "chat = kiln run --chat" "$TMP/body" "o['object'] == 'chat.completion' and o['choices'][0]['message'] == {'role': 'assistant', 'content': json.load(open('$TMP/chatref.json'))['text']} and o['usage']['prompt_tokens'] == len(json.load(open('$TMP/chatref.json'))['prompt_ids'])"
echo "case: streaming chat"
curl -s -N -H 'Content-Type: application/json' --data-binary "$chat,\"stream\":true}" "$SERVE_URL/v1/chat/completions" >"$TMP/sse"
if python3 - "$TMP/sse" "$TMP/chatref.json" <<'PY'; then PASSED=$((PASSED + 1)); else fail "streaming chat: $(head -c 800 "$TMP/sse")"; fi
import json, sys
events = open(sys.argv[1]).read().split("\n\n")
ref = json.load(open(sys.argv[2]))
assert events[-2] == "data: [DONE]"
chunks = [json.loads(e[len("data: "):]) for e in events[:-2]]
assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == ref["text"]
assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["choices"][0]["delta"] == {}
assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
PY

# Bad requests: status, OpenAI's error object, the field named.
post /v1/completions '{"prompt":"a",'
expect_code "malformed JSON" 400
expect_error_body "malformed JSON" null "not valid JSON"
post /v1/completions '{"prompt":"a","temperature":"hot"}'
expect_code "temperature as a string" 400
expect_error_body "temperature as a string" temperature "temperature must be a number"
post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"n":2}'
expect_code "n = 2" 400
expect_error_body "n = 2" n "n must be 1"
post /v1/chat/completions '{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}'
expect_code "unknown model" 404
jcheck "unknown model code" "$TMP/body" "o['error']['code'] == 'model_not_found' and 'tiny' in o['error']['message']"
post /v1/completions '{"prompt":[1,2,99999]}'
expect_code "token id outside the vocabulary" 400
expect_error_body "token id outside the vocabulary" prompt "outside the vocabulary (0..319)"
long=$(python3 -c 'print("[" + ",".join(["5"] * 300) + "]")')
post /v1/completions "{\"prompt\":$long}"
expect_code "prompt past the context" 400
expect_error_body "prompt past the context" prompt "the prompt is 300 tokens"
post /v1/completions '{"prompt":"Hello","max_tokens":1000}'
expect_code "max_tokens past the context" 400
expect_error_body "max_tokens past the context" max_tokens "max sequence length 256"
post /v1/completions '{"prompt":[]}'
expect_code "empty prompt list" 400
get /v1/nothing
expect_code "unknown route" 404
expect_error_body "unknown route" null "no route /v1/nothing"
get /v1/completions
expect_code "GET on a POST route" 405
post /v1/models '{}'
expect_code "POST on a GET route" 405
head -c 1100000 /dev/zero | tr '\0' 'a' >"$TMP/big"
CODE=$(curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$TMP/big" "$SERVE_URL/v1/completions")
expect_code "body past --max-body-mb 1" 413
CODE=$(curl -s -o "$TMP/body" -w '%{http_code}' -H "X-Big: $(head -c 70000 /dev/zero | tr '\0' 'b')" "$SERVE_URL/health")
echo "case: a 70 KB header"
case $CODE in 413 | 414 | 431) PASSED=$((PASSED + 1)) ;; *) fail "a 70 KB header: status $CODE, expected 413, 414 or 431" ;; esac
get /health
expect_code "still serving after the bad requests" 200

echo "case: /metrics"
curl -s "$SERVE_URL/metrics" >"$TMP/metrics"
for m in kiln_requests_running kiln_requests_waiting kiln_kv_cache_usage_ratio kiln_prefix_cache_hit_tokens_total \
  kiln_prompt_tokens_total kiln_generation_tokens_total kiln_time_to_first_token_seconds_bucket \
  kiln_inter_token_latency_seconds_count kiln_client_disconnects_total kiln_decode_steps_total \
  kiln_step_seconds_total; do
  grep -q "^$m{" "$TMP/metrics" || fail "/metrics lacks $m"
done
grep -Eq '^kiln_step_seconds_total\{model="[^"]*",kind="decode"\} [0-9.]+$' "$TMP/metrics" &&
  grep -Eq '^kiln_step_seconds_total\{model="[^"]*",kind="prompt"\} [0-9.]*[1-9][0-9.]*$' "$TMP/metrics" ||
  fail "/metrics: kiln_step_seconds_total lacks its decode and prompt series (or no prompt step time)"
PASSED=$((PASSED + 1))
serve_stop
echo "case: SIGTERM with nothing in flight exits 0"
if [ "$SERVE_RC" = 0 ]; then PASSED=$((PASSED + 1)); else fail "exit $SERVE_RC after SIGTERM: $(tail -3 "$TMP/serve.err")"; fi

# The API key: /v1 needs it, /health does not. (And --timeout 1: a
# client that stops sending its headers is closed.)
serve_start --api-key s3cret --timeout 1
echo "case: --timeout closes a connection whose headers stall"
if python3 - "$SERVE_PORT" <<'PY'; then PASSED=$((PASSED + 1)); else fail "--timeout 1 did not close a stalled connection"; fi
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and nothing more
s.settimeout(10)
t = time.time()
data = s.recv(100)
sys.exit(0 if data == b"" and time.time() - t < 8 else 1)
PY
get /v1/models
expect_code "no API key" 401
jcheck "no API key: code" "$TMP/body" "o['error']['code'] == 'invalid_api_key'"
grep -qi '^WWW-Authenticate: Bearer' "$TMP/headers" && PASSED=$((PASSED + 1)) || fail "401 without WWW-Authenticate"
get /v1/models -H 'Authorization: Bearer wrong'
expect_code "wrong API key" 401
get /v1/models -H 'Authorization: Bearer s3cret'
expect_code "right API key" 200
get /health
expect_code "/health needs no key" 200
serve_stop

# A client that hangs up while its request waits: it is cancelled without
# ever running. One request runs at a time (16 KV blocks, each request
# needs 16) and 24 long ones (some 30 ms each here) go first, so the last
# one waits long after its client is gone.
serve_start --kv-cache-blocks 16
echo "case: a client hangs up while its request waits"
blocks_total=$(metric kiln_kv_cache_blocks_total)
if python3 - "$SERVE_PORT" <<'PY'; then PASSED=$((PASSED + 1)); else fail "the requests ahead of the hang-up did not all succeed"; fi
import json, socket, sys, time
port = int(sys.argv[1])
def send(body):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s
ahead = [send({"prompt": "Hi", "max_tokens": 240, "ignore_eos": True}) for _ in range(24)]
time.sleep(0.02)
send({"prompt": "Hello", "max_tokens": 200, "stream": True}).close()
codes = []
for s in ahead:
    reply = b""
    while chunk := s.recv(65536):
        reply += chunk
    codes.append(reply.split(b" ", 2)[1])
sys.exit(0 if codes == [b"200"] * 24 else 1)
PY
ok=0
for _ in $(seq 1 200); do
  if [ "$(metric kiln_requests_running)" = 0 ] && [ "$(metric kiln_requests_waiting)" = 0 ] &&
    [ "$(metric kiln_kv_cache_blocks_free)" = "$blocks_total" ] &&
    [ "$(metric 'kiln_requests_total{model="tiny",outcome="cancelled"}')" = 1 ] &&
    [ "$(metric kiln_client_disconnects_total)" = 1 ]; then
    ok=1
    break
  fi
  sleep 0.05
done
if [ $ok = 1 ]; then PASSED=$((PASSED + 1)); else
  fail "hang-up while waiting: running $(metric kiln_requests_running), waiting $(metric kiln_requests_waiting), free blocks $(metric kiln_kv_cache_blocks_free) of $blocks_total, disconnects $(metric kiln_client_disconnects_total), cancelled $(metric 'kiln_requests_total{model="tiny",outcome="cancelled"}')"
fi
# And one that hangs up mid-stream: whether its request was still running
# then depends on the machine's speed, so only the end state is checked.
echo "case: a client hangs up mid-stream"
curl -s -N -m 30 -H 'Content-Type: application/json' --data-binary '{"prompt":"Hello","max_tokens":240,"ignore_eos":true,"stream":true}' "$SERVE_URL/v1/completions" | head -c 300 >/dev/null
for _ in $(seq 1 200); do
  [ "$(metric kiln_requests_running)" = 0 ] && [ "$(metric kiln_kv_cache_blocks_free)" = "$blocks_total" ] && break
  sleep 0.05
done
if [ "$(metric kiln_requests_running)" = 0 ] && [ "$(metric kiln_kv_cache_blocks_free)" = "$blocks_total" ]; then
  PASSED=$((PASSED + 1))
  echo "  disconnects counted: $(metric kiln_client_disconnects_total) (2 when the stream was cut while running)"
else
  fail "after a hang-up mid-stream: running $(metric kiln_requests_running), free blocks $(metric kiln_kv_cache_blocks_free)"
fi
serve_stop

# A full queue: one running request at a time (a KV cache of 16 blocks,
# each request needs 16) and a queue of 1, 12 requests at once: the
# first ones are served, the rest get 429 with Retry-After at once.
serve_start --max-queue 1 --kv-cache-blocks 16
echo "case: 429 when the queue is full"
pids=()
for i in $(seq 1 12); do
  curl -s -o "$TMP/q$i.body" -D "$TMP/q$i.headers" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"Hi","max_tokens":200,"ignore_eos":true}' "$SERVE_URL/v1/completions" >"$TMP/q$i.code" &
  pids+=($!)
done
wait "${pids[@]}"
n200=0 n429=0 other=0
for i in $(seq 1 12); do
  case $(cat "$TMP/q$i.code") in
    200) n200=$((n200 + 1)) ;;
    429) n429=$((n429 + 1)); grep -qi '^Retry-After: ' "$TMP/q$i.headers" || other=$((other + 1)) ;;
    *) other=$((other + 1)) ;;
  esac
done
echo "  200: $n200, 429: $n429, other: $other"
if [ $n200 -ge 1 ] && [ $n429 -ge 1 ] && [ $other = 0 ]; then PASSED=$((PASSED + 1)); else fail "queue full: 200 x$n200, 429 x$n429, other x$other"; fi

# SIGTERM drains: a request in flight finishes (200, [DONE]); exit 0.
echo "case: SIGTERM lets a request in flight finish"
curl -s -N -H 'Content-Type: application/json' --data-binary '{"prompt":"Hi","max_tokens":200,"ignore_eos":true,"stream":true}' "$SERVE_URL/v1/completions" >"$TMP/drain.sse" &
curl_pid=$!
for _ in $(seq 1 1000); do [ -s "$TMP/drain.sse" ] && break; sleep 0.01; done
serve_stop
wait $curl_pid
if [ "$SERVE_RC" = 0 ] && tail -c 20 "$TMP/drain.sse" | grep -q 'data: \[DONE\]' && ! grep -q '"error"' "$TMP/drain.sse"; then
  PASSED=$((PASSED + 1))
else
  fail "drain: exit $SERVE_RC, stream ends $(tail -c 200 "$TMP/drain.sse")"
fi

# --drain 0: what is in flight is cancelled with an error event; exit 0.
serve_start --drain 0 --kv-cache-blocks 16
echo "case: SIGTERM with --drain 0 cancels, saying so"
curl -s -N -H 'Content-Type: application/json' --data-binary '{"prompt":"Hi","max_tokens":240,"ignore_eos":true,"stream":true}' "$SERVE_URL/v1/completions" >"$TMP/drain0.sse" &
curl_pid=$!
for _ in $(seq 1 1000); do [ -s "$TMP/drain0.sse" ] && break; sleep 0.01; done
serve_stop
wait $curl_pid
if [ "$SERVE_RC" = 0 ] && tail -c 20 "$TMP/drain0.sse" | grep -q 'data: \[DONE\]'; then
  PASSED=$((PASSED + 1))
  grep -q 'shutting down' "$TMP/drain0.sse" || echo "  (the request had finished before the signal)"
else
  fail "--drain 0: exit $SERVE_RC, stream ends $(tail -c 200 "$TMP/drain0.sse")"
fi
finish
