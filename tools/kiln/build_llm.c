/* The LLM side of `kiln build` (a checkpoint instead of a network JSON) and
 * of `kiln inspect` (the LLMC and TOKN sections). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "llm/model.h"

int cli_build_is_checkpoint(int argc, char **argv);
int cli_build_llm(int argc, char **argv);
void cli_inspect_llm(const char *path, json_t *root, int as_json);

static const char build_llm_help[] =
    "usage: kiln build CHECKPOINT -o OUT.engine [options]\n"
    "\n"
    "Builds an LLM engine from a checkpoint: a Hugging Face model directory\n"
    "(config.json, safetensors, tokenizer.json), a .gguf file, or a llama2.c\n"
    ".bin with --tokenizer. The engine holds the weights, the tokenizer, the\n"
    "chat template and the special tokens (docs/llm.md).\n"
    "\n"
    "options:\n"
    "  -o, --output FILE     engine file to write (required)\n"
    "  --dtype T             f32, f16 or bf16: weights, activations, KV cache; native: f32,\n"
    "                        with the GGUF's Q8_0/Q4_0/Q4_1 matmul weights kept quantized\n"
    "                        (the default for a .gguf; f32 otherwise)\n"
    "  --max-batch N         sequences per step (default 8)\n"
    "  --max-seq-len N       tokens per sequence (default min(4096, the model's context))\n"
    "  --max-tokens N        new tokens per step (default max-seq-len)\n"
    "  --block-size N        KV-cache tokens per block (default 16)\n"
    "  --tokenizer FILE      llama2.c tokenizer.bin (for a .bin checkpoint)\n"
    "  --verbose             log what each build pass did\n"
    "  -h, --help            show this help\n";

static const char *const llm_valued[] = {"-o",          "--output",     "--dtype",     "--max-batch", "--max-seq-len",
                                         "--max-tokens", "--block-size", "--tokenizer", "--plugins",   "--backend",
                                         NULL};

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The first positional argument is a directory, a .gguf or a .bin. */
int cli_build_is_checkpoint(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] == '-') {
            int takes_value = 0;
            for (int k = 0; llm_valued[k]; k++)
                takes_value |= strcmp(a, llm_valued[k]) == 0;
            i += takes_value;
            continue;
        }
        struct stat sb;
        return (stat(a, &sb) == 0 && S_ISDIR(sb.st_mode)) || ends_with(a, ".gguf") || ends_with(a, ".bin");
    }
    return 0;
}

static void progress_bar(void *user, double fraction, const char *what) {
    int *drawn = user;
    fraction = fraction < 0 ? 0 : fraction > 1 ? 1 : fraction;
    int filled = (int)(fraction * 30 + 0.5);
    fprintf(stderr, "\r[%.*s%*s] %3d%% %-24.24s", filled, "##############################", 30 - filled, "",
            (int)(fraction * 100 + 0.5), what ? what : "");
    fflush(stderr);
    *drawn = 1;
}

static void log_to_stderr(void *user, kiln_log_level level, const char *message) {
    static const char *const names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "kiln: %s: %s\n", (unsigned)level < 4 ? names[level] : "log", message);
}

static int parse_i32(const char *opt, const char *val, int32_t *out) {
    long long v;
    int st = cli_parse_range("build", opt, val, 1, 1LL << 24, &v);
    if (st != CLI_OK)
        return st;
    *out = (int32_t)v;
    return CLI_OK;
}

int cli_build_llm(int argc, char **argv) {
    cli_args a;
    cli_args_init(&a, "build", argc, argv);
    kiln_llm_build_options opt;
    kiln_llm_build_options_init(&opt);
    const char *out = NULL, *tokenizer = NULL, *o, *val;
    int status = CLI_OK, verbose = 0, dtype_given = 0;
    while ((o = cli_args_next(&a, llm_valued, &val))) {
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(build_llm_help, stdout);
            goto done;
        } else if (!strcmp(o, "-o") || !strcmp(o, "--output")) {
            out = val;
        } else if (!strcmp(o, "--dtype")) {
            dtype_given = 1;
            opt.native = !strcmp(val, "native");
            if (opt.native)
                opt.dtype = KILN_DTYPE_F32;
            else if (!strcmp(val, "f32"))
                opt.dtype = KILN_DTYPE_F32;
            else if (!strcmp(val, "f16"))
                opt.dtype = KILN_DTYPE_F16;
            else if (!strcmp(val, "bf16"))
                opt.dtype = KILN_DTYPE_BF16;
            else {
                status = cli_usage("build", "unknown --dtype \"%s\" (native, f32, f16 or bf16)", val);
                goto done;
            }
        } else if (!strcmp(o, "--max-batch")) {
            if ((status = parse_i32(o, val, &opt.max_batch)) != CLI_OK)
                goto done;
        } else if (!strcmp(o, "--max-seq-len")) {
            if ((status = parse_i32(o, val, &opt.max_seq_len)) != CLI_OK)
                goto done;
        } else if (!strcmp(o, "--max-tokens")) {
            if ((status = parse_i32(o, val, &opt.max_tokens)) != CLI_OK)
                goto done;
        } else if (!strcmp(o, "--block-size")) {
            if ((status = parse_i32(o, val, &opt.block_size)) != CLI_OK)
                goto done;
        } else if (!strcmp(o, "--tokenizer")) {
            tokenizer = val;
        } else if (!strcmp(o, "--backend")) {
            if (strcmp(val, "cpu") != 0) {
                status = cli_usage("build", "LLM engines are built for --backend cpu only");
                goto done;
            }
        } else if (!strcmp(o, "--verbose")) {
            verbose = 1;
        } else {
            status = cli_usage("build", "unknown option %s for a checkpoint", o);
            goto done;
        }
    }
    if (a.status) {
        status = a.status;
        goto done;
    }
    if (a.n_positional != 1) {
        status = cli_usage("build", "expected one checkpoint");
        goto done;
    }
    if (!out) {
        status = cli_usage("build", "missing -o OUT.engine");
        goto done;
    }
    if ((status = cli_check_output("build", out)) != CLI_OK)
        goto done;
    const char *src = a.positional[0];
    if (ends_with(src, ".bin") && !tokenizer) {
        status = cli_usage("build", "a llama2.c checkpoint needs --tokenizer tokenizer.bin");
        goto done;
    }
    if (verbose)
        kiln_set_log(log_to_stderr, NULL, KILN_LOG_INFO);
    int drawn = 0;
    if (isatty(STDERR_FILENO) && !verbose) {
        opt.progress = progress_bar;
        opt.progress_user = &drawn;
    }
    kiln_llm_checkpoint *ck = NULL;
    kiln_status s;
    struct stat sb;
    if (stat(src, &sb) == 0 && S_ISDIR(sb.st_mode))
        s = kiln_llm_import_hf(src, &ck);
    else if (ends_with(src, ".gguf")) {
        s = kiln_llm_import_gguf(src, &ck);
        opt.native |= !dtype_given;
    }
    else
        s = kiln_llm_import_llama2c(src, tokenizer, &ck);
    if (s != KILN_OK) {
        status = cli_kiln_error();
        goto done;
    }
    kiln_registry *reg = NULL;
    if ((status = cli_registry(NULL, 0, &reg)) != CLI_OK) {
        kiln_llm_checkpoint_free(ck);
        goto done;
    }
    kiln_buffer buf = {0};
    s = kiln_llm_build_engine(ck, &opt, reg, NULL, &buf);
    if (drawn)
        fputc('\n', stderr);
    if (s == KILN_OK) {
        if (kiln_buffer_write_file(&buf, out) != KILN_OK) {
            status = cli_kiln_error();
        } else {
            const kiln_llm_config *c = &ck->config;
            const char *ct = kiln_llm_chat_template_name(c->chat_template);
            printf("built %s: %s, %d layers, hidden %d, %d/%d heads, vocab %d, %s%s%s, max %d tokens x %d "
                   "sequences, chat template %s, %zu bytes\n",
                   out, c->architecture, c->n_layers, c->hidden_size, c->n_heads, c->n_kv_heads, c->vocab_size,
                   c->dtype == KILN_DTYPE_F32 ? "f32" : c->dtype == KILN_DTYPE_F16 ? "f16" : "bf16",
                   c->quantized[0] ? " with matmul weights " : "", c->quantized, c->max_seq_len,
                   c->max_batch, ct ? ct : "none", buf.size);
        }
    } else {
        status = cli_kiln_error();
    }
    kiln_buffer_free(&buf);
    kiln_registry_destroy(reg);
    kiln_llm_checkpoint_free(ck);
done:
    cli_args_free(&a);
    return status;
}

/* ---- inspect ------------------------------------------------------------ */

/* kind, vocabulary size, BOS and EOS of a TOKN section. */
static json_t *tokenizer_summary(const void *data, size_t size) {
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_deserialize(data, size, &tok) != KILN_OK)
        return json_pack("{s:s}", "error", kiln_last_error());
    const char *kind = "unknown";
    const char *body = memchr(data, '\n', size);
    if (size > 22 && memcmp((const char *)data + 17, "vocab", 5) == 0 && body) {
        json_t *v = json_loadb(body + 1, size - (size_t)(body + 1 - (const char *)data), 0, NULL);
        const char *k = json_string_value(json_object_get(v, "kind"));
        kind = k && !strcmp(k, "spm") ? "spm" : k ? "byte_bpe" : kind;
        json_decref(v);
    } else if (body) {
        /* tokenizer.json: byte fallback marks the SentencePiece style */
        kind = memmem(body, size - (size_t)(body - (const char *)data), "\"byte_fallback\": true", 21) ||
                       memmem(body, size - (size_t)(body - (const char *)data), "\"byte_fallback\":true", 20)
                   ? "spm (tokenizer.json)"
                   : "byte_bpe (tokenizer.json)";
    }
    json_t *o = json_pack("{s:s,s:i,s:i,s:i}", "kind", kind, "vocab_size", (json_int_t)kiln_tokenizer_vocab_size(tok),
                          "bos", (json_int_t)kiln_tokenizer_bos_id(tok), "eos", (json_int_t)kiln_tokenizer_eos_id(tok));
    kiln_tokenizer_free(tok);
    return o;
}

void cli_inspect_llm(const char *path, json_t *root, int as_json) {
    cli_engine_image img = {0};
    if (cli_engine_map(path, &img) != KILN_OK)
        return;
    json_t *llm = NULL, *tok = NULL;
    for (int32_t i = 0; i < img.graph.n_sections; i++) {
        const kiln_section_rec *s = &img.graph.sections[i];
        if (s->id == KILN_LLM_SECTION_CONFIG) {
            llm = json_loadb(s->data, s->size, 0, NULL);
            if (!llm)
                llm = json_pack("{s:s}", "error", "LLMC section is not valid JSON");
        } else if (s->id == KILN_LLM_SECTION_TOKENIZER) {
            tok = tokenizer_summary(s->data, s->size);
        }
    }
    cli_engine_unmap(&img);
    if (!llm) {
        json_decref(tok);
        return;
    }
    if (tok)
        json_object_set_new(llm, "tokenizer", tok);
    if (as_json) {
        json_object_set_new(root, "llm", llm);
        return;
    }
    kiln_llm_config c;
    char *text = json_dumps(llm, JSON_COMPACT);
    if (text && kiln_llm_config_from_json(text, strlen(text), &c) == KILN_OK) {
        const char *ct = kiln_llm_chat_template_name(c.chat_template);
        printf("LLM engine: %s from %s\n", c.architecture, c.source);
        printf("  %d layers, hidden %d, intermediate %d, %d heads / %d kv heads x %d, vocab %d, %s embeddings\n",
               c.n_layers, c.hidden_size, c.intermediate_size, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size,
               c.tied_embeddings ? "tied" : "untied");
        printf("  rms_norm_eps %g, rope theta %g scaling %s%s, qkv bias %s, dtype %s%s%s\n", c.rms_norm_eps,
               c.rope.theta,
               c.rope.scaling == KILN_LLM_ROPE_LLAMA3 ? "llama3" : c.rope.scaling == KILN_LLM_ROPE_LINEAR ? "linear"
                                                                                                   : "none",
               c.rope.interleaved ? " (interleaved)" : "", c.qkv_bias ? "yes" : "no",
               c.dtype == KILN_DTYPE_F32 ? "f32" : c.dtype == KILN_DTYPE_F16 ? "f16" : "bf16",
               c.quantized[0] ? ", matmul weights " : "", c.quantized);
        printf("  limits: %d tokens per sequence, %d sequences, %d tokens per step, KV block %d\n", c.max_seq_len,
               c.max_batch, c.max_tokens, c.block_size);
        printf("  special tokens: bos %d%s, eos", c.bos_id, c.add_bos ? " (added)" : "");
        for (int32_t i = 0; i < c.n_eos; i++)
            printf(" %d", c.eos_ids[i]);
        printf("%s; chat template %s\n", c.n_eos ? "" : " none", ct ? ct : "none");
    } else {
        printf("LLM engine: LLMC section does not parse: %s\n", text ? kiln_last_error() : "out of memory");
    }
    free(text);
    if (tok) {
        json_t *e = json_object_get(tok, "error");
        if (e)
            printf("  tokenizer: does not load: %s\n", json_string_value(e));
        else
            printf("  tokenizer: %s, %lld tokens, bos %lld, eos %lld\n", json_string_value(json_object_get(tok, "kind")),
                   (long long)json_integer_value(json_object_get(tok, "vocab_size")),
                   (long long)json_integer_value(json_object_get(tok, "bos")),
                   (long long)json_integer_value(json_object_get(tok, "eos")));
    }
    json_decref(llm);
}
