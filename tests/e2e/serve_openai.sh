#!/usr/bin/env bash
# kiln serve with OpenAI's official Python client (openai, pinned below,
# installed into the project's .venv): chat and completions, streaming and
# not, usage, logprobs, the models list, and the client's exception for
# each kind of error. Greedy answers must equal `kiln run`'s.
set -u
source "$(dirname "$0")/common.bash"
source "$(dirname "$0")/serve_common.bash"

need_openai

serve_start --api-key test-key
expect_ok "kiln run reference" "$KILN" run "$SERVE_ENGINE" -p "Once upon a time" -n 10 --temperature 0 --ignore-eos --json
cp "$OUT" "$TMP/ref.json"
expect_ok "kiln run --chat reference" "$KILN" run "$SERVE_ENGINE" --chat -p "What is the capital of France?" -n 10 --temperature 0 --ignore-eos --json
cp "$OUT" "$TMP/chatref.json"

echo "case: the openai package against kiln serve"
if "$venv/bin/python" - "$SERVE_URL/v1" "$TMP/ref.json" "$TMP/chatref.json" <<'PY'; then PASSED=$((PASSED + 1)); else fail "openai client checks (see above)"; fi
import json, math, sys
import openai
from openai import OpenAI

url, ref, chatref = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
client = OpenAI(base_url=url, api_key="test-key", max_retries=0)
failures = 0

def check(what, cond, detail=""):
    global failures
    print(("ok   " if cond else "FAIL ") + what + ("" if cond else ": " + str(detail)))
    failures += not cond

print("openai", openai.__version__)
models = client.models.list()
check("models.list", [m.id for m in models.data] == ["tiny"], models)

msgs = [{"role": "user", "content": "What is the capital of France?"}]
r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
check("chat text = kiln run --chat", r.choices[0].message.content == chatref["text"], (r.choices[0].message.content, chatref["text"]))
check("chat finish_reason length", r.choices[0].finish_reason == "length", r.choices[0].finish_reason)
check("chat usage", (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens)
      == (len(chatref["prompt_ids"]), 10, len(chatref["prompt_ids"]) + 10), r.usage)
check("chat role", r.choices[0].message.role == "assistant" and r.object == "chat.completion")

stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0, stream=True,
                                        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
text, finish, usage = "", None, None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
check("streamed chat text", text == chatref["text"], (text, chatref["text"]))
check("streamed chat finish and usage", finish == "length" and usage is not None and usage.completion_tokens == 10, (finish, usage))

c = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
check("completion text = kiln run", c.choices[0].text == ref["text"], (c.choices[0].text, ref["text"]))
check("completion usage", c.usage.prompt_tokens == len(ref["prompt_ids"]) and c.usage.completion_tokens == 10, c.usage)
stream = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0, stream=True,
                                   extra_body={"ignore_eos": True})
check("streamed completion text", "".join(ch.choices[0].text for ch in stream if ch.choices) == ref["text"])

# Logprobs: the greedy token is the most likely one, alternatives sorted,
# each a log-probability (<= 0), as many as asked.
r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
                                   extra_body={"ignore_eos": True})
lp = r.choices[0].logprobs.content
check("chat logprobs: one per token", len(lp) == 6, len(lp))
ok = True
for t in lp:
    tops = [a.logprob for a in t.top_logprobs]
    ok &= len(tops) == 3 and tops == sorted(tops, reverse=True) and all(x <= 0 for x in tops)
    ok &= math.isclose(t.logprob, tops[0], abs_tol=1e-5) and t.token == t.top_logprobs[0].token
    ok &= bytes(t.bytes).decode("utf-8", "replace") == t.token or "\ufffd" in t.token
check("chat logprobs: greedy token first, sorted, <= 0", ok, lp[:2])
check("chat logprobs: text is the tokens", "".join(bytes(t.bytes).decode("utf-8", "replace") for t in lp) == r.choices[0].message.content
      or "\ufffd" in r.choices[0].message.content, (r.choices[0].message.content, [t.token for t in lp]))
c = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=2,
                              extra_body={"ignore_eos": True})
l = c.choices[0].logprobs
check("completion logprobs", len(l.tokens) == 5 and len(l.token_logprobs) == 5 and all(len(t) <= 2 for t in l.top_logprobs)
      and l.text_offset == sorted(l.text_offset) and all(x <= 0 for x in l.token_logprobs), l)
stream = client.completions.create(model="tiny", prompt="Once", max_tokens=4, temperature=0, logprobs=1, stream=True,
                                   extra_body={"ignore_eos": True})
n = sum(len(ch.choices[0].logprobs.tokens) for ch in stream if ch.choices and ch.choices[0].logprobs)
check("streamed completion logprobs: one per token", n == 4, n)

# Sampling with a seed repeats; stop strings cut.
a = client.completions.create(model="tiny", prompt="Once", max_tokens=12, temperature=1.0, top_p=0.9, seed=42, extra_body={"ignore_eos": True})
b = client.completions.create(model="tiny", prompt="Once", max_tokens=12, temperature=1.0, top_p=0.9, seed=42, extra_body={"ignore_eos": True})
check("same seed, same text", a.choices[0].text == b.choices[0].text)
stop = ref["text"][3:5]
c = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
check("stop string", c.choices[0].finish_reason == "stop" and ref["text"].startswith(c.choices[0].text) and stop not in c.choices[0].text,
      (c.choices[0].text, stop))

# Errors: the client's exception classes, with OpenAI's body.
def expect(what, cls, fn, param=None):
    try:
        fn()
    except cls as e:
        check(what, param is None or (e.body or {}).get("param") == param, e.body)
        return
    except Exception as e:
        check(what, False, repr(e))
        return
    check(what, False, "no error")

expect("n=2 is a BadRequestError", openai.BadRequestError,
       lambda: client.chat.completions.create(model="tiny", messages=msgs, n=2), "n")
expect("a bad temperature is a BadRequestError", openai.BadRequestError,
       lambda: client.chat.completions.create(model="tiny", messages=msgs, temperature=5), "temperature")
expect("an unknown model is a NotFoundError", openai.NotFoundError,
       lambda: client.chat.completions.create(model="gpt-4o", messages=msgs), "model")
expect("a prompt past the context is a BadRequestError", openai.BadRequestError,
       lambda: client.completions.create(model="tiny", prompt=[5] * 300), "prompt")
expect("a wrong key is an AuthenticationError", openai.AuthenticationError,
       lambda: OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list())
sys.exit(1 if failures else 0)
PY
serve_stop
[ "$SERVE_RC" = 0 ] && PASSED=$((PASSED + 1)) || fail "exit $SERVE_RC after SIGTERM"
finish
