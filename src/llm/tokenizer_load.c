/* Loading a tokenizer from files or memory (tokenizer.json, llama2.c's
 * tokenizer.bin) and the serialized form kept in an engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "llm/tokenizer_internal.h"

/* ---- serialization -------------------------------------------------------------------- */

/* "kiln-tokenizer 1 <hf|vocab> <bos> <eos>\n" then the JSON it was built from. */
kiln_status kiln_tokenizer_serialize(const kiln_tokenizer *tok, void **data, size_t *len)
{
    if (!tok || !data || !len)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_serialize: NULL argument");
    char head[96];
    int hn = snprintf(head, sizeof head, "kiln-tokenizer 1 %s %d %d\n", tok->source_is_vocab ? "vocab" : "hf",
                      (int)tok->bos_id, (int)tok->eos_id);
    size_t total = (size_t)hn + tok->source_len;
    char *p = malloc(total);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "kiln_tokenizer_serialize: out of memory for %zu bytes", total);
    memcpy(p, head, (size_t)hn);
    memcpy(p + hn, tok->source, tok->source_len);
    *data = p;
    *len = total;
    return KILN_OK;
}

static bool parse_int(const char **p, const char *end, long *out)
{
    const char *s = *p;
    bool neg = false;
    if (s < end && *s == '-') {
        neg = true;
        s++;
    }
    long v = 0;
    const char *digits = s;
    while (s < end && *s >= '0' && *s <= '9' && s - digits < 10)
        v = v * 10 + (*s++ - '0');
    if (s == digits)
        return false;
    *out = neg ? -v : v;
    *p = s;
    return true;
}

kiln_status kiln_tokenizer_deserialize(const void *data, size_t len, kiln_tokenizer **out)
{
    if (!data || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_deserialize: NULL argument");
    const char *p = data, *end = p + len;
    static const char magic[] = "kiln-tokenizer 1 ";
    if (len < sizeof magic - 1 || memcmp(p, magic, sizeof magic - 1) != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "serialized tokenizer: bad header (expected \"kiln-tokenizer 1\")");
    p += sizeof magic - 1;
    bool vocab;
    if (end - p >= 6 && memcmp(p, "vocab ", 6) == 0) {
        vocab = true;
        p += 6;
    } else if (end - p >= 3 && memcmp(p, "hf ", 3) == 0) {
        vocab = false;
        p += 3;
    } else {
        return kiln_fail(KILN_ERROR_FORMAT, "serialized tokenizer: unknown source kind");
    }
    long bos, eos;
    if (!parse_int(&p, end, &bos) || p >= end || *p++ != ' ' || !parse_int(&p, end, &eos) || p >= end || *p++ != '\n')
        return kiln_fail(KILN_ERROR_FORMAT, "serialized tokenizer: bad bos/eos in the header");
    kiln_tokenizer *t;
    KILN_TRY(vocab ? tok_build_from_vocab_json(p, (size_t)(end - p), &t)
                   : tok_build_from_json_text(p, (size_t)(end - p), &t));
    if (bos < -1 || eos < -1 || bos > INT32_MAX || eos > INT32_MAX) {
        kiln_tokenizer_free(t);
        return kiln_fail(KILN_ERROR_FORMAT, "serialized tokenizer: bos/eos out of range");
    }
    kiln_status st = kiln_tokenizer_set_bos_eos(t, (int32_t)bos, (int32_t)eos);
    if (st != KILN_OK) {
        kiln_tokenizer_free(t);
        return kiln_fail_context(KILN_ERROR_FORMAT, "serialized tokenizer");
    }
    *out = t;
    return KILN_OK;
}

/* ---- loading files ------------------------------------------------------------------------ */

static kiln_status read_file(const char *path, char **data, size_t *len)
{
    FILE *f;
    size_t size;
    if (kiln_file_fopen_read(path, &f, &size) != KILN_OK)
        return kiln_fail_context(KILN_ERROR_IO, "tokenizer");
    tok_buf b = {0};
    char chunk[65536];
    size_t n;
    kiln_status st = KILN_OK;
    while (st == KILN_OK && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        st = tok_buf_put(&b, chunk, n);
    if (st == KILN_OK && ferror(f))
        st = kiln_fail(KILN_ERROR_IO, "tokenizer: cannot read \"%s\"", path);
    fclose(f);
    if (st == KILN_OK)
        st = tok_buf_put(&b, "", 1);
    if (st != KILN_OK) {
        free(b.p);
        return st;
    }
    *data = b.p;
    *len = b.len - 1;
    return KILN_OK;
}

kiln_status kiln_tokenizer_load_json(const char *path, kiln_tokenizer **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_load_json: NULL argument");
    char *data;
    size_t len;
    KILN_TRY(read_file(path, &data, &len));
    kiln_status st = tok_build_from_json_text(data, len, out);
    free(data);
    if (st != KILN_OK)
        return kiln_fail_context(st, "%s", path);
    return KILN_OK;
}

kiln_status kiln_tokenizer_load_json_memory(const void *data, size_t len, kiln_tokenizer **out)
{
    if (!data || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_load_json_memory: NULL argument");
    return tok_build_from_json_text(data, len, out);
}

kiln_status kiln_tokenizer_load_llama2c(const char *path, int32_t vocab_size, kiln_tokenizer **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_load_llama2c: NULL argument");
    char *data;
    size_t len;
    KILN_TRY(read_file(path, &data, &len));
    kiln_status st = kiln_tokenizer_load_llama2c_memory(data, len, vocab_size, out);
    free(data);
    if (st != KILN_OK)
        return kiln_fail_context(st, "%s", path);
    return KILN_OK;
}
