/* What the LLM subcommands (run, chat, tokenize, detokenize) share. */
#ifndef KILN_CLI_LLM_H
#define KILN_CLI_LLM_H

#include <kiln/llm.h>

#define CLI_LLM_SAMPLING_VALUED \
    "--temperature", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--presence-penalty", "--frequency-penalty", \
        "--seed"

#define CLI_LLM_SAMPLING_HELP \
    "  --temperature T          0 is greedy (default 0.8)\n" \
    "  --top-k K                keep the K most likely tokens, 0 = off (default 40)\n" \
    "  --top-p P                keep the smallest set with probability >= P (default 0.95)\n" \
    "  --min-p P                keep tokens with p >= P * max p (default 0.05)\n" \
    "  --repeat-penalty R       HF repetition penalty over prompt and output (default 1 = off)\n" \
    "  --presence-penalty X     OpenAI presence penalty over the output (default 0)\n" \
    "  --frequency-penalty X    OpenAI frequency penalty over the output (default 0)\n" \
    "  --seed S                 sampling seed (default: from the clock)\n" \
    "  --stop TEXT              end when the text contains TEXT (repeatable; not printed)\n" \
    "  --ignore-eos             keep going past the end-of-sequence token\n"

/* The KV-cache and CUDA-graph options of run and chat. */
#define CLI_LLM_MEMORY_VALUED "--kv-cache-mb", "--kv-cache-fraction", "--threads"

#define CLI_LLM_MEMORY_HELP \
    "  --kv-cache-mb N          KV-cache memory (default: on the CPU enough for one full\n" \
    "                           sequence, at most a quarter of physical memory; on a GPU\n" \
    "                           --kv-cache-fraction of the free memory, capped at max_batch\n" \
    "                           full sequences)\n" \
    "  --threads N              CPU: threads that run a step (default: one per physical core)\n" \
    "  --kv-cache-fraction F    GPU: fraction of the free GPU memory the KV cache may take\n" \
    "                           once the weights are loaded (default 0.9)\n" \
    "  --no-cuda-graphs         GPU: launch decode steps kernel by kernel\n"

/* Parses a memory option into o; *handled = 0 when opt is not one. */
int cli_llm_memory_option(const char *cmd, const char *opt, const char *value, kiln_llm_options *o, int *handled);

/* Creates a registry with libs loaded and opens the engine (opt may be
 * NULL); prints the error and returns CLI_FAILURE when it cannot. */
int cli_llm_open(const char *path, const char *const *libs, int n_libs, const kiln_llm_options *opt,
                 kiln_registry **reg, kiln_llm **llm);
void cli_llm_sampling_default(kiln_llm_sampling *s);
/* Parses a sampling option into s; *handled = 0 when opt is not one. */
int cli_llm_sampling_option(const char *cmd, const char *opt, const char *value, kiln_llm_sampling *s, int *handled);
/* A kiln_llm_token_fn writing the text to stdout. */
int cli_llm_print_token(void *user, int32_t request, int32_t token, const char *text, size_t len);
/* "prompt: N tokens, X tok/s; generation: ..." on stderr. */
void cli_llm_print_speed(const kiln_llm_result *r);
/* One stderr line: the KV cache's size and the tokens it holds, and on a
 * GPU the decode graphs captured at open. */
void cli_llm_print_cache(const kiln_llm *llm);
/* min(want, max_seq_len - n_prompt), or the error when the prompt alone is too long. */
int cli_llm_fit_max_tokens(const kiln_llm *llm, size_t n_prompt, long want, int32_t *out);

#endif
