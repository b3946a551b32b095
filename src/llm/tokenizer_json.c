/* Loading a Hugging Face tokenizer.json into the pipeline of
 * tokenizer_internal.h. Only what byte-level and SentencePiece-style BPE
 * models use is implemented; anything else fails naming the feature. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_file.h"
#include "llm/tokenizer_internal.h"

static kiln_status unsupported(const char *what, const char *name)
{
    return kiln_fail(KILN_ERROR_UNSUPPORTED, "tokenizer.json: %s \"%s\" is not supported", what, name);
}

static const char *type_of(json_t *o) { return json_string_value(json_object_get(o, "type")); }

/* Ids may leave gaps, but not so large that a small file could make the
 * id table huge. */
static kiln_status check_id_range(int64_t id, size_t n_declared, const char *what)
{
    size_t limit = n_declared * 2 + 65536;
    if (id < 0 || (size_t)id >= limit || id > INT32_MAX)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: %s id %lld is out of range for a file of %zu tokens", what,
                         (long long)id, n_declared);
    return KILN_OK;
}

static kiln_status get_bool(json_t *o, const char *key, bool dflt, bool *out, const char *where)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return KILN_OK;
    }
    if (!json_is_boolean(v))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: %s.%s is not a boolean", where, key);
    *out = json_is_true(v);
    return KILN_OK;
}

static kiln_status get_str(json_t *o, const char *key, const char **s, size_t *len, const char *where)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: %s.%s is missing or not a string", where, key);
    *s = json_string_value(v);
    *len = json_string_length(v);
    return KILN_OK;
}

static kiln_status dup_bytes(const char *s, size_t len, char **out)
{
    char *p = malloc(len + 1);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer.json: out of memory");
    memcpy(p, s, len);
    p[len] = '\0';
    *out = p;
    return KILN_OK;
}

/* One UTF-8 character (Metaspace replacement, Strip content). */
static kiln_status get_char(json_t *o, const char *key, char out[8], size_t *len, const char *where)
{
    const char *s = NULL;
    size_t n = 0;
    KILN_TRY(get_str(o, key, &s, &n, where));
    if (n == 0 || n > 4 || tok_utf8_valid_prefix(s, n) != n)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: %s.%s must be one character", where, key);
    memcpy(out, s, n);
    *len = n;
    return KILN_OK;
}

static kiln_status get_u32(json_t *o, const char *key, uint32_t *out, const char *where)
{
    json_t *v = json_object_get(o, key);
    int64_t x;
    if (!kiln_json_int(v, &x) || x < 0 || x > UINT32_MAX)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: %s.%s is missing or not a count", where, key);
    *out = (uint32_t)x;
    return KILN_OK;
}

/* {"String": s} or {"Regex": r}. */
static kiln_status get_pattern(json_t *o, const char **s, size_t *len, bool *is_regex, const char *where)
{
    json_t *p = json_object_get(o, "pattern");
    if (json_is_string(json_object_get(p, "String"))) {
        *is_regex = false;
        return get_str(p, "String", s, len, where);
    }
    if (json_is_string(json_object_get(p, "Regex"))) {
        *is_regex = true;
        return get_str(p, "Regex", s, len, where);
    }
    return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: %s.pattern needs a \"String\" or \"Regex\"", where);
}

static kiln_status get_prepend_scheme(json_t *o, tok_prepend_scheme *out, const char *where)
{
    const char *s = json_string_value(json_object_get(o, "prepend_scheme"));
    if (s) {
        if (!strcmp(s, "always"))
            *out = TOK_PREPEND_ALWAYS;
        else if (!strcmp(s, "first"))
            *out = TOK_PREPEND_FIRST;
        else if (!strcmp(s, "never"))
            *out = TOK_PREPEND_NEVER;
        else
            return unsupported("Metaspace prepend_scheme", s);
        return KILN_OK;
    }
    /* Older files: a boolean add_prefix_space. */
    bool add = true;
    KILN_TRY(get_bool(o, "add_prefix_space", true, &add, where));
    *out = add ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    return KILN_OK;
}

/* ---- normalizers ---- */

static kiln_status add_normalizer(kiln_tokenizer *t, json_t *o, int depth)
{
    if (!o || json_is_null(o))
        return KILN_OK;
    const char *type = type_of(o);
    if (!type)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: normalizer without a \"type\"");
    if (depth > 8)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: normalizers nested too deep");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(o, "normalizers");
        if (!json_is_array(arr))
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: Sequence normalizer without \"normalizers\"");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) KILN_TRY(add_normalizer(t, v, depth + 1));
        return KILN_OK;
    }
    tok_normalizer nm = {0};
    const char *s = NULL;
    size_t n = 0;
    if (!strcmp(type, "Prepend")) {
        nm.kind = TOK_NORM_PREPEND;
        KILN_TRY(get_str(o, "prepend", &s, &n, "Prepend normalizer"));
        KILN_TRY(dup_bytes(s, n, &nm.a));
        nm.a_len = n;
    } else if (!strcmp(type, "Replace")) {
        nm.kind = TOK_NORM_REPLACE;
        bool is_regex;
        KILN_TRY(get_pattern(o, &s, &n, &is_regex, "Replace normalizer"));
        if (n == 0)
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: Replace normalizer with an empty pattern");
        if (is_regex)
            KILN_TRY(tok_compile_regex(s, n, false, &nm.re, "Replace normalizer"));
        kiln_status st = dup_bytes(s, n, &nm.a);
        nm.a_len = n;
        const char *c = NULL;
        size_t cn = 0;
        if (st == KILN_OK)
            st = get_str(o, "content", &c, &cn, "Replace normalizer");
        if (st == KILN_OK)
            st = dup_bytes(c, cn, &nm.b);
        nm.b_len = cn;
        if (st != KILN_OK) {
            pcre2_code_free(nm.re);
            free(nm.a);
            free(nm.b);
            return st;
        }
    } else if (!strcmp(type, "NFC")) {
        nm.kind = TOK_NORM_NFC;
    } else {
        return unsupported("normalizer", type);
    }
    tok_normalizer *p = realloc(t->norms, (t->n_norms + 1) * sizeof *p);
    if (!p) {
        pcre2_code_free(nm.re);
        free(nm.a);
        free(nm.b);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer.json: out of memory");
    }
    t->norms = p;
    t->norms[t->n_norms++] = nm;
    return KILN_OK;
}

/* ---- pre-tokenizers ---- */

static kiln_status push_pre(kiln_tokenizer *t, tok_pretokenizer pre)
{
    tok_pretokenizer *p = realloc(t->pres, (t->n_pres + 1) * sizeof *p);
    if (!p) {
        pcre2_code_free(pre.re);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer.json: out of memory");
    }
    t->pres = p;
    t->pres[t->n_pres++] = pre;
    return KILN_OK;
}

static kiln_status parse_behavior(json_t *o, tok_split_behavior *out)
{
    const char *b = json_string_value(json_object_get(o, "behavior"));
    if (!b)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: Split pre-tokenizer without \"behavior\"");
    if (!strcmp(b, "Removed"))
        *out = TOK_SPLIT_REMOVED;
    else if (!strcmp(b, "Isolated"))
        *out = TOK_SPLIT_ISOLATED;
    else if (!strcmp(b, "MergedWithPrevious"))
        *out = TOK_SPLIT_MERGED_PREV;
    else if (!strcmp(b, "MergedWithNext"))
        *out = TOK_SPLIT_MERGED_NEXT;
    else if (!strcmp(b, "Contiguous"))
        *out = TOK_SPLIT_CONTIGUOUS;
    else
        return unsupported("Split behavior", b);
    return KILN_OK;
}

static kiln_status add_pretokenizer(kiln_tokenizer *t, json_t *o, int depth)
{
    if (!o || json_is_null(o))
        return KILN_OK;
    const char *type = type_of(o);
    if (!type)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: pre_tokenizer without a \"type\"");
    if (depth > 8)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: pre-tokenizers nested too deep");
    tok_pretokenizer pre = {0};
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(o, "pretokenizers");
        if (!json_is_array(arr))
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: Sequence pre-tokenizer without \"pretokenizers\"");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) KILN_TRY(add_pretokenizer(t, v, depth + 1));
        return KILN_OK;
    }
    if (!strcmp(type, "Split")) {
        const char *s;
        size_t n;
        bool is_regex;
        pre.kind = TOK_PRE_SPLIT;
        KILN_TRY(get_pattern(o, &s, &n, &is_regex, "Split pre-tokenizer"));
        KILN_TRY(parse_behavior(o, &pre.behavior));
        KILN_TRY(get_bool(o, "invert", false, &pre.invert, "Split pre-tokenizer"));
        KILN_TRY(tok_compile_regex(s, n, !is_regex, &pre.re, "Split pre-tokenizer"));
        return push_pre(t, pre);
    }
    if (!strcmp(type, "ByteLevel")) {
        bool use_regex = true;
        pre.kind = TOK_PRE_BYTELEVEL;
        KILN_TRY(get_bool(o, "add_prefix_space", true, &pre.add_prefix_space, "ByteLevel pre-tokenizer"));
        KILN_TRY(get_bool(o, "use_regex", true, &use_regex, "ByteLevel pre-tokenizer"));
        if (use_regex)
            KILN_TRY(tok_compile_regex(tok_gpt2_regex, strlen(tok_gpt2_regex), false, &pre.re, "ByteLevel"));
        return push_pre(t, pre);
    }
    if (!strcmp(type, "Metaspace")) {
        pre.kind = TOK_PRE_METASPACE;
        KILN_TRY(get_char(o, "replacement", pre.replacement, &pre.replacement_len, "Metaspace pre-tokenizer"));
        KILN_TRY(get_prepend_scheme(o, &pre.prepend, "Metaspace pre-tokenizer"));
        KILN_TRY(get_bool(o, "split", true, &pre.split, "Metaspace pre-tokenizer"));
        return push_pre(t, pre);
    }
    if (!strcmp(type, "Digits")) {
        /* Runs of Unicode numerics (char::is_numeric), or each one alone. */
        bool individual = false;
        KILN_TRY(get_bool(o, "individual_digits", false, &individual, "Digits pre-tokenizer"));
        const char *re = individual ? "\\p{N}" : "\\p{N}+";
        pre.kind = TOK_PRE_SPLIT;
        pre.behavior = TOK_SPLIT_ISOLATED;
        KILN_TRY(tok_compile_regex(re, strlen(re), false, &pre.re, "Digits pre-tokenizer"));
        return push_pre(t, pre);
    }
    return unsupported("pre_tokenizer", type);
}

/* ---- decoders ---- */

static kiln_status add_decoder(kiln_tokenizer *t, json_t *o, int depth)
{
    if (!o || json_is_null(o))
        return KILN_OK;
    const char *type = type_of(o);
    if (!type)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: decoder without a \"type\"");
    if (depth > 8)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: decoders nested too deep");
    t->has_decoder = true;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(o, "decoders");
        if (!json_is_array(arr))
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: Sequence decoder without \"decoders\"");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) KILN_TRY(add_decoder(t, v, depth + 1));
        return KILN_OK;
    }
    tok_decoder d = {0};
    kiln_status st = KILN_OK;
    if (!strcmp(type, "ByteLevel")) {
        d.kind = TOK_DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        d.kind = TOK_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d.kind = TOK_DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        const char *s = NULL, *c = NULL;
        size_t n, cn = 0;
        bool is_regex;
        d.kind = TOK_DEC_REPLACE;
        KILN_TRY(get_pattern(o, &s, &n, &is_regex, "Replace decoder"));
        if (is_regex)
            return unsupported("Replace decoder pattern", "Regex");
        if (n == 0)
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: Replace decoder with an empty pattern");
        KILN_TRY(get_str(o, "content", &c, &cn, "Replace decoder"));
        st = dup_bytes(s, n, &d.a);
        if (st == KILN_OK)
            st = dup_bytes(c, cn, &d.b);
        d.a_len = n;
        d.b_len = cn;
    } else if (!strcmp(type, "Strip")) {
        char c[8];
        size_t cn = 0;
        d.kind = TOK_DEC_STRIP;
        KILN_TRY(get_char(o, "content", c, &cn, "Strip decoder"));
        KILN_TRY(get_u32(o, "start", &d.start, "Strip decoder"));
        KILN_TRY(get_u32(o, "stop", &d.stop, "Strip decoder"));
        st = dup_bytes(c, cn, &d.a);
        d.a_len = cn;
    } else if (!strcmp(type, "Metaspace")) {
        char c[8];
        size_t cn = 0;
        tok_prepend_scheme ps;
        d.kind = TOK_DEC_METASPACE;
        KILN_TRY(get_char(o, "replacement", c, &cn, "Metaspace decoder"));
        KILN_TRY(get_prepend_scheme(o, &ps, "Metaspace decoder"));
        d.strip_first = ps != TOK_PREPEND_NEVER;
        st = dup_bytes(c, cn, &d.a);
        d.a_len = cn;
    } else {
        return unsupported("decoder", type);
    }
    tok_decoder *p = st == KILN_OK ? realloc(t->decs, (t->n_decs + 1) * sizeof *p) : NULL;
    if (!p) {
        free(d.a);
        free(d.b);
        return st != KILN_OK ? st : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer.json: out of memory");
    }
    t->decs = p;
    t->decs[t->n_decs++] = d;
    return KILN_OK;
}

/* ---- post-processors ---- */

static kiln_status set_template(kiln_tokenizer *t, bool *have)
{
    if (*have)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "tokenizer.json: more than one template post-processor");
    *have = true;
    return KILN_OK;
}

/* Bert/Roberta: "cls": [token, id], "sep": [token, id]. */
static kiln_status pair_id(json_t *o, const char *key, int32_t *id, const char *where)
{
    json_t *v = json_array_get(json_object_get(o, key), 1);
    int64_t x;
    if (!kiln_json_int(v, &x) || x < 0 || x > INT32_MAX)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: %s.%s is not a [token, id] pair", where, key);
    *id = (int32_t)x;
    return KILN_OK;
}

static kiln_status add_post(kiln_tokenizer *t, json_t *o, bool *have, int depth)
{
    if (!o || json_is_null(o))
        return KILN_OK;
    const char *type = type_of(o);
    if (!type)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: post_processor without a \"type\"");
    if (depth > 8)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: post-processors nested too deep");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(o, "processors");
        if (!json_is_array(arr))
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: Sequence post-processor without \"processors\"");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) KILN_TRY(add_post(t, v, have, depth + 1));
        return KILN_OK;
    }
    if (!strcmp(type, "ByteLevel"))
        return KILN_OK; /* only adjusts offsets */
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        int32_t cls = 0, sep = 0;
        KILN_TRY(set_template(t, have));
        KILN_TRY(pair_id(o, "cls", &cls, type));
        KILN_TRY(pair_id(o, "sep", &sep, type));
        KILN_TRY(tok_push_id(&t->post_prefix, &t->n_post_prefix, cls));
        return tok_push_id(&t->post_suffix, &t->n_post_suffix, sep);
    }
    if (strcmp(type, "TemplateProcessing"))
        return unsupported("post_processor", type);
    KILN_TRY(set_template(t, have));
    json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: TemplateProcessing without a \"single\" template");
    bool seen_seq = false;
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item)
    {
        json_t *sp = json_object_get(item, "SpecialToken");
        if (!sp) {
            const char *seq = json_string_value(json_object_get(json_object_get(item, "Sequence"), "id"));
            if (!seq)
                return kiln_fail(KILN_ERROR_FORMAT,
                                 "tokenizer.json: TemplateProcessing item %zu is neither "
                                 "SpecialToken nor Sequence",
                                 i);
            if (strcmp(seq, "A"))
                return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: single template names sequence \"%s\"", seq);
            if (seen_seq)
                return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: single template has $A twice");
            seen_seq = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: template token \"%s\" has no special_tokens entry",
                             name ? name : "?");
        size_t k;
        json_t *idv;
        json_array_foreach(ids, k, idv)
        {
            int64_t x;
            if (!kiln_json_int(idv, &x) || x < 0 || x > INT32_MAX)
                return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: special token \"%s\" has a bad id", name);
            int32_t id = (int32_t)x;
            KILN_TRY(seen_seq ? tok_push_id(&t->post_suffix, &t->n_post_suffix, id)
                              : tok_push_id(&t->post_prefix, &t->n_post_prefix, id));
        }
    }
    if (!seen_seq)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: single template has no $A");
    return KILN_OK;
}

/* ---- the model ---- */

static kiln_status load_model(kiln_tokenizer *t, json_t *m, size_t n_declared)
{
    const char *type = type_of(m);
    if (!json_is_object(m))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: no \"model\" object");
    if (!type)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: model without a \"type\"");
    if (strcmp(type, "BPE"))
        return unsupported("model type", type);
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return unsupported("BPE option", "dropout");
    const char *opt[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(m, opt[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return unsupported("BPE option", opt[i]);
    }
    KILN_TRY(get_bool(m, "fuse_unk", false, &t->fuse_unk, "model"));
    KILN_TRY(get_bool(m, "byte_fallback", false, &t->byte_fallback, "model"));
    KILN_TRY(get_bool(m, "ignore_merges", false, &t->ignore_merges, "model"));

    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: model.vocab is missing or not an object");
    const char *key;
    json_t *v;
    void *iter = json_object_iter(vocab);
    while (iter) {
        key = json_object_iter_key(iter);
        v = json_object_iter_value(iter);
        int64_t id;
        if (!kiln_json_int(v, &id))
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: vocab entry \"%.64s\" has a bad id", key);
        KILN_TRY(check_id_range(id, n_declared, "vocab"));
        KILN_TRY(tok_add_vocab(t, key, strlen(key), (int32_t)id, 0.0f));
        iter = json_object_iter_next(vocab, iter);
    }
    json_t *unk = json_object_get(m, "unk_token");
    if (json_is_string(unk)) {
        t->unk_id = tok_map_get(t, &t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0)
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: unk_token \"%.64s\" is not in the vocabulary",
                             json_string_value(unk));
    } else if (unk && !json_is_null(unk)) {
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: model.unk_token is not a string");
    }

    json_t *merges = json_object_get(m, "merges");
    if (merges && !json_is_null(merges) && !json_is_array(merges))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: model.merges is not an array");
    size_t i;
    json_array_foreach(merges, i, v)
    {
        if (i > INT32_MAX)
            return kiln_fail(KILN_ERROR_LIMIT, "tokenizer.json: too many merges");
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(v)) {
            /* "a b": split at the first space. */
            a = json_string_value(v);
            const char *sp = memchr(a, ' ', json_string_length(v));
            if (!sp)
                return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: merge %zu \"%.64s\" is not \"a b\"", i, a);
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = json_string_length(v) - al - 1;
        } else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
                   json_is_string(json_array_get(v, 1))) {
            a = json_string_value(json_array_get(v, 0));
            al = json_string_length(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            bl = json_string_length(json_array_get(v, 1));
        } else {
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: merge %zu is neither \"a b\" nor [a, b]", i);
        }
        KILN_TRY(tok_add_merge(t, a, al, b, bl, (int32_t)i));
    }
    return KILN_OK;
}

static kiln_status load_added(kiln_tokenizer *t, json_t *arr, size_t n_declared)
{
    if (!arr || json_is_null(arr))
        return KILN_OK;
    if (!json_is_array(arr))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: added_tokens is not an array");
    size_t i;
    json_t *o;
    json_array_foreach(arr, i, o)
    {
        json_t *content = json_object_get(o, "content");
        int64_t id;
        if (!kiln_json_int(json_object_get(o, "id"), &id) || !json_is_string(content))
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: added_tokens[%zu] needs an id and a content", i);
        KILN_TRY(check_id_range(id, n_declared, "added token"));
        bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
        KILN_TRY(get_bool(o, "special", false, &special, "added token"));
        /* HF's default: normalized unless special. */
        KILN_TRY(get_bool(o, "normalized", !special, &normalized, "added token"));
        KILN_TRY(get_bool(o, "lstrip", false, &lstrip, "added token"));
        KILN_TRY(get_bool(o, "rstrip", false, &rstrip, "added token"));
        KILN_TRY(get_bool(o, "single_word", false, &single_word, "added token"));
        if (single_word)
            return unsupported("added token option", "single_word");
        uint8_t attr = (uint8_t)((special ? TOK_ATTR_SPECIAL : 0) | (lstrip ? TOK_ATTR_LSTRIP : 0) |
                                 (rstrip ? TOK_ATTR_RSTRIP : 0) | (normalized ? TOK_ATTR_NORMALIZED : 0));
        KILN_TRY(tok_add_added(t, json_string_value(content), json_string_length(content), (int32_t)id, attr));
    }
    return KILN_OK;
}

/* tokenizer.json has no EOS: the template's trailing special token, else an
 * added special token with a conventional name. */
static void guess_bos_eos(kiln_tokenizer *t)
{
    if (t->n_post_prefix)
        t->bos_id = t->post_prefix[0];
    if (t->n_post_suffix) {
        t->eos_id = t->post_suffix[t->n_post_suffix - 1];
        return;
    }
    static const char *const names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<eos>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && t->eos_id < 0; i++) {
        int32_t id = tok_map_get(t, &t->added_map, names[i], strlen(names[i]));
        if (id >= 0 && (t->tokens[id].attr & TOK_ATTR_SPECIAL))
            t->eos_id = id;
    }
}

static kiln_status build(kiln_tokenizer *t, json_t *root)
{
    if (!json_is_object(root))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: the top level is not an object");
    json_t *added = json_object_get(root, "added_tokens"), *model = json_object_get(root, "model");
    size_t n_declared = json_array_size(added) + json_object_size(json_object_get(model, "vocab"));
    /* Added tokens first: they name their ids for decoding. */
    KILN_TRY(load_added(t, added, n_declared));
    KILN_TRY(load_model(t, model, n_declared));
    KILN_TRY(add_normalizer(t, json_object_get(root, "normalizer"), 0));
    KILN_TRY(add_pretokenizer(t, json_object_get(root, "pre_tokenizer"), 0));
    bool have_template = false;
    KILN_TRY(add_post(t, json_object_get(root, "post_processor"), &have_template, 0));
    KILN_TRY(add_decoder(t, json_object_get(root, "decoder"), 0));
    KILN_TRY(tok_finish(t));
    guess_bos_eos(t);
    return KILN_OK;
}

kiln_status tok_build_from_json_text(const char *text, size_t len, kiln_tokenizer **out)
{
    json_error_t err;
    json_t *root = kiln_json_load_file_text(text, len, JSON_ALLOW_NUL, &err);
    if (!root)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer.json: line %d: %s", err.line, err.text);
    kiln_tokenizer *t = NULL;
    kiln_status st = tok_alloc(&t);
    if (st == KILN_OK)
        st = build(t, root);
    json_decref(root);
    if (st == KILN_OK) {
        t->source = malloc(len ? len : 1);
        if (!t->source)
            st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer.json: out of memory");
        else
            memcpy(t->source, text, len);
        t->source_len = len;
    }
    if (st != KILN_OK) {
        kiln_tokenizer_free(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}
