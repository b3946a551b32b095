/* The LLM side of `kiln build` (a checkpoint instead of a network JSON) and
 * of `kiln inspect` (the LLMC and TOKN sections). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

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
    "  --backend B           cpu (default) or cuda; a cuda engine builds on a machine\n"
    "                        without a GPU too (its tactics are then heuristic)\n"
    "  --dtype T             f32, f16 or bf16: weights, activations, KV cache; native:\n"
    "                        the GGUF's matmul weights kept as stored (Q4_0, Q4_1, Q5_0,\n"
    "                        Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16; on cuda Q4_0, Q4_1,\n"
    "                        Q8_0 and the K formats, the others expanded), the rest f32\n"
    "                        on the cpu, bf16 on cuda (the default for a .gguf;\n"
    "                        otherwise f32 on the cpu, bf16 on cuda); fp8: decoder\n"
    "                        matmuls in FP8 E4M3 (weights scaled per output channel at\n"
    "                        build, activations per token when run, or static with\n"
    "                        --calibrate; kiln/Fp8MatMul), the rest bf16 on cuda, f32\n"
    "                        on the cpu\n"
    "  --calibrate FILE      with --dtype fp8: static activation scales instead of one a\n"
    "                        token: the model, unquantized, runs over the text's first\n"
    "                        --calibrate-tokens tokens at build, and each FP8 matmul\n"
    "                        input gets its max |x| there / 448 (values beyond saturate)\n"
    "  --calibrate-tokens N  tokens of the calibration text used (default 2048, at most\n"
    "                        --max-seq-len)\n"
    "  --weights W           int8: decoder matmul weights quantized at build to int8,\n"
    "                        a scale per output channel (or per --weights-group\n"
    "                        values); int4: int4 with a scale and zero point per\n"
    "                        --weights-group values (default 128);\n"
    "                        activations stay in --dtype (kiln/WeightOnlyMatMul). AWQ\n"
    "                        and GPTQ checkpoints keep their int4 weights as stored\n"
    "  --weights-group N     values per scale, a multiple of 32 (default: int8 a\n"
    "                        whole row, int4 128)\n"
    "  --quantize-lm-head    --weights applies to the output projection too (default:\n"
    "                        kept in --dtype)\n"
    "  --kv-dtype T          auto (default), f32, f16, bf16 or fp8: the KV cache's type;\n"
    "                        auto is f16 in a native cpu engine (as llama.cpp's cache;\n"
    "                        half the bytes a decode step reads) and --dtype otherwise;\n"
    "                        fp8: E4M3, scale 1, saturating at +-448 (twice f16's\n"
    "                        tokens); on cuda the cache is in --dtype or fp8\n"
    "  --max-batch N         sequences per step (default 8)\n"
    "  --max-seq-len N       tokens per sequence (default min(4096, the model's context))\n"
    "  --max-tokens N        new tokens per step (default max-seq-len)\n"
    "  --block-size N        KV-cache tokens per block (default 16)\n"
    "  --tokenizer FILE      llama2.c tokenizer.bin (for a .bin checkpoint)\n"
    "  --verbose             log what each build pass did\n"
    "  -h, --help            show this help\n";

static const char *const llm_valued[] = {"-o",
                                         "--output",
                                         "--dtype",
                                         "--max-batch",
                                         "--max-seq-len",
                                         "--max-tokens",
                                         "--block-size",
                                         "--tokenizer",
                                         "--plugins",
                                         "--backend",
                                         "--weights",
                                         "--weights-group",
                                         "--kv-dtype",
                                         "--calibrate",
                                         "--calibrate-tokens",
                                         NULL};

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The first positional argument is a directory, a .gguf or a .bin. */
int cli_build_is_checkpoint(int argc, char **argv)
{
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

static void progress_bar(void *user, double fraction, const char *what)
{
    int *drawn = user;
    fraction = fraction < 0 ? 0 : fraction > 1 ? 1 : fraction;
    int filled = (int)(fraction * 30 + 0.5);
    fprintf(stderr, "\r[%.*s%*s] %3d%% %-24.24s", filled, "##############################", 30 - filled, "",
            (int)(fraction * 100 + 0.5), what ? what : "");
    fflush(stderr);
    *drawn = 1;
}

static void log_to_stderr(void *user, kiln_log_level level, const char *message)
{
    static const char *const names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "kiln: %s: %s\n", (unsigned)level < 4 ? names[level] : "log", message);
}

static int parse_i32(const char *opt, const char *val, int32_t *out)
{
    long long v;
    int st = cli_parse_range("build", opt, val, 1, 1LL << 24, &v);
    if (st != CLI_OK)
        return st;
    *out = (int32_t)v;
    return CLI_OK;
}

/* One line on what was built, from the engine's own LLM description. */
static void print_summary(const char *out, kiln_backend backend)
{
    char *text = NULL;
    if (kiln_llm_describe_json(out, &text) != KILN_OK) {
        printf("built %s for %s\n", out, kiln_backend_name(backend));
        return;
    }
    json_t *c = json_loads(text, 0, NULL);
    kiln_free(text);
    const char *quantized = json_string_value(json_object_get(c, "quantized_weights"));
    const char *ct = json_string_value(json_object_get(c, "chat_template"));
    const long long calib = cli_json_int(c, "calibration_tokens");
    struct stat sb;
    long long bytes = stat(out, &sb) == 0 ? (long long)sb.st_size : -1;
    char scales[96] = "";
    if (calib > 0)
        snprintf(scales, sizeof scales, " (activation scales from %lld calibration tokens)", calib);
    printf(
        "built %s for %s: %s, %lld layers, hidden %lld, %lld/%lld heads, vocab %lld, %s%s%s%s, max %lld tokens x %lld "
        "sequences, chat template %s, %lld bytes\n",
        out, kiln_backend_name(backend), cli_json_str(c, "architecture"), cli_json_int(c, "n_layers"),
        cli_json_int(c, "hidden_size"), cli_json_int(c, "n_heads"), cli_json_int(c, "n_kv_heads"),
        cli_json_int(c, "vocab_size"), cli_json_str(c, "dtype"), quantized ? " with matmul weights " : "",
        quantized ? quantized : "", scales, cli_json_int(c, "max_seq_len"), cli_json_int(c, "max_batch"),
        ct ? ct : "none", bytes);
    json_decref(c);
}

int cli_build_llm(int argc, char **argv)
{
    cli_args a;
    cli_args_init(&a, "build", argc, argv);
    kiln_llm_build_options opt;
    kiln_llm_build_options_init(&opt);
    const char *out = NULL, *o, *val;
    int status = CLI_OK, verbose = 0, float_given = 0;
    while ((o = cli_args_next(&a, llm_valued, &val))) {
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(build_llm_help, stdout);
            goto done;
        } else if (!strcmp(o, "-o") || !strcmp(o, "--output")) {
            out = val;
        } else if (!strcmp(o, "--dtype")) {
            opt.native = !strcmp(val, "native");
            float_given = !opt.native && strcmp(val, "fp8") != 0;
            if (opt.native)
                opt.dtype = KILN_DTYPE_F32;
            else if (!strcmp(val, "fp8"))
                opt.weights = KILN_LLM_WEIGHTS_FP8;
            else if (!strcmp(val, "f32"))
                opt.dtype = KILN_DTYPE_F32;
            else if (!strcmp(val, "f16"))
                opt.dtype = KILN_DTYPE_F16;
            else if (!strcmp(val, "bf16"))
                opt.dtype = KILN_DTYPE_BF16;
            else {
                status = cli_usage("build", "unknown --dtype \"%s\" (native, f32, f16, bf16 or fp8)", val);
                goto done;
            }
        } else if (!strcmp(o, "--weights")) {
            if (!strcmp(val, "int8"))
                opt.weights = KILN_LLM_WEIGHTS_INT8;
            else if (!strcmp(val, "int4"))
                opt.weights = KILN_LLM_WEIGHTS_INT4;
            else if (!strcmp(val, "dtype"))
                opt.weights = KILN_LLM_WEIGHTS_DTYPE;
            else {
                status = cli_usage("build", "unknown --weights \"%s\" (int8, int4 or dtype)", val);
                goto done;
            }
        } else if (!strcmp(o, "--kv-dtype")) {
            static const char *const kv_names[] = {"auto", "f32", "f16", "bf16", "fp8"};
            int k = 0;
            while (k < 5 && strcmp(val, kv_names[k]) != 0)
                k++;
            if (k == 5) {
                status = cli_usage("build", "unknown --kv-dtype \"%s\" (auto, f32, f16, bf16 or fp8)", val);
                goto done;
            }
            opt.kv_cache = k; /* KILN_LLM_KV_AUTO, _F32, _F16, _BF16, _FP8 in this order */
        } else if (!strcmp(o, "--weights-group")) {
            if ((status = parse_i32(o, val, &opt.weights_group)) != CLI_OK)
                goto done;
        } else if (!strcmp(o, "--calibrate")) {
            opt.calibrate = val;
        } else if (!strcmp(o, "--calibrate-tokens")) {
            if ((status = parse_i32(o, val, &opt.calibrate_tokens)) != CLI_OK)
                goto done;
        } else if (!strcmp(o, "--quantize-lm-head")) {
            opt.weights_lm_head = 1;
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
            opt.tokenizer = val;
        } else if (!strcmp(o, "--backend")) {
            if (!strcmp(val, "cpu"))
                opt.backend = KILN_BACKEND_CPU;
            else if (!strcmp(val, "cuda"))
                opt.backend = KILN_BACKEND_CUDA;
            else {
                status = cli_usage("build", "unknown --backend \"%s\" (cpu or cuda)", val);
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
    if (opt.calibrate && opt.weights != KILN_LLM_WEIGHTS_FP8) {
        status = cli_usage("build", "--calibrate sets static scales for FP8 activations: it needs --dtype fp8");
        goto done;
    }
    if (ends_with(src, ".bin") && !opt.tokenizer) {
        status = cli_usage("build", "a llama2.c checkpoint needs --tokenizer tokenizer.bin");
        goto done;
    }
    /* On the GPU the weights, activations and KV cache default to bf16
     * (f32 accumulation and statistics inside the kernels), also beside
     * quantized GGUF weights. */
    if (opt.backend == KILN_BACKEND_CUDA && !float_given)
        opt.dtype = KILN_DTYPE_BF16;
    if (verbose)
        kiln_set_log(log_to_stderr, NULL, KILN_LOG_INFO);
    int drawn = 0;
    if (isatty(STDERR_FILENO) && !verbose) {
        opt.progress = progress_bar;
        opt.progress_user = &drawn;
    }
    kiln_status s = kiln_llm_build(src, &opt, out);
    if (drawn)
        fputc('\n', stderr);
    if (s != KILN_OK)
        status = cli_kiln_error();
    else
        print_summary(out, opt.backend);
done:
    cli_args_free(&a);
    return status;
}

/* ---- inspect ------------------------------------------------------------ */

void cli_inspect_llm(const char *path, json_t *root, int as_json)
{
    char *text = NULL;
    if (kiln_llm_describe_json(path, &text) != KILN_OK)
        return;
    json_t *c = json_loads(text, 0, NULL);
    kiln_free(text);
    if (!c)
        return;
    if (as_json) {
        json_object_set_new(root, "llm", c);
        return;
    }
    json_t *err = json_object_get(c, "error");
    if (err) {
        printf("LLM engine: LLMC section does not parse: %s\n", json_string_value(err));
    } else {
        json_t *rope = json_object_get(c, "rope");
        const char *quantized = json_string_value(json_object_get(c, "quantized_weights"));
        const char *ct = json_string_value(json_object_get(c, "chat_template"));
        printf("LLM engine: %s from %s\n", cli_json_str(c, "architecture"), cli_json_str(c, "source"));
        printf("  %lld layers, hidden %lld, intermediate %lld, %lld heads / %lld kv heads x %lld, vocab %lld, %s "
               "embeddings\n",
               cli_json_int(c, "n_layers"), cli_json_int(c, "hidden_size"), cli_json_int(c, "intermediate_size"),
               cli_json_int(c, "n_heads"), cli_json_int(c, "n_kv_heads"), cli_json_int(c, "head_dim"),
               cli_json_int(c, "vocab_size"), json_is_true(json_object_get(c, "tied_embeddings")) ? "tied" : "untied");
        printf("  rms_norm_eps %g, rope theta %g scaling %s%s, qkv bias %s, dtype %s%s%s\n",
               json_number_value(json_object_get(c, "rms_norm_eps")), json_number_value(json_object_get(rope, "theta")),
               cli_json_str(rope, "scaling"),
               json_is_true(json_object_get(rope, "interleaved")) ? " (interleaved)" : "",
               json_is_true(json_object_get(c, "qkv_bias")) ? "yes" : "no", cli_json_str(c, "dtype"),
               quantized ? ", matmul weights " : "", quantized ? quantized : "");
        printf("  limits: %lld tokens per sequence, %lld sequences, %lld tokens per step, KV block %lld\n",
               cli_json_int(c, "max_seq_len"), cli_json_int(c, "max_batch"), cli_json_int(c, "max_tokens"),
               cli_json_int(c, "block_size"));
        json_t *bos = json_object_get(c, "bos_id"), *eos = json_object_get(c, "eos_ids");
        printf("  special tokens: bos %lld%s, eos", json_is_integer(bos) ? (long long)json_integer_value(bos) : -1LL,
               json_is_true(json_object_get(c, "add_bos")) ? " (added)" : "");
        for (size_t i = 0; i < json_array_size(eos); i++)
            printf(" %lld", (long long)json_integer_value(json_array_get(eos, i)));
        printf("%s; chat template %s\n", json_array_size(eos) ? "" : " none", ct ? ct : "none");
    }
    json_t *tok = json_object_get(c, "tokenizer");
    json_t *e = json_object_get(tok, "error");
    if (e)
        printf("  tokenizer: does not load: %s\n", json_string_value(e));
    else if (tok)
        printf("  tokenizer: %s, %lld tokens, bos %lld, eos %lld\n", cli_json_str(tok, "kind"),
               cli_json_int(tok, "vocab_size"), cli_json_int(tok, "bos"), cli_json_int(tok, "eos"));
    json_decref(c);
}
