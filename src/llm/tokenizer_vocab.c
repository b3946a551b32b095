/* Tokenizers from an in-memory vocabulary (GGUF's tokenizer.ggml.* keys, or
 * llama2.c's tokenizer.bin), and that vocabulary's JSON form, which is how
 * such a tokenizer serializes. */
#include <float.h>
#include <math.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "llm/tokenizer_internal.h"

static const char SPM_SPACE[] = "\xE2\x96\x81"; /* U+2581, SentencePiece's space */

static size_t tlen(const kiln_tokenizer_vocab *v, int32_t i)
{
    return v->token_lens ? v->token_lens[i] : strlen(v->tokens[i]);
}

static kiln_status push_norm(kiln_tokenizer *t, tok_norm_kind kind, const char *a, const char *b)
{
    tok_normalizer *p = realloc(t->norms, (t->n_norms + 1) * sizeof *p);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    t->norms = p;
    tok_normalizer nm = {.kind = kind};
    nm.a = kiln_strdup(a);
    nm.b = b ? kiln_strdup(b) : NULL;
    nm.a_len = strlen(a);
    nm.b_len = b ? strlen(b) : 0;
    t->norms[t->n_norms++] = nm;
    if (!nm.a || (b && !nm.b))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    return KILN_OK;
}

static kiln_status push_dec(kiln_tokenizer *t, tok_dec_kind kind, const char *a, const char *b, uint32_t start)
{
    tok_decoder *p = realloc(t->decs, (t->n_decs + 1) * sizeof *p);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    t->decs = p;
    tok_decoder d = {.kind = kind, .start = start};
    d.a = a ? kiln_strdup(a) : NULL;
    d.b = b ? kiln_strdup(b) : NULL;
    d.a_len = a ? strlen(a) : 0;
    d.b_len = b ? strlen(b) : 0;
    t->decs[t->n_decs++] = d;
    if ((a && !d.a) || (b && !d.b))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    t->has_decoder = true;
    return KILN_OK;
}

static kiln_status push_pre(kiln_tokenizer *t, tok_pretokenizer pre)
{
    tok_pretokenizer *p = realloc(t->pres, (t->n_pres + 1) * sizeof *p);
    if (!p) {
        pcre2_code_free(pre.re);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
    t->pres = p;
    t->pres[t->n_pres++] = pre;
    return KILN_OK;
}

/* The vocabulary as JSON: the serialized form of a tokenizer built from one. */
static kiln_status vocab_to_json(const kiln_tokenizer_vocab *v, char **text, size_t *len)
{
    json_t *o = json_object(), *toks = json_array(), *merges = json_array(), *res = json_array();
    json_t *scores = v->scores ? json_array() : json_null(), *types = v->types ? json_array() : json_null();
    int bad = !o || !toks || !merges || !res || !scores || !types;
    for (int32_t i = 0; !bad && i < v->n_tokens; i++) {
        bad |= json_array_append_new(toks, json_stringn(v->tokens[i], tlen(v, i)));
        if (v->scores)
            bad |= json_array_append_new(scores, json_real(v->scores[i]));
        if (v->types)
            bad |= json_array_append_new(types, json_integer(v->types[i]));
    }
    for (int32_t i = 0; !bad && i < v->n_merges; i++)
        bad |= json_array_append_new(merges, json_string(v->merges[i]));
    for (int32_t i = 0; !bad && i < v->n_pre_regexes; i++)
        bad |= json_array_append_new(res, json_string(v->pre_regexes[i]));
    if (!bad) {
        bad |= json_object_set_new(o, "kind", json_string(v->kind == KILN_TOKENIZER_SPM ? "spm" : "byte_bpe"));
        bad |= json_object_set(o, "tokens", toks);
        bad |= json_object_set(o, "scores", scores);
        bad |= json_object_set(o, "types", types);
        bad |= json_object_set(o, "merges", merges);
        bad |= json_object_set(o, "pre_regexes", res);
        bad |= json_object_set_new(o, "bos", json_integer(v->bos_id));
        bad |= json_object_set_new(o, "eos", json_integer(v->eos_id));
        bad |= json_object_set_new(o, "unk", json_integer(v->unk_id));
        bad |= json_object_set_new(o, "add_bos", json_boolean(v->add_bos));
        bad |= json_object_set_new(o, "add_eos", json_boolean(v->add_eos));
        bad |= json_object_set_new(o, "ignore_merges", json_boolean(v->ignore_merges));
    }
    char *s = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(toks);
    json_decref(merges);
    json_decref(res);
    json_decref(scores);
    json_decref(types);
    json_decref(o);
    if (!s)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: cannot write the vocabulary as JSON");
    *text = s;
    *len = strlen(s);
    return KILN_OK;
}

static kiln_status check_id(int32_t id, int32_t n, const char *what)
{
    if (id < -1 || id >= n)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: %s id %d is outside 0..%d", what, (int)id,
                         (int)n - 1);
    return KILN_OK;
}

static kiln_status build(kiln_tokenizer *t, const kiln_tokenizer_vocab *v)
{
    if (v->kind != KILN_TOKENIZER_SPM && v->kind != KILN_TOKENIZER_BYTE_BPE)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: unknown kind %d", (int)v->kind);
    if (v->n_tokens <= 0 || !v->tokens)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: no tokens");
    if (v->n_merges < 0 || (v->n_merges && !v->merges) || v->n_pre_regexes < 0 || (v->n_pre_regexes && !v->pre_regexes))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: bad merges or pre_regexes");
    KILN_TRY(check_id(v->bos_id, v->n_tokens, "bos"));
    KILN_TRY(check_id(v->eos_id, v->n_tokens, "eos"));
    KILN_TRY(check_id(v->unk_id, v->n_tokens, "unk"));
    if ((v->add_bos && v->bos_id < 0) || (v->add_eos && v->eos_id < 0))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: add_bos/add_eos without the token id");

    /* Control and unknown tokens only as (special) added tokens, so BPE
     * never merges into them (SentencePiece keeps them out of its pieces);
     * user-defined ones are both. */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < v->n_tokens; i++) {
            if (!v->tokens[i])
                return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: token %d is NULL", (int)i);
            size_t n = tlen(v, i);
            if (tok_utf8_valid_prefix(v->tokens[i], n) != n)
                return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: token %d is not valid UTF-8",
                                 (int)i);
            int32_t type = v->types ? v->types[i] : KILN_TOKEN_NORMAL;
            if (type < KILN_TOKEN_NORMAL || type > KILN_TOKEN_BYTE)
                return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: token %d has type %d", (int)i,
                                 (int)type);
            bool added = type == KILN_TOKEN_CONTROL || type == KILN_TOKEN_UNKNOWN || type == KILN_TOKEN_USER_DEFINED;
            bool model = !(type == KILN_TOKEN_CONTROL || type == KILN_TOKEN_UNKNOWN);
            if (pass == 0 && added) {
                if (n == 0)
                    return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: token %d is empty", (int)i);
                KILN_TRY(tok_add_added(t, v->tokens[i], n, i, type == KILN_TOKEN_USER_DEFINED ? 0 : TOK_ATTR_SPECIAL));
            }
            if (pass == 1 && model)
                KILN_TRY(tok_add_vocab(t, v->tokens[i], n, i, v->scores ? v->scores[i] : 0.0f));
        }
    }
    for (int32_t i = 0; i < v->n_merges; i++) {
        const char *m = v->merges[i];
        const char *sp = m ? strchr(m, ' ') : NULL;
        if (!sp)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: merge %d is not \"a b\"", (int)i);
        KILN_TRY(tok_add_merge(t, m, (size_t)(sp - m), sp + 1, strlen(sp + 1), i));
    }
    t->use_scores = v->scores && !v->n_merges;
    t->unk_id = v->unk_id;
    t->bos_id = v->bos_id;
    t->eos_id = v->eos_id;
    t->ignore_merges = v->ignore_merges != 0;
    if (v->kind == KILN_TOKENIZER_SPM) {
        /* Hugging Face's Llama 2 tokenizer.json (legacy form). */
        t->byte_fallback = true;
        t->fuse_unk = true;
        KILN_TRY(push_norm(t, TOK_NORM_PREPEND, SPM_SPACE, NULL));
        KILN_TRY(push_norm(t, TOK_NORM_REPLACE, " ", SPM_SPACE));
        KILN_TRY(push_dec(t, TOK_DEC_REPLACE, SPM_SPACE, " ", 0));
        KILN_TRY(push_dec(t, TOK_DEC_BYTEFALLBACK, NULL, NULL, 0));
        KILN_TRY(push_dec(t, TOK_DEC_FUSE, NULL, NULL, 0));
        KILN_TRY(push_dec(t, TOK_DEC_STRIP, " ", NULL, 1));
    } else {
        for (int32_t i = 0; i < v->n_pre_regexes; i++) {
            tok_pretokenizer pre = {.kind = TOK_PRE_SPLIT, .behavior = TOK_SPLIT_ISOLATED};
            if (!v->pre_regexes[i])
                return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer vocabulary: pre_regexes[%d] is NULL", (int)i);
            KILN_TRY(tok_compile_regex(v->pre_regexes[i], strlen(v->pre_regexes[i]), false, &pre.re, "pre-tokenizer"));
            KILN_TRY(push_pre(t, pre));
        }
        tok_pretokenizer bl = {.kind = TOK_PRE_BYTELEVEL};
        if (!v->n_pre_regexes)
            KILN_TRY(tok_compile_regex(tok_gpt2_regex, strlen(tok_gpt2_regex), false, &bl.re, "ByteLevel"));
        KILN_TRY(push_pre(t, bl));
        KILN_TRY(push_dec(t, TOK_DEC_BYTELEVEL, NULL, NULL, 0));
    }
    if (v->add_bos)
        KILN_TRY(tok_push_id(&t->post_prefix, &t->n_post_prefix, v->bos_id));
    if (v->add_eos)
        KILN_TRY(tok_push_id(&t->post_suffix, &t->n_post_suffix, v->eos_id));
    KILN_TRY(tok_finish(t));
    KILN_TRY(vocab_to_json(v, &t->source, &t->source_len));
    t->source_is_vocab = true;
    return KILN_OK;
}

kiln_status tok_build_from_vocab(const kiln_tokenizer_vocab *v, kiln_tokenizer **out)
{
    kiln_tokenizer *t;
    KILN_TRY(tok_alloc(&t));
    kiln_status st = build(t, v);
    if (st != KILN_OK) {
        kiln_tokenizer_free(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}

kiln_status kiln_tokenizer_create(const kiln_tokenizer_vocab *vocab, kiln_tokenizer **out)
{
    if (!vocab || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_create: NULL argument");
    return tok_build_from_vocab(vocab, out);
}

/* ---- the vocabulary JSON ---- */

static kiln_status json_i32(json_t *o, const char *key, int32_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > INT32_MAX)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer vocabulary JSON: \"%s\" is missing or out of range", key);
    *out = (int32_t)json_integer_value(v);
    return KILN_OK;
}

static kiln_status from_json(json_t *o, kiln_tokenizer **out)
{
    kiln_tokenizer_vocab v = {0};
    const char *kind = json_string_value(json_object_get(o, "kind"));
    json_t *toks = json_object_get(o, "tokens"), *scores = json_object_get(o, "scores");
    json_t *types = json_object_get(o, "types"), *merges = json_object_get(o, "merges");
    json_t *res = json_object_get(o, "pre_regexes");
    if (!kind || (strcmp(kind, "spm") && strcmp(kind, "byte_bpe")))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer vocabulary JSON: bad \"kind\"");
    v.kind = strcmp(kind, "spm") ? KILN_TOKENIZER_BYTE_BPE : KILN_TOKENIZER_SPM;
    size_t n = json_array_size(toks);
    if (!json_is_array(toks) || n == 0 || n > INT32_MAX || !json_is_array(merges) || !json_is_array(res) ||
        json_array_size(merges) > INT32_MAX || json_array_size(res) > INT32_MAX ||
        !(json_is_null(scores) || (json_is_array(scores) && json_array_size(scores) == n)) ||
        !(json_is_null(types) || (json_is_array(types) && json_array_size(types) == n)))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer vocabulary JSON: tokens/scores/types/merges malformed");
    KILN_TRY(json_i32(o, "bos", &v.bos_id));
    KILN_TRY(json_i32(o, "eos", &v.eos_id));
    KILN_TRY(json_i32(o, "unk", &v.unk_id));
    v.add_bos = json_is_true(json_object_get(o, "add_bos"));
    v.add_eos = json_is_true(json_object_get(o, "add_eos"));
    v.ignore_merges = json_is_true(json_object_get(o, "ignore_merges"));
    v.n_tokens = (int32_t)n;
    v.n_merges = (int32_t)json_array_size(merges);
    v.n_pre_regexes = (int32_t)json_array_size(res);
    const char **tokens = calloc(n, sizeof *tokens);
    uint32_t *lens = calloc(n, sizeof *lens);
    float *sc = json_is_array(scores) ? calloc(n, sizeof *sc) : NULL;
    int32_t *ty = json_is_array(types) ? calloc(n, sizeof *ty) : NULL;
    const char **mg = calloc(json_array_size(merges) + 1, sizeof *mg);
    const char **rx = calloc(json_array_size(res) + 1, sizeof *rx);
    kiln_status st = KILN_OK;
    if (!tokens || !lens || !mg || !rx || (json_is_array(scores) && !sc) || (json_is_array(types) && !ty))
        st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer vocabulary JSON: out of memory");
    for (size_t i = 0; st == KILN_OK && i < n; i++) {
        json_t *s = json_array_get(toks, i);
        if (!json_is_string(s) || json_string_length(s) > UINT32_MAX ||
            (sc && !json_is_number(json_array_get(scores, i))) || (ty && !json_is_integer(json_array_get(types, i)))) {
            st = kiln_fail(KILN_ERROR_FORMAT, "tokenizer vocabulary JSON: token %zu malformed", i);
            break;
        }
        tokens[i] = json_string_value(s);
        lens[i] = (uint32_t)json_string_length(s);
        if (sc) {
            /* Converting a double outside float's range is undefined. */
            double x = json_number_value(json_array_get(scores, i));
            if (!(fabs(x) <= FLT_MAX)) {
                st = kiln_fail(KILN_ERROR_FORMAT,
                               "tokenizer vocabulary JSON: score of token %zu (%g) is not "
                               "a finite f32",
                               i, x);
                break;
            }
            sc[i] = (float)x;
        }
        if (ty) {
            json_int_t tv = json_integer_value(json_array_get(types, i));
            ty[i] = tv < 0 || tv > 100 ? -1 : (int32_t)tv;
        }
    }
    for (int32_t i = 0; st == KILN_OK && i < v.n_merges; i++)
        if (!(mg[i] = json_string_value(json_array_get(merges, (size_t)i))))
            st = kiln_fail(KILN_ERROR_FORMAT, "tokenizer vocabulary JSON: merge %d is not a string", (int)i);
    for (int32_t i = 0; st == KILN_OK && i < v.n_pre_regexes; i++)
        if (!(rx[i] = json_string_value(json_array_get(res, (size_t)i))))
            st = kiln_fail(KILN_ERROR_FORMAT, "tokenizer vocabulary JSON: pre_regexes[%d] is not a string", (int)i);
    if (st == KILN_OK) {
        v.tokens = tokens;
        v.token_lens = lens;
        v.scores = sc;
        v.types = ty;
        v.merges = mg;
        v.pre_regexes = rx;
        st = tok_build_from_vocab(&v, out);
    }
    free(tokens);
    free(lens);
    free(sc);
    free(ty);
    free(mg);
    free(rx);
    return st;
}

kiln_status tok_build_from_vocab_json(const char *text, size_t len, kiln_tokenizer **out)
{
    json_error_t err;
    json_t *o = json_loadb(text, len, 0, &err);
    if (!o)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer vocabulary JSON: line %d: %s", err.line, err.text);
    kiln_status st = json_is_object(o) ? from_json(o, out)
                                       : kiln_fail(KILN_ERROR_FORMAT, "tokenizer vocabulary JSON: not an object");
    json_decref(o);
    return st;
}

/* ---- llama2.c tokenizer.bin ---- */

static int32_t rd_i32(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, 4);
    return v;
}

kiln_status kiln_tokenizer_load_llama2c_memory(const void *data, size_t len, int32_t vocab_size, kiln_tokenizer **out)
{
    if (!data || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_load_llama2c_memory: NULL argument");
    if (vocab_size < 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "llama2.c tokenizer: negative vocab_size %d", (int)vocab_size);
    const unsigned char *p = data, *end = p + len;
    if (len < 4 || rd_i32(p) <= 0)
        return kiln_fail(KILN_ERROR_FORMAT, "llama2.c tokenizer: missing or bad max_token_length");
    p += 4;
    /* Pass 1 counts and checks; pass 2 converts. */
    size_t n = 0;
    for (const unsigned char *q = p; q < end && (vocab_size == 0 || n < (size_t)vocab_size); n++) {
        if (end - q < 8)
            return kiln_fail(KILN_ERROR_FORMAT, "llama2.c tokenizer: token %zu is truncated", n);
        int32_t l = rd_i32(q + 4);
        if (l < 0 || (size_t)l > (size_t)(end - q) - 8)
            return kiln_fail(KILN_ERROR_FORMAT, "llama2.c tokenizer: token %zu has bad length %d", n, (int)l);
        q += 8 + (size_t)l;
    }
    if (n == 0 || n > (1 << 24) || (vocab_size && n != (size_t)vocab_size))
        return kiln_fail(KILN_ERROR_FORMAT, "llama2.c tokenizer: holds %zu tokens, expected %d", n, (int)vocab_size);
    kiln_tokenizer_vocab v = {
        .kind = KILN_TOKENIZER_SPM, .n_tokens = (int32_t)n, .bos_id = -1, .eos_id = -1, .unk_id = -1};
    char **tokens = calloc(n, sizeof *tokens);
    uint32_t *lens = calloc(n, sizeof *lens);
    float *scores = calloc(n, sizeof *scores);
    int32_t *types = calloc(n, sizeof *types);
    kiln_status st = KILN_OK;
    if (!tokens || !lens || !scores || !types)
        st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "llama2.c tokenizer: out of memory");
    for (size_t i = 0; st == KILN_OK && i < n; i++) {
        memcpy(&scores[i], p, 4);
        size_t l = (size_t)rd_i32(p + 4);
        const char *s = (const char *)p + 8;
        p += 8 + l;
        types[i] = KILN_TOKEN_NORMAL;
        /* llama2.c's export wrote BOS/EOS as "\n<s>\n" and "\n</s>\n" and
         * every "▁" as a space; undo both so the vocabulary is
         * SentencePiece's. */
        if (l == 5 && !memcmp(s, "\n<s>\n", 5)) {
            s = "<s>";
            l = 3;
            types[i] = KILN_TOKEN_CONTROL;
            v.bos_id = (int32_t)i;
        } else if (l == 6 && !memcmp(s, "\n</s>\n", 6)) {
            s = "</s>";
            l = 4;
            types[i] = KILN_TOKEN_CONTROL;
            v.eos_id = (int32_t)i;
        } else if (l == 5 && !memcmp(s, "<unk>", 5)) {
            types[i] = KILN_TOKEN_UNKNOWN;
            v.unk_id = (int32_t)i;
        } else if (l == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') {
            types[i] = KILN_TOKEN_BYTE;
        }
        size_t spaces = 0;
        for (size_t k = 0; k < l; k++)
            spaces += s[k] == ' ';
        tokens[i] = malloc(l + spaces * 2 + 1);
        if (!tokens[i]) {
            st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "llama2.c tokenizer: out of memory");
            break;
        }
        size_t w = 0;
        for (size_t k = 0; k < l; k++) {
            if (s[k] == ' ') {
                memcpy(tokens[i] + w, SPM_SPACE, 3);
                w += 3;
            } else {
                tokens[i][w++] = s[k];
            }
        }
        tokens[i][w] = '\0';
        lens[i] = (uint32_t)w;
    }
    if (st == KILN_OK) {
        v.tokens = (const char *const *)tokens;
        v.token_lens = lens;
        v.scores = scores;
        v.types = types;
        v.add_bos = v.bos_id >= 0;
        st = tok_build_from_vocab(&v, out);
        if (st != KILN_OK)
            st = kiln_fail_context(st, "llama2.c tokenizer");
    }
    for (size_t i = 0; tokens && i < n; i++)
        free(tokens[i]);
    free(tokens);
    free(lens);
    free(scores);
    free(types);
    return st;
}
