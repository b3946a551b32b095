/* Static activation scales for an FP8 build (kiln_llm_calibrate, model.h;
 * `kiln build --dtype fp8 --calibrate FILE`, docs/llm.md).
 *
 * The model is built a second time, unquantized and unfused, as a
 * calibration engine whose extra outputs are each FP8 matmul input's max
 * |x| a token (model.c, probe); the text's first tokens run through it
 * teacher-forced (score.c), and each input's largest value becomes its
 * static max. The unquantized model is the reference the scales are taken
 * from (as calibration tools for FP8 do): the FP8 engine's own
 * activations differ from it by its rounding, and values beyond a max
 * saturate. */
#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "llm/llm_internal.h"
#include "llm/model.h"

/* The file's bytes, NUL-terminated. */
static kiln_status read_text(const char *path, char **text, size_t *len)
{
    FILE *f = NULL;
    size_t size = 0;
    KILN_TRY(kiln_file_fopen_read(path, &f, &size));
    char *t = malloc(size + 1);
    size_t got = t ? fread(t, 1, size, f) : 0;
    fclose(f);
    if (!t)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory reading %s", path);
    if (got != size) {
        free(t);
        return kiln_fail(KILN_ERROR_IO, "%s: short read", path);
    }
    t[size] = '\0';
    *text = t;
    *len = size;
    return KILN_OK;
}

/* Tokenizes the text, runs its first tokens through the calibration
 * engine at `path` and fills amax. */
static kiln_status run_probes(kiln_registry *reg, const char *path, const char *text, size_t len, int32_t want,
                              int32_t n_sites, float *amax, int32_t *n_tokens)
{
    kiln_llm_options lo;
    kiln_llm_options_init(&lo);
    /* kiln_llm_score makes its own cache of the text's blocks: the llm's
     * own (on a GPU, 0.9 of the free memory by default) would only take
     * time to allocate and memory from whatever else runs there */
    lo.kv_cache_blocks = 1;
    lo.no_cuda_graphs = 1;
    kiln_llm *llm = NULL;
    KILN_TRY(kiln_llm_open(reg, path, &lo, &llm));
    int32_t *ids = NULL;
    size_t n = 0;
    kiln_status st = kiln_llm_tokenize(llm, text, len, KILN_LLM_TOKENIZE_ADD_SPECIAL, &ids, &n);
    const kiln_llm_info *info = kiln_llm_info_get(llm);
    size_t cap = (size_t)want;
    if (info && (size_t)info->max_seq_len < cap)
        cap = (size_t)info->max_seq_len;
    if (st == KILN_OK && n < 2)
        st = kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "the calibration text has %zu tokens; it needs some text", n);
    if (st == KILN_OK) {
        n = n < cap ? n : cap;
        st = kiln_llm_score_probe(llm, ids, n, n_sites, amax);
        *n_tokens = (int32_t)n;
    }
    kiln_free(ids);
    kiln_llm_close(llm);
    return st;
}

/* Rows a step of the calibration engine: 256, or fewer where the text,
 * max_tokens or the engine's limits on KV blocks and logits
 * (kiln_llm_build_network's checks) allow fewer. */
static int32_t calibration_batch(const kiln_llm_checkpoint *ck, const kiln_llm_build_options *o)
{
    int64_t b = 256;
    if (o->calibrate_tokens > 0 && o->calibrate_tokens < b)
        b = o->calibrate_tokens;
    if (o->max_tokens > 0 && o->max_tokens < b)
        b = o->max_tokens;
    if (o->max_seq_len > 0 && o->block_size > 0) {
        int64_t per_seq = ((int64_t)o->max_seq_len + o->block_size - 1) / o->block_size;
        if (per_seq > 0 && KILN_LLM_MAX_KV_BLOCKS / per_seq < b)
            b = KILN_LLM_MAX_KV_BLOCKS / per_seq;
    }
    if (ck->config.vocab_size > 0 && KILN_LLM_MAX_LOGITS / ck->config.vocab_size < b)
        b = KILN_LLM_MAX_LOGITS / ck->config.vocab_size;
    return b < 1 ? 1 : (int32_t)b;
}

kiln_status kiln_llm_calibrate(kiln_llm_checkpoint *ck, const kiln_llm_build_options *o, const char *output,
                               int32_t *n_tokens)
{
    if (o->weights != KILN_LLM_WEIGHTS_FP8)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "LLM build: a calibration text sets static scales for FP8 activations: build with --dtype "
                         "fp8 (weights fp8)");
    if (o->calibrate_tokens < 2)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "LLM build: calibrate_tokens %d must be at least 2",
                         o->calibrate_tokens);
    char *text = NULL;
    size_t len = 0;
    kiln_status rs = read_text(o->calibrate, &text, &len);
    if (rs != KILN_OK)
        return kiln_fail_context(rs, "LLM build: the calibration text");
    const int32_t n_sites = ck->config.n_layers * KILN_LLM_CALIB_SITES;
    float *amax = calloc((size_t)n_sites, sizeof *amax);
    size_t plen = strlen(output) + 8;
    char *path = malloc(plen);
    kiln_registry *reg = NULL;
    kiln_status st = amax && path ? kiln_registry_create(&reg)
                                  : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for the calibration");
    if (st == KILN_OK) {
        snprintf(path, plen, "%s.calib", output);
        /* the model as it is: weights and KV cache in the dtype, the
         * progress bar's first half (the engine's build). Scoring runs the
         * text in steps of max_batch tokens (the rows the step returns
         * logits for), so the calibration engine takes up to 256 a step
         * (one token a step made an 8B model's f32 fallback on the CPU
         * read its 32 GB of weights for every token), within the
         * engine's limits on KV blocks and logits. */
        kiln_llm_build_options po = *o;
        po.weights = KILN_LLM_WEIGHTS_DTYPE;
        po.weights_lm_head = 0;
        po.kv_cache = KILN_LLM_KV_AUTO;
        po.max_batch = calibration_batch(ck, o);
        po.calibrate = NULL;
        for (int attempt = 0; attempt < 2; attempt++) {
            if (o->progress)
                o->progress(o->progress_user, 0.0, "building the calibration engine");
            ck->probe = 1;
            st = kiln_llm_build_engine_file(ck, &po, reg, NULL, path);
            ck->probe = 0;
            if (st == KILN_OK) {
                if (o->progress)
                    o->progress(o->progress_user, 0.0, "calibrating on the text");
                st = run_probes(reg, path, text, len, o->calibrate_tokens, n_sites, amax, n_tokens);
            }
            unlink(path);
            /* an engine for a GPU this machine lacks (a build for another
             * machine): the unquantized model runs on the CPU instead */
            if (st != KILN_ERROR_TARGET || po.backend == KILN_BACKEND_CPU)
                break;
            kiln_log(KILN_LOG_WARNING, "LLM build: no %s device here to calibrate on: the model runs on the CPU (f32)",
                     kiln_backend_name(po.backend));
            po.backend = KILN_BACKEND_CPU;
            po.dtype = KILN_DTYPE_F32;
        }
    }
    for (int32_t l = 0; st == KILN_OK && l < ck->config.n_layers; l++) {
        const float *a = amax + (size_t)l * KILN_LLM_CALIB_SITES;
        kiln_log(KILN_LOG_INFO, "LLM build: layer %d, static max |x| of qkv %.9g, o %.9g, gate_up %.9g, down %.9g",
                 (int)l, (double)a[KILN_LLM_CALIB_QKV], (double)a[KILN_LLM_CALIB_O], (double)a[KILN_LLM_CALIB_GATE_UP],
                 (double)a[KILN_LLM_CALIB_DOWN]);
    }
    if (st == KILN_OK) {
        free(ck->act_amax);
        ck->act_amax = amax;
        amax = NULL;
    } else {
        st = kiln_fail_context(st, "LLM build: calibrating on %s", o->calibrate);
    }
    kiln_registry_destroy(reg);
    free(path);
    free(amax);
    free(text);
    return st;
}
