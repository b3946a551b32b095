/* kiln/llm.h — text generation with an LLM engine.
 *
 * An LLM engine (docs/llm.md) carries its model config (section LLMC) and
 * its tokenizer (section TOKN), so opening the engine file is all it takes:
 * kiln_llm_open loads the engine, creates one execution context, allocates
 * the paged KV cache and every per-step buffer, and kiln_llm_generate runs
 * any number of requests batched together. Requests that come and go (a
 * server's) go through the scheduler (kiln_llm_scheduler_start below,
 * docs/scheduling.md): in-flight batching, where each step packs decode
 * tokens and prefill chunks, KV blocks are taken as sequences grow and
 * prompt prefixes are shared; kiln_llm_generate is a thin wrapper over it.
 *
 * On a GPU engine the KV cache and every per-step buffer are device memory;
 * the host exchanges only the step's small inputs and the sampled ids with
 * it (sampling runs in the engine, docs/llm.md), and decode steps replay
 * CUDA graphs captured at open.
 *
 * Threads: a kiln_llm is used by one thread at a time, except
 * kiln_llm_cancel, which any thread may call while another generates, and
 * the scheduler calls that say so.
 * Errors: fallible calls return a kiln_status and set kiln_last_error()
 * (thread-local) to a one-line message; outputs are untouched on failure.
 */
#ifndef KILN_LLM_H
#define KILN_LLM_H

#include <kiln/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_llm kiln_llm;

/* Every struct below that a caller fills begins with struct_size and
 * abi_version and has an _init function that sets both and the defaults:
 * the library reads a member only when struct_size covers it, so a program
 * compiled against an older, shorter struct keeps working. Structs the
 * library hands out (info, result) carry its own struct_size: a caller
 * compiled against a newer header reads a member only when struct_size
 * covers it. Arrays of these structs are passed as arrays of pointers,
 * never by stride. Members are only ever appended (tests/unit/test_abi_layout.c
 * pins every offset). */

/* ---- building an engine from a checkpoint ------------------------------------ */

typedef struct kiln_llm_build_options {
    uint32_t struct_size;
    uint32_t abi_version;
    /* F32 (default), F16 or BF16: weights, activations and KV cache. */
    kiln_dtype dtype;
    /* Matmul weights a GGUF stores as Q8_0, Q4_0 or Q4_1 stay in that
     * format (kiln/QuantMatMul, with activations in dtype): 1 on, 0 off,
     * -1 (default) on for a .gguf. */
    int32_t native;
    int32_t max_batch; /* sequences per step (default 8) */
    /* Tokens per sequence (default min(4096, the model's context)); more
     * than the model's max_position_embeddings is refused. */
    int32_t max_seq_len;
    int32_t max_tokens; /* new tokens per step (default max_seq_len) */
    int32_t block_size; /* KV-cache tokens per block (default 16) */
    /* llama2.c tokenizer.bin, required for a llama2.c .bin checkpoint;
     * NULL otherwise. Borrowed for the call. */
    const char *tokenizer;
    /* Called with fraction in [0, 1] and what is being done while weights
     * are converted and the engine is built; may be NULL. */
    void (*progress)(void *user, double fraction, const char *what);
    void *progress_user;
    kiln_backend backend; /* where the engine runs (default CPU) */
    int32_t reserved;
    /* Matmul weights of the decoder layers (kiln/WeightOnlyMatMul):
     * KILN_LLM_WEIGHTS_DTYPE (default) keeps them in dtype;
     * KILN_LLM_WEIGHTS_INT8 quantizes them at build by round-to-nearest
     * to int8 with a scale per output channel (or per weights_group
     * values); KILN_LLM_WEIGHTS_INT4 to int4 with a scale and zero point
     * per weights_group values (default 128);
     * KILN_LLM_WEIGHTS_FP8 to FP8 E4M3 with a scale per output channel,
     * the activations quantized per token when the layer runs (W8A8,
     * kiln/Fp8MatMul; `kiln build --dtype fp8`). Weights
     * a checkpoint stores quantized (AWQ, GPTQ) are kept as stored
     * whatever this says; a native GGUF build keeps its ggml formats. */
    int32_t weights;
    int32_t weights_group;   /* values per scale, a multiple of 32; 0 (default): int8 a row, int4 128 */
    int32_t weights_lm_head; /* nonzero: the output projection too (default: kept in dtype) */
    /* The KV cache's element type, KILN_LLM_KV_*: AUTO (default) is F16 in
     * a native CPU engine (its matmuls already run on 8-bit activations, as
     * llama.cpp's do beside its f16 cache; half the bytes a decode step
     * reads from the cache) and dtype otherwise. FP8 stores E4M3 codes
     * (a u8 cache tensor; one byte a value, half of f16's): keys and values
     * rounded to nearest even with a fixed scale of 1, saturating at ±448
     * (docs/llm.md says why and where that limit lies). On CUDA the cache
     * is in dtype or FP8: another type is refused. */
    int32_t kv_cache;
    /* KILN_LLM_WEIGHTS_FP8 only: a UTF-8 text file (NULL, default: every
     * token's activations get their own scale when the layer runs). The
     * model, unquantized, runs over its first calibrate_tokens tokens
     * (default 2048) at build; each FP8 matmul input then gets one static
     * scale, its max |x| over them / 448, values beyond saturating (`kiln
     * build --dtype fp8 --calibrate FILE`; docs/llm.md). Borrowed. */
    const char *calibrate;
    int32_t calibrate_tokens;
    int32_t reserved2; /* 0 */
} kiln_llm_build_options;

/* kiln_llm_build_options.weights */
enum { KILN_LLM_WEIGHTS_DTYPE = 0, KILN_LLM_WEIGHTS_INT8 = 1, KILN_LLM_WEIGHTS_INT4 = 2, KILN_LLM_WEIGHTS_FP8 = 3 };

/* kiln_llm_build_options.kv_cache */
enum { KILN_LLM_KV_AUTO = 0, KILN_LLM_KV_F32 = 1, KILN_LLM_KV_F16 = 2, KILN_LLM_KV_BF16 = 3, KILN_LLM_KV_FP8 = 4 };

/* Defaults as written above. */
KILN_API void kiln_llm_build_options_init(kiln_llm_build_options *options);

/* Builds an LLM engine (docs/llm.md) from a checkpoint and writes it to
 * `output` atomically (temp + rename). `checkpoint` is a Hugging Face model
 * directory (config.json, safetensors, tokenizer.json), a .gguf file, or a
 * llama2.c .bin (with options->tokenizer). The engine holds the weights,
 * the tokenizer, the chat template and the special tokens, so kiln_llm_open
 * needs nothing else. `options` may be NULL (defaults). Errors name the
 * file and the field or tensor at fault. */
KILN_API kiln_status kiln_llm_build(const char *checkpoint, const kiln_llm_build_options *options, const char *output);

/* The LLM part of an engine file as one JSON object: the LLMC section's
 * model config (docs/llm.md "Engine sections") with "tokenizer": {"kind",
 * "vocab_size", "bos", "eos"} added, and "error" (a string) when a section
 * does not read. Reads the file without its plugins and without a KV
 * cache, for `kiln inspect` and build summaries. KILN_ERROR_NOT_FOUND
 * when the engine has no LLMC section. *json is malloc'd, NUL-terminated:
 * free it with kiln_free. */
KILN_API kiln_status kiln_llm_describe_json(const char *path, char **json);

/* ---- opening an engine -------------------------------------------------------- */

typedef struct kiln_llm_options {
    uint32_t struct_size;
    uint32_t abi_version;
    /* Megabytes for the KV cache of all layers together. 0 (default): on
     * the CPU, enough for one sequence of max_seq_len tokens (a chat),
     * capped at a quarter of physical memory; on a GPU, kv_cache_fraction of the
     * GPU memory free once the weights and the step's buffers are there,
     * capped at what max_batch sequences of max_seq_len tokens can use. */
    size_t kv_cache_mb;
    /* > 0: exactly this many KV blocks instead (tools that only tokenize
     * ask for 1; tests ask for a small cache). Default 0. */
    int32_t kv_cache_blocks;
    int32_t reserved;
    /* GPU engines: the fraction of free GPU memory the KV cache may take
     * (TensorRT-LLM's free_gpu_memory_fraction). Default 0.9. */
    float kv_cache_fraction;
    /* GPU engines: nonzero skips capturing the decode steps' CUDA graphs
     * (every step is launched kernel by kernel). Default 0. */
    int32_t no_cuda_graphs;
    /* CPU engines: threads that run a step (1..1024, the calling thread
     * counted; OpenBLAS gets as many). 0 (default): one per physical core
     * the process may run on (SMT siblings counted once), shared with
     * other CPU engines of the process. Ignored on a GPU. */
    int32_t n_threads;
    /* Nonzero: kiln_llm_generate computes every prompt in full instead of
     * reusing KV blocks of an identical prompt prefix that an earlier call
     * left in the cache (timing prefill needs that). Default 0. */
    int32_t no_prefix_caching;
} kiln_llm_options;

KILN_API void kiln_llm_options_init(kiln_llm_options *options);

/* What an opened engine is and holds. Owned by the kiln_llm (strings and
 * arrays too) and valid as long as it. */
typedef struct kiln_llm_info {
    uint32_t struct_size; /* sizeof the library's kiln_llm_info */
    uint32_t abi_version;
    const char *architecture;  /* "llama", "qwen2", ... */
    const char *chat_template; /* "jinja" (the checkpoint's own template), or the
                                    built-in "chatml", "llama3", "llama2", or NULL */
    kiln_dtype dtype;          /* KV-cache dtype (the engine's; FP8_E4M3 for its u8 codes) */
    int32_t vocab_size;
    int32_t n_layers;
    int32_t max_seq_len;  /* tokens per sequence, prompt included */
    int32_t max_batch;    /* sequences per step */
    int32_t max_tokens;   /* new tokens per step (prefill chunk budget) */
    int32_t block_size;   /* tokens per KV block */
    int32_t n_blocks;     /* KV blocks in the cache */
    int64_t cache_tokens; /* n_blocks * block_size: tokens the cache holds */
    size_t cache_bytes;   /* KV-cache memory, all layers */
    int32_t bos_id;       /* -1 when none */
    int32_t n_eos;
    const int32_t *eos_ids;
    kiln_backend backend; /* where the engine runs */
    /* CUDA graphs captured at open, one per decode batch size bucket
     * (1, 2, 4, ... max_batch): their number, the time capturing them took,
     * and the launches (graph nodes) one decode step of the largest bucket
     * replays. 0 when graphs are off or the engine is a CPU one. */
    int32_t n_graphs;
    double graph_capture_ms;
    size_t graph_nodes;
    /* CPU engines: threads that run a step (kiln_llm_options.n_threads, or
     * the process-wide pool's count). 0 on a GPU. */
    int32_t n_threads;
    int32_t reserved;
} kiln_llm_info;

/* Sampling of one request. Order, as Hugging Face's generate applies it:
 * penalties, then temperature, top-k, top-p, min-p, then a draw. */
typedef struct kiln_llm_sampling {
    uint32_t struct_size;
    uint32_t abi_version;
    float temperature; /* 0: greedy (argmax after penalties) */
    int32_t top_k;     /* 0: off; else keep the k most likely */
    float top_p;       /* 1: off; keep the smallest set reaching p */
    float min_p;       /* 0: off; keep p >= min_p * max p */
    /* HF RepetitionPenaltyLogitsProcessor over prompt and generated ids:
     * a logit > 0 is divided by it, else multiplied. 1: off. */
    float repetition_penalty;
    /* OpenAI, over the generated ids: logit -= presence * (count > 0) +
     * frequency * count. 0: off. */
    float presence_penalty;
    float frequency_penalty;
    int32_t reserved;
    uint64_t seed; /* the request's own PRNG (xoshiro256**) */
} kiln_llm_sampling;

/* Neutral sampling: temperature 1, no top-k/p, min-p or penalties, seed 0. */
KILN_API void kiln_llm_sampling_init(kiln_llm_sampling *sampling);

typedef struct kiln_llm_request {
    uint32_t struct_size;
    uint32_t abi_version;
    /* The prompt as text (tokenized with special-token parsing, BOS as the
     * engine's config says), or, when prompt is NULL, as ids. Borrowed for
     * the call. */
    const char *prompt;
    size_t prompt_len;
    const int32_t *prompt_ids;
    size_t n_prompt_ids;
    int32_t max_tokens; /* tokens to generate at most (>= 1) */
    int32_t ignore_eos; /* 1: the config's EOS ids do not end it */
    /* NULL: kiln_llm_sampling_init's neutral sampling. Borrowed for the
     * call. */
    const kiln_llm_sampling *sampling;
    /* Generation ends when the text contains one of these; the stop string
     * and what follows are not part of the result. Borrowed. */
    const char *const *stop;
    int32_t n_stop;
    int32_t reserved;
    /* -1 (default): no logprobs; n >= 0: each token's logprob and its n
     * most likely alternatives (n <= 20) in kiln_llm_token and the
     * result. An engine built before the sampling layer had logprob
     * outputs refuses n >= 0 (KILN_ERROR_UNSUPPORTED: rebuild it). */
    int32_t logprobs;
    int32_t reserved2;
} kiln_llm_request;

/* No prompt, max_tokens 128, neutral sampling (sampling NULL), no stop
 * strings. */
KILN_API void kiln_llm_request_init(kiln_llm_request *req);

typedef enum kiln_llm_finish {
    KILN_LLM_FINISH_LENGTH = 0, /* max_tokens or max_seq_len reached */
    KILN_LLM_FINISH_EOS,        /* an EOS id was sampled (not in the text) */
    KILN_LLM_FINISH_STOP,       /* a stop string matched */
    KILN_LLM_FINISH_CANCELLED,  /* the callback or kiln_llm_cancel ended it */
    KILN_LLM_FINISH_ERROR,      /* the engine failed (result->error says why) */
    KILN_LLM_FINISH_COUNT
} kiln_llm_finish;

/* "length", "eos", "stop", "cancelled", "error". */
KILN_API const char *kiln_llm_finish_name(kiln_llm_finish finish);

/* The outcome of one request, allocated by kiln_llm_generate together with
 * its arrays and text: free the whole with kiln_llm_result_free. */
typedef struct kiln_llm_result {
    uint32_t struct_size; /* sizeof the library's kiln_llm_result */
    uint32_t abi_version;
    int32_t *prompt_ids;
    size_t n_prompt_ids;
    int32_t *ids; /* generated ids (an EOS that ended it included) */
    size_t n_ids;
    char *text; /* generated text, NUL-terminated */
    size_t text_len;
    kiln_llm_finish finish;
    int32_t reserved;
    double prompt_ms;      /* from the call until the first token was sampled */
    double generate_ms;    /* from the first sampled token to the last */
    double prompt_tok_s;   /* n_prompt_ids / prompt_ms */
    double generate_tok_s; /* (n_ids - 1) / generate_ms; 0 for one token */
    /* finish ERROR: the one-line reason; else NULL. */
    char *error;
    /* n_ids logprobs of the generated ids when the request asked for
     * them; else NULL. */
    float *logprobs;
} kiln_llm_result;

/* Frees a result and everything it holds. NULL is a no-op. */
KILN_API void kiln_llm_result_free(kiln_llm_result *result);

/* Called for every generated token: `request` indexes the array passed to
 * kiln_llm_generate, `text` (len bytes, not NUL-terminated, valid for the
 * call) is the text that became final with it — whole UTF-8 characters
 * only, and possibly empty while a character or a possible stop string is
 * held back. When a request ends, held-back text that turned out not to be
 * a stop string is delivered in one last call with token -1. Returning
 * nonzero ends that request (finish CANCELLED). */
typedef int (*kiln_llm_token_fn)(void *user, int32_t request, int32_t token, const char *text, size_t len);

/* Loads an engine and prepares it for generation (see the top of this
 * file). `registry` is borrowed for the kiln_llm's lifetime; options may be
 * NULL (defaults). Fails naming the missing or bad LLMC/TOKN section, an
 * I/O tensor the engine lacks, or the memory it could not get. */
KILN_API kiln_status kiln_llm_open(kiln_registry *registry, const char *path, const kiln_llm_options *options,
                                   kiln_llm **out);

/* NULL is a no-op. */
KILN_API void kiln_llm_close(kiln_llm *llm);

/* The engine's description; borrowed from the kiln_llm, valid as long as
 * it. */
KILN_API const kiln_llm_info *kiln_llm_info_get(const kiln_llm *llm);

/* Runs n requests to completion, batched together, calling on_token (may be
 * NULL) as tokens are generated. reqs[0..n) point at the requests (each
 * set up with kiln_llm_request_init); results[0..n) receive a result each,
 * allocated by the library (free each with kiln_llm_result_free); on
 * failure no result is stored. Every request is checked before any work
 * starts: one whose prompt plus max_tokens exceeds the engine's max
 * sequence length or the whole KV cache fails the call with
 * KILN_ERROR_LIMIT naming the numbers. The decode step allocates nothing:
 * all memory is taken at open and at the start of the call. */
KILN_API kiln_status kiln_llm_generate(kiln_llm *llm, const kiln_llm_request *const *reqs, int32_t n,
                                       kiln_llm_token_fn on_token, void *user, kiln_llm_result **results);

/* Ends every running request of the current (or next) kiln_llm_generate
 * call at its next step, with finish CANCELLED. Safe from any thread; the
 * flag is cleared when kiln_llm_generate returns. With a scheduler it ends
 * every request the scheduler holds at its next step. */
KILN_API void kiln_llm_cancel(kiln_llm *llm);

/* ---- requests that come and go: the scheduler ------------------------------------ */

/* In-flight batching (docs/scheduling.md). A scheduler owns a kiln_llm
 * from kiln_llm_scheduler_start to kiln_llm_scheduler_stop (no other call
 * may use that llm meanwhile) and runs its steps: each step packs decode
 * tokens and prefill chunks under the engine's per-step token budget
 * (max_tokens) and batch (max_batch); KV blocks are taken as sequences
 * grow; when the cache runs dry the newest running request is preempted
 * (its blocks freed, its work recomputed later) and resumes with exactly
 * the output it would have produced; waiting requests are admitted first
 * come, first served; blocks of a prompt prefix already in the cache are
 * shared (prefix caching).
 *
 * Threads: kiln_llm_submit, kiln_llm_request_cancel and
 * kiln_llm_scheduler_stats may be called from any thread at any time. With
 * options.thread = 1 (default) the scheduler runs its steps on a thread of
 * its own; with 0 the caller drives it with kiln_llm_scheduler_step (one
 * thread at a time). Callbacks run on the stepping thread, between steps;
 * they must not call kiln_llm_scheduler_step or _stop, and should return
 * quickly (every running request waits for them). */
typedef struct kiln_llm_scheduler kiln_llm_scheduler;

typedef struct kiln_llm_scheduler_options {
    uint32_t struct_size;
    uint32_t abi_version;
    /* Requests waiting to be admitted, at most; kiln_llm_submit beyond it
     * fails with KILN_ERROR_LIMIT at once. 0 (default): 4096. */
    int32_t max_queue;
    /* 1 (default): a stepping thread inside the library; 0: the caller
     * calls kiln_llm_scheduler_step. */
    int32_t thread;
    /* Share KV blocks of identical prompt prefixes: 1 (default) or 0. */
    int32_t prefix_caching;
    /* Admission (docs/scheduling.md): KILN_LLM_ADMIT_MAX_UTILIZATION
     * (default) or KILN_LLM_ADMIT_NO_EVICT. */
    int32_t admission;
    /* Running ahead: while a decode step runs, the next one is enqueued
     * with its tokens fed from the running step's sampled ids on the
     * device, so the GPU never waits for the host between steps
     * (docs/scheduling.md). -1 (default): where steps run asynchronously
     * (CUDA engines); 0: never; 1: wherever a step allows it (on the CPU
     * it gains nothing: for tests). */
    int32_t run_ahead;
} kiln_llm_scheduler_options;

/* Admission policies (TensorRT-LLM's capacity scheduler policies). */
enum {
    /* Admit while the blocks of the request's prompt are free: the batch
     * is as large as the cache allows now; a running request that later
     * finds no block preempts the newest one. */
    KILN_LLM_ADMIT_MAX_UTILIZATION = 0,
    /* Admit only while the blocks every running request may still take
     * (up to its max_tokens) and the new request's whole prompt plus
     * max_tokens are free: nothing is ever preempted. */
    KILN_LLM_ADMIT_NO_EVICT = 1,
};

KILN_API void kiln_llm_scheduler_options_init(kiln_llm_scheduler_options *options);

/* One generated token, as the scheduler hands it to a request's on_token.
 * Borrowed for the call. */
typedef struct kiln_llm_token {
    uint32_t struct_size; /* sizeof the library's kiln_llm_token */
    uint32_t abi_version;
    int32_t id;       /* the sampled id; -1 for the last call flushing held-back text */
    int32_t n_top;    /* entries in top_ids/top_logprobs (request's logprobs) */
    const char *text; /* text that became final with it (see kiln_llm_token_fn) */
    size_t len;
    float logprob; /* log-softmax of the sampled id (after penalties, before
                      temperature); NaN unless the request asked for logprobs */
    int32_t reserved;
    const int32_t *top_ids; /* the n_top most likely ids, most likely first */
    const float *top_logprobs;
} kiln_llm_token;

typedef struct kiln_llm_callbacks {
    uint32_t struct_size;
    uint32_t abi_version;
    /* Every generated token but an EOS that ends the request (as
     * kiln_llm_token_fn); returning nonzero cancels the request. May be
     * NULL. */
    int (*on_token)(void *user, const kiln_llm_token *token);
    /* Exactly once per accepted request, when it ends for any reason
     * (finished, cancelled, or failed: then result->finish is
     * KILN_LLM_FINISH_ERROR and result->error says why). The result passes
     * to the callee: free it with kiln_llm_result_free. It is NULL only
     * when the library ran out of memory building it. */
    void (*on_finish)(void *user, kiln_llm_result *result);
    void *user;
} kiln_llm_callbacks;

KILN_API void kiln_llm_callbacks_init(kiln_llm_callbacks *callbacks);

/* Starts scheduling on `llm` (owned by the scheduler until stop). */
KILN_API kiln_status kiln_llm_scheduler_start(kiln_llm *llm, const kiln_llm_scheduler_options *options,
                                              kiln_llm_scheduler **out);

/* Submits a request; it joins the running batch at a step boundary.
 * Everything `req` points at is copied: nothing is borrowed beyond the
 * call. A request that could never run — prompt plus max_tokens past the
 * engine's max_seq_len or the whole KV cache, a bad id, sampling out of
 * range — fails here with KILN_ERROR_LIMIT / KILN_ERROR_INVALID_ARGUMENT
 * naming the numbers, as does a full queue (KILN_ERROR_LIMIT) and a
 * stopping scheduler (KILN_ERROR_CANCELLED); on failure no callback is
 * ever called. On success *id (may be NULL) receives the request's id
 * (unique for the scheduler's life, never 0) and on_finish will be called
 * exactly once. */
KILN_API kiln_status kiln_llm_submit(kiln_llm_scheduler *scheduler, const kiln_llm_request *req,
                                     const kiln_llm_callbacks *callbacks, uint64_t *id);

/* Ends a request at the next step boundary (finish CANCELLED; its KV
 * blocks are freed then). An id that is unknown or already finished is
 * ignored. */
KILN_API void kiln_llm_request_cancel(kiln_llm_scheduler *scheduler, uint64_t id);

/* Runs one step (thread = 0 only): admits, packs, runs, samples, calls
 * the callbacks. *busy (may be NULL) is set to 1 when requests remain
 * running or waiting. Fails only when the engine fails; the requests in
 * that step then end with KILN_LLM_FINISH_ERROR. */
KILN_API kiln_status kiln_llm_scheduler_step(kiln_llm_scheduler *scheduler, int *busy);

typedef struct kiln_llm_scheduler_stats {
    uint32_t struct_size; /* sizeof the library's kiln_llm_scheduler_stats */
    uint32_t abi_version;
    int32_t running;      /* requests with KV blocks */
    int32_t waiting;      /* queued, including preempted ones */
    int32_t blocks_total; /* KV blocks in the cache */
    int32_t blocks_used;  /* held by running requests or cached prefixes in use */
    int32_t blocks_peak;
    int32_t reserved;
    uint64_t steps;
    uint64_t preemptions;
    uint64_t prefix_hit_tokens; /* prompt tokens whose KV was reused */
    uint64_t prompt_tokens;     /* prompt tokens of admitted requests */
    uint64_t generated_tokens;
    uint64_t finished, cancelled, failed;
    uint64_t steps_ahead;  /* steps enqueued before the host had the tokens they continue (run_ahead) */
    uint64_t dropped_rows; /* rows of those steps whose request had ended meanwhile */
    /* Where the stepping time goes (appended 2026-12-04): steps of one
     * token a row (decode) and the others (prompt tokens in them), and the
     * microseconds of each kind: a step's time runs from the later of the
     * previous step's end and its own enqueue to its end, so the host's
     * packing between steps and idle time are in neither. */
    uint64_t decode_steps;
    uint64_t decode_us, prompt_step_us;
} kiln_llm_scheduler_stats;

/* A snapshot taken at the end of the last step (counters since start);
 * the steps, generated tokens and finished / cancelled / failed counts are
 * also updated before each on_finish call, so they count every request
 * whose on_finish has run.
 * Fills the caller's struct as far as its struct_size reaches (set it to
 * sizeof; below 8, the library's whole struct is written) and sets
 * struct_size to what was written. */
KILN_API void kiln_llm_scheduler_stats_get(kiln_llm_scheduler *scheduler, kiln_llm_scheduler_stats *stats);

/* Stops accepting requests, lets running and waiting ones go on for up to
 * drain_seconds (0: none), cancels what remains (each gets its on_finish),
 * joins the thread and frees the scheduler; the llm is the caller's again.
 * NULL is a no-op. */
KILN_API void kiln_llm_scheduler_stop(kiln_llm_scheduler *scheduler, double drain_seconds);

/* ---- tokens and text ------------------------------------------------------------ */

/* Tokenize flags. */
enum {
    KILN_LLM_TOKENIZE_ADD_SPECIAL = 1u << 0,   /* BOS etc. as the tokenizer adds them */
    KILN_LLM_TOKENIZE_PARSE_SPECIAL = 1u << 1, /* "<|im_start|>" in the text is its id */
};

/* *ids malloc'd: free with kiln_free. */
KILN_API kiln_status kiln_llm_tokenize(const kiln_llm *llm, const char *text, size_t len, uint32_t flags, int32_t **ids,
                                       size_t *n_ids);
/* A text prompt's ids exactly as kiln_llm_generate makes them: special
 * tokens parsed, BOS first when the engine's config says prompts start with
 * it. *ids malloc'd: free with kiln_free. */
KILN_API kiln_status kiln_llm_prompt_ids(const kiln_llm *llm, const char *text, size_t len, int32_t **ids,
                                         size_t *n_ids);

/* *text malloc'd, NUL-terminated: free with kiln_free. An id outside the
 * vocabulary fails naming it. */
KILN_API kiln_status kiln_llm_detokenize(const kiln_llm *llm, const int32_t *ids, size_t n_ids, char **text,
                                         size_t *len);

/* One chat turn; role is "system", "user" or "assistant" (any role the
 * engine's own Jinja template accepts, when it has one). Strings borrowed
 * for the call. */
typedef struct kiln_llm_message {
    uint32_t struct_size;
    uint32_t abi_version;
    const char *role;
    const char *content;
} kiln_llm_message;

/* Role and content NULL. */
KILN_API void kiln_llm_message_init(kiln_llm_message *message);

/* Renders a conversation (messages[0..n_messages) point at its turns) with
 * the engine's chat template (the checkpoint's own Jinja template, rendered
 * as transformers' apply_chat_template with add_generation_prompt; else the
 * built-in one) and tokenizes it (special tokens parsed, nothing added
 * beyond what the template writes), ending with the assistant's header so
 * the model answers. Fails with KILN_ERROR_UNSUPPORTED when the engine has
 * no chat template, KILN_ERROR_INVALID_ARGUMENT when the template refuses
 * the conversation (its raise_exception message). *ids malloc'd: free with
 * kiln_free. */
KILN_API kiln_status kiln_llm_chat_tokenize(const kiln_llm *llm, const kiln_llm_message *const *messages,
                                            size_t n_messages, int32_t **ids, size_t *n_ids);

/* ---- teacher forcing and the engine's weights ---------------------------------------- */

/* Receives the f32 logits (vocab_size of them, borrowed for the call) of
 * the token that follows position `position` of a scored sequence. */
typedef void (*kiln_llm_logits_fn)(void *user, size_t position, const float *logits);

/* Runs ids[0..n) through the model as one sequence, teacher-forced, and
 * calls on_logits for every position i = 0 .. n-1, in order, with the
 * logits of the token after ids[0..i] (what perplexity and engine
 * comparisons need). Independent of kiln_llm_generate: the call creates its
 * own execution context of the engine with a KV cache of ceil(n /
 * block_size) blocks (so an llm opened with kv_cache_blocks = 1 scores
 * fine) and frees it before returning. The tokens go in steps of up to
 * max_batch (the step network returns logits for at most max_batch rows:
 * docs/llm.md), each a prefill chunk attending to the cache. n must be in
 * [1, max_seq_len] and every id inside the vocabulary (KILN_ERROR_LIMIT /
 * KILN_ERROR_INVALID_ARGUMENT naming it otherwise). */
KILN_API kiln_status kiln_llm_score(kiln_llm *llm, const int32_t *ids, size_t n, kiln_llm_logits_fn on_logits,
                                    void *user);

/* The engine the llm runs (kiln_engine_backend etc.); borrowed, lives as
 * long as the llm. */
KILN_API const kiln_engine *kiln_llm_engine(const kiln_llm *llm);

/* Bytes of the engine's weights (constants): *total, all of them;
 * *per_token, those a batch-1 decode step reads — all but the tables only
 * a gather reads (an untied embedding, of which a step reads one row per
 * token). The weights' bytes over the memory bandwidth are decode's floor.
 * Either pointer may be NULL. */
KILN_API void kiln_llm_weight_bytes(const kiln_llm *llm, size_t *total, size_t *per_token);

#ifdef __cplusplus
}
#endif

#endif
