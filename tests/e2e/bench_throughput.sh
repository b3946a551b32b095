#!/usr/bin/env bash
# kiln bench --throughput on a CPU engine of the tiny "llama" checkpoint
# (tests/data/llm), a few dozen requests:
#  - every figure present and positive; the token counts are exactly the
#    requests times the fixed lengths, and the tok/s figures agree with
#    them over the reported duration; the decode steps are some but not
#    all, and the steps' times add up to no more than the duration;
#  - a 1 MB KV cache (128 blocks) for 40 requests of 124 tokens (8 blocks
#    each) with 32 sequences a step: the cache runs full and requests are
#    preempted, yet every request generates all its tokens;
#  - with --no-evict on the same cache nothing is preempted;
#  - a shared 20-token prefix is reused (16-token blocks: at least one
#    block of every request after the first), and not without caching;
#  - spread lengths and Poisson arrivals run;
#  - --instances 3: the engine opened three times, the requests dealt out
#    among three schedulers stepping at once, every token counted once and
#    the KV blocks summed (three 1 MB caches);
#  - bad options are refused.
set -u
source "$(dirname "$0")/common.bash"

DATA=$KILN_SOURCE_DIR/tests/data/llm
E=$TMP/llama.engine

expect_ok "kiln bench --throughput --help" "$KILN" bench --throughput --help
expect_stdout "the help prints usage" "^usage: kiln bench ENGINE --throughput"
expect_ok "build llama f32, 32 sequences a step" "$KILN" build "$DATA/llama" -o "$E" --max-seq-len 128 --max-batch 32

expect_ok "all at once, a tiny cache" "$KILN" bench "$E" --throughput --requests 40 --input-len 24 --output-len 100 \
  --kv-cache-mb 1 --json
check_json "figures, counts and preemptions" \
  'r["requests"] == 40 and r["prompt_tokens"] == 40 * 24 and r["output_tokens"] == 40 * 100' \
  'len(r["device"]) > 0' \
  'all(r[k] > 0 for k in ["duration_s", "output_tok_s", "total_tok_s", "requests_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "steps"])' \
  'abs(r["output_tok_s"] * r["duration_s"] - 4000) < 1 and abs(r["total_tok_s"] * r["duration_s"] - 4960) < 1' \
  'abs(r["requests_s"] * r["duration_s"] - 40) < 1e-6' \
  'r["ttft_ms_p50"] <= r["ttft_ms_p99"] <= r["ttft_ms_max"] and r["itl_ms_p50"] <= r["itl_ms_p99"]' \
  'r["kv_blocks_total"] == 128 and r["kv_blocks_peak"] == 128 and r["kv_peak_fraction"] == 1.0' \
  'r["preemptions"] > 0 and r["prefix_hit_tokens"] == 0 and r["max_batch"] == 32' \
  '0 < r["decode_steps"] < r["steps"] and r["decode_step_s"] > 0 and r["prompt_step_s"] > 0' \
  'r["decode_step_s"] + r["prompt_step_s"] <= r["duration_s"] * 1.01 + 1e-3'

expect_ok "no-evict admission, the same tiny cache" "$KILN" bench "$E" --throughput --requests 40 --input-len 24 \
  --output-len 100 --kv-cache-mb 1 --no-evict --json
check_json "nothing preempted" 'r["admission"] == "no-evict" and r["preemptions"] == 0 and r["output_tokens"] == 4000'

expect_ok "a shared prefix" "$KILN" bench "$E" --throughput --requests 12 --input-len 30 --output-len 8 \
  --prefix-len 20 --json
check_json "the prefix is reused" 'r["prefix_hit_tokens"] >= 11 * 16 and r["prefix_len"] == 20'
expect_ok "the same without prefix caching" "$KILN" bench "$E" --throughput --requests 12 --input-len 30 \
  --output-len 8 --prefix-len 20 --no-prefix-caching --json
check_json "no prefix hits" 'r["prefix_hit_tokens"] == 0 and r["prefix_caching"] is False'

expect_ok "spread lengths, Poisson arrivals" "$KILN" bench "$E" --throughput --requests 30 --input-len 40 \
  --output-len 20 --input-dist uniform --output-dist normal --spread 0.5 --rate 500 --json
check_json "spread and arrivals" 'r["input_dist"] == "uniform" and r["output_dist"] == "normal" and r["rate"] == 500' \
  'r["output_tokens"] > 0 and r["prompt_tokens"] > 0 and r["output_tok_s"] > 0'
expect_ok "text output" "$KILN" bench "$E" --throughput --requests 4 --input-len 8 --output-len 4
expect_stdout "the text names output throughput" "output throughput: .* tok/s"
expect_stdout "the text splits the step time" "step time: .* decode steps .* with prompt tokens"

expect_ok "three instances" "$KILN" bench "$E" --throughput --requests 31 --input-len 24 --output-len 20 \
  --kv-cache-mb 1 --instances 3 --json
check_json "three instances, every token once" 'r["instances"] == 3 and r["output_tokens"] == 31 * 20' \
  'r["prompt_tokens"] == 31 * 24 and r["kv_blocks_total"] == 3 * 128 and r["steps"] > 0'
expect_ok "three instances, text" "$KILN" bench "$E" --throughput --requests 6 --input-len 8 --output-len 4 --instances 3
expect_stdout "the text says so" "3 instances stepping at once"

expect_error 2 "nine instances" '--instances must be in 1..8' "$KILN" bench "$E" --throughput --instances 9
expect_error 2 "a bad distribution" '--input-dist must be fixed, uniform or normal' \
  "$KILN" bench "$E" --throughput --input-dist poisson
expect_error 2 "a negative rate" '--rate must be a number' "$KILN" bench "$E" --throughput --rate -1
expect_error 1 "a prompt as long as the engine allows" 'max sequence length 128' \
  "$KILN" bench "$E" --throughput --input-len 128
finish
