/* kiln perplexity ENGINE TEXTFILE: teacher-forced perplexity over a text in
 * windows (like llama-perplexity), and with --compare a second engine's
 * agreement with the first: argmax agreement and mean KL divergence.
 * Scoring is kiln_llm_score (include/kiln/llm.h). */
#include <errno.h>
#include <jansson.h>
#include <kiln/kiln.h>
#include <kiln/llm.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_llm.h"

static const char perplexity_help[] =
    "usage: kiln perplexity ENGINE TEXTFILE [options]\n"
    "\n"
    "Tokenizes the text (BOS first when the engine's prompts start with it) and\n"
    "cuts it into windows of N tokens, each starting with BOS again; within a\n"
    "window every token is predicted from the tokens before it (teacher\n"
    "forcing; nothing carries over between windows). Prints the perplexity,\n"
    "exp(mean negative log-likelihood) over every predicted token.\n"
    "A step scores as many tokens as the engine has sequences (its step returns\n"
    "that many rows of logits): an engine built with a larger --max-batch, e.g.\n"
    "64, scores a text in fewer steps, the same up to the order of its sums\n"
    "(where activations are quantized, as in a native GGUF engine, that moves\n"
    "perplexity by tenths of a percent: compare engines built alike).\n"
    "\n"
    "options:\n"
    "  --window N               tokens per window (default 512, at most the engine's\n"
    "                           max sequence length)\n"
    "  --compare ENGINE2        score the same windows with ENGINE2 too (the reference)\n"
    "                           and report its perplexity, the fraction of positions\n"
    "                           where both engines' argmax agree, and the mean KL\n"
    "                           divergence KL(ENGINE2 || ENGINE) in nats\n"
    "  --ids                    TEXTFILE holds token ids instead of text: one sequence\n"
    "                           per line (numbers separated by spaces or commas, brackets\n"
    "                           ignored), each scored on its own, as given (no BOS added)\n"
    "  --logits FILE            write ENGINE's logits at every position of every window,\n"
    "                           in order: f32 little-endian rows of vocab_size values\n"
    "  --threads N              CPU: threads that run a step (default: one per physical core)\n"
    "  --plugins LIB            load a plugin library first (repeatable)\n"
    "  --json                   print one JSON object\n"
    "  -h, --help               show this help\n";

/* ---- the sequences --------------------------------------------------------------------- */

typedef struct seq_list {
    int32_t **ids;
    size_t *n;
    size_t count;
} seq_list;

static void seq_list_free(seq_list *l)
{
    for (size_t i = 0; i < l->count; i++)
        free(l->ids[i]);
    free(l->ids);
    free(l->n);
    memset(l, 0, sizeof *l);
}

static int seq_list_add(seq_list *l, int32_t *ids, size_t n)
{
    int32_t **a = realloc(l->ids, sizeof *a * (l->count + 1));
    if (a)
        l->ids = a;
    size_t *b = a ? realloc(l->n, sizeof *b * (l->count + 1)) : NULL;
    if (b)
        l->n = b;
    if (!a || !b) {
        free(ids);
        return cli_error("out of memory");
    }
    l->ids[l->count] = ids;
    l->n[l->count++] = n;
    return CLI_OK;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_error("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *grown = cap < ((size_t)1 << 30) ? realloc(buf, cap * 2 + 1) : NULL;
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        cli_error(bad ? "cannot read %s" : "%s is too large (1 GiB at most) or memory ran out", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* --ids: one sequence of ids per line. */
static int parse_id_lines(const char *path, const char *text, int32_t vocab, seq_list *out)
{
    const char *p = text;
    for (int line = 1; *p; line++) {
        const char *end = strchr(p, '\n');
        if (!end)
            end = p + strlen(p);
        int32_t *ids = malloc(sizeof *ids * ((size_t)(end - p) / 2 + 1));
        size_t n = 0;
        if (!ids)
            return cli_error("out of memory");
        while (p < end) {
            if (strchr(" \t\r,[]", *p)) {
                p++;
                continue;
            }
            char *stop;
            long v = strtol(p, &stop, 10);
            if (stop == p || stop > end || v < 0 || v >= vocab) {
                free(ids);
                return cli_error("%s line %d: \"%.*s\" is not a token id in [0, %d)", path, line,
                                 (int)(strcspn(p, " \t\r\n,[]") < 40 ? strcspn(p, " \t\r\n,[]") : 40), p, (int)vocab);
            }
            ids[n++] = (int32_t)v;
            p = stop;
        }
        int st = n ? seq_list_add(out, ids, n) : (free(ids), CLI_OK);
        if (st != CLI_OK)
            return st;
        p = *end ? end + 1 : end;
    }
    if (out->count == 0)
        return cli_error("%s holds no token ids", path);
    return CLI_OK;
}

/* A text's ids as windows of at most `window` tokens, each led by BOS when
 * the engine's prompts start with it. */
static int text_windows(const kiln_llm *llm, const char *path, const char *text, size_t len, size_t window,
                        seq_list *out)
{
    const kiln_llm_info *info = kiln_llm_info_get(llm);
    int32_t *ids = NULL;
    size_t n = 0;
    if (kiln_llm_prompt_ids(llm, text, len, &ids, &n) != KILN_OK)
        return cli_kiln_error();
    int bos = info->bos_id >= 0 && n > 0 && ids[0] == info->bos_id;
    size_t body = window - (size_t)bos;
    int st = CLI_OK;
    for (size_t at = (size_t)bos; st == CLI_OK && at < n; at += body) {
        size_t take = n - at < body ? n - at : body;
        if (take + (size_t)bos < 2)
            break;
        int32_t *w = malloc(sizeof *w * (take + 1));
        if (!w) {
            st = cli_error("out of memory");
            break;
        }
        if (bos)
            w[0] = info->bos_id;
        memcpy(w + bos, ids + at, sizeof *w * take);
        st = seq_list_add(out, w, take + (size_t)bos);
    }
    kiln_free(ids);
    if (st == CLI_OK && out->count == 0)
        st = cli_error("%s has fewer than 2 tokens", path);
    return st;
}

/* ---- scoring ------------------------------------------------------------------------------ */

typedef struct ppl_state {
    int32_t vocab;
    const int32_t *ids; /* the window */
    size_t n;
    float *logprobs; /* [window, vocab]: ENGINE's, kept for the comparison */
    FILE *logits_out;
    int write_failed;
    double nll, nll2, kl;
    size_t tokens, agree;
} ppl_state;

static int32_t argmax_of(const float *row, int32_t V)
{
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}

/* log(sum(exp(row))), in double. */
static double log_sum_exp(const float *row, int32_t V)
{
    double sum = 0, mx = row[argmax_of(row, V)];
    for (int32_t i = 0; i < V; i++)
        sum += exp((double)row[i] - mx);
    return mx + log(sum);
}

static void on_first(void *user, size_t pos, const float *logits)
{
    ppl_state *s = user;
    if (s->logits_out && fwrite(logits, sizeof *logits, (size_t)s->vocab, s->logits_out) != (size_t)s->vocab)
        s->write_failed = 1;
    float *lp = s->logprobs + pos * (size_t)s->vocab;
    double lse = log_sum_exp(logits, s->vocab);
    for (int32_t i = 0; i < s->vocab; i++)
        lp[i] = (float)((double)logits[i] - lse);
    if (pos + 1 < s->n) {
        s->nll += lse - (double)logits[s->ids[pos + 1]];
        s->tokens++;
    }
}

/* The reference: its own likelihood, agreement and KL(reference || ENGINE). */
static void on_second(void *user, size_t pos, const float *logits)
{
    ppl_state *s = user;
    if (pos + 1 >= s->n)
        return;
    const float *lp = s->logprobs + pos * (size_t)s->vocab;
    s->agree += argmax_of(logits, s->vocab) == argmax_of(lp, s->vocab);
    double lse = log_sum_exp(logits, s->vocab), kl = 0;
    for (int32_t i = 0; i < s->vocab; i++) {
        double q = (double)logits[i] - lse;
        kl += exp(q) * (q - (double)lp[i]);
    }
    s->kl += kl;
    s->nll2 += lse - (double)logits[s->ids[pos + 1]];
}

static int print_result(const char *engine, const char *other, const seq_list *w, size_t window, const ppl_state *s,
                        int json)
{
    double n = (double)s->tokens;
    double ppl = exp(s->nll / n), ppl2 = exp(s->nll2 / n);
    if (!json) {
        printf("perplexity: %.4f over %zu tokens (%zu windows of up to %zu)\n", ppl, s->tokens, w->count, window);
        if (other)
            printf("compare %s: perplexity %.4f; argmax agreement %.4f (%zu/%zu); mean KL %.6f nats\n", other, ppl2,
                   (double)s->agree / n, s->agree, s->tokens, s->kl / n);
        return CLI_OK;
    }
    json_t *o = json_object();
    json_object_set_new(o, "engine", json_string(engine));
    json_object_set_new(o, "tokens", json_integer((json_int_t)s->tokens));
    json_object_set_new(o, "windows", json_integer((json_int_t)w->count));
    json_object_set_new(o, "window", json_integer((json_int_t)window));
    json_object_set_new(o, "nll_mean", json_real(s->nll / n));
    json_object_set_new(o, "perplexity", json_real(ppl));
    if (other) {
        json_t *c = json_object();
        json_object_set_new(c, "engine", json_string(other));
        json_object_set_new(c, "nll_mean", json_real(s->nll2 / n));
        json_object_set_new(c, "perplexity", json_real(ppl2));
        json_object_set_new(c, "argmax_agreement", json_real((double)s->agree / n));
        json_object_set_new(c, "kl_mean", json_real(s->kl / n));
        json_object_set_new(o, "compare", c);
    }
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text)
        return cli_error("out of memory writing JSON");
    puts(text);
    free(text);
    return CLI_OK;
}

static int score_all(kiln_llm *llm, kiln_llm *ref, const seq_list *w, ppl_state *s)
{
    for (size_t i = 0; i < w->count; i++) {
        s->ids = w->ids[i];
        s->n = w->n[i];
        if (kiln_llm_score(llm, s->ids, s->n, on_first, s) != KILN_OK)
            return cli_kiln_error();
        if (s->write_failed)
            return cli_error("writing the logits failed");
        if (ref && kiln_llm_score(ref, s->ids, s->n, on_second, s) != KILN_OK)
            return cli_kiln_error();
    }
    if (s->tokens == 0)
        return cli_error("no token to predict: every sequence is a single token");
    return CLI_OK;
}

/* ---- the command ----------------------------------------------------------------------------- */

int cli_perplexity(int argc, char **argv)
{
    static const char *const valued[] = {"--window", "--compare", "--logits", "--plugins", "--threads", NULL};
    cli_args a;
    cli_args_init(&a, "perplexity", argc, argv);
    const char *opt, *val, *compare = NULL, *logits_path = NULL;
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    int n_libs = 0, json = 0, help = 0, ids_mode = 0;
    long window = 512;
    long long threads = 0;
    int st = libs ? CLI_OK : cli_error("out of memory");
    while (st == CLI_OK && (opt = cli_args_next(&a, valued, &val))) {
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help"))
            help = 1;
        else if (!strcmp(opt, "--window"))
            st = cli_parse_count("perplexity", opt, val, &window);
        else if (!strcmp(opt, "--compare"))
            compare = val;
        else if (!strcmp(opt, "--logits"))
            logits_path = val;
        else if (!strcmp(opt, "--plugins"))
            libs[n_libs++] = val;
        else if (!strcmp(opt, "--threads"))
            st = cli_parse_range("perplexity", opt, val, 1, 1024, &threads);
        else if (!strcmp(opt, "--ids"))
            ids_mode = 1;
        else if (!strcmp(opt, "--json"))
            json = 1;
        else
            st = cli_usage("perplexity", "unknown option %s", opt);
    }
    if (st == CLI_OK && a.status)
        st = a.status;
    if (st == CLI_OK && help)
        fputs(perplexity_help, stdout);
    else if (st == CLI_OK && a.n_positional != 2)
        st = cli_usage("perplexity", "expected ENGINE and TEXTFILE, got %d arguments", a.n_positional);
    else if (st == CLI_OK && window < 2)
        st = cli_usage("perplexity", "--window must be >= 2");
    kiln_registry *reg = NULL, *reg2 = NULL;
    kiln_llm *llm = NULL, *ref = NULL;
    char *text = NULL;
    size_t len = 0;
    seq_list w = {0};
    ppl_state s;
    memset(&s, 0, sizeof s);
    if (st == CLI_OK && !help) {
        /* Scoring brings its own KV cache: generation's can be one block. */
        /* scoring runs on a context of its own: generation's cache and
         * decode graphs would only hold memory */
        kiln_llm_options lo;
        kiln_llm_options_init(&lo);
        lo.kv_cache_blocks = 1;
        lo.no_cuda_graphs = 1;
        lo.n_threads = (int32_t)threads;
        st = cli_llm_open(a.positional[0], libs, n_libs, &lo, &reg, &llm);
        if (st == CLI_OK && compare)
            st = cli_llm_open(compare, libs, n_libs, &lo, &reg2, &ref);
        if (st == CLI_OK && !(text = read_file(a.positional[1], &len)))
            st = CLI_FAILURE;
    }
    int32_t vocab = 0;
    if (st == CLI_OK && !help) {
        const kiln_llm_info *info = kiln_llm_info_get(llm);
        vocab = info->vocab_size;
        if (window > info->max_seq_len)
            window = info->max_seq_len;
        if (ref) {
            const kiln_llm_info *info2 = kiln_llm_info_get(ref);
            if (info2->vocab_size != vocab)
                st = cli_error("%s has a vocabulary of %d tokens, %s of %d: they cannot be compared", compare,
                               (int)info2->vocab_size, a.positional[0], (int)vocab);
            else if (window > info2->max_seq_len)
                window = info2->max_seq_len;
        }
    }
    if (st == CLI_OK && !help)
        st = ids_mode ? parse_id_lines(a.positional[1], text, vocab, &w)
                      : text_windows(llm, a.positional[1], text, len, (size_t)window, &w);
    if (st == CLI_OK && !help && ids_mode)
        for (size_t i = 0; st == CLI_OK && i < w.count; i++)
            if (w.n[i] > (size_t)window)
                st = cli_error("%s line %zu has %zu ids, more than the window of %ld", a.positional[1], i + 1, w.n[i],
                               window);
    if (st == CLI_OK && !help) {
        s.vocab = vocab;
        s.logprobs = malloc(sizeof *s.logprobs * (size_t)window * (size_t)vocab);
        if (!s.logprobs)
            st = cli_error("out of memory for a window of %ld x %d log-probabilities", window, (int)vocab);
        if (st == CLI_OK && logits_path && !(s.logits_out = fopen(logits_path, "wb")))
            st = cli_error("cannot create %s: %s", logits_path, strerror(errno));
        if (st == CLI_OK)
            st = score_all(llm, ref, &w, &s);
        if (s.logits_out && fclose(s.logits_out) != 0 && st == CLI_OK)
            st = cli_error("writing %s failed", logits_path);
        if (st == CLI_OK)
            st = print_result(a.positional[0], compare, &w, (size_t)window, &s, json);
    }
    free(s.logprobs);
    seq_list_free(&w);
    free(text);
    kiln_llm_close(ref);
    kiln_llm_close(llm);
    kiln_registry_destroy(reg2);
    kiln_registry_destroy(reg);
    free(libs);
    cli_args_free(&a);
    return st;
}
