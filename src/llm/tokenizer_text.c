/* Text helpers every part of the tokenizer uses: UTF-8, GPT-2's byte <->
 * character mapping, growable buffers. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "llm/tokenizer_internal.h"

/* ---- UTF-8 -------------------------------------------------------------- */

/* Length of the longest valid-so-far prefix of the sequence at s (1..4)
 * and whether it is complete: returns the sequence length when complete and
 * valid, 0 when s[0..n) is a valid but incomplete prefix, or -k when the
 * first k bytes are a maximal invalid subpart (one U+FFFD). */
int tok_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char b = s[0];
    if (b < 0x80)
        return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0)
            lo = 0xA0;
        if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0)
            lo = 0x90;
        if (b == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n)
            return 0;
        unsigned char lim_lo = k == 1 ? lo : 0x80, lim_hi = k == 1 ? hi : 0xBF;
        if (s[k] < lim_lo || s[k] > lim_hi)
            return -k;
    }
    return need;
}

size_t tok_utf8_valid_prefix(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        int r = tok_utf8_seq(u + i, len - i);
        if (r <= 0)
            return i;
        i += (size_t)r;
    }
    return len;
}

/* Decodes one code point of valid UTF-8. */
uint32_t tok_utf8_decode(const unsigned char *s, size_t *n)
{
    if (s[0] < 0x80) {
        *n = 1;
        return s[0];
    }
    if (s[0] < 0xE0) {
        *n = 2;
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (s[0] < 0xF0) {
        *n = 3;
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *n = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

size_t tok_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Rust's char::is_whitespace (Unicode White_Space), which HF uses for the
 * lstrip/rstrip of added tokens. */
bool tok_is_unicode_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- GPT-2's byte <-> unicode mapping ------------------------------------- */

/* Printable Latin-1 bytes map to themselves; the others, in order, to
 * U+0100 onwards, so every byte is a visible character. */
static uint16_t byte_to_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return (uint16_t)b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
            n++;
    return (uint16_t)(256 + n);
}

static tok_byte_tables g_bytes;
static pthread_once_t g_bytes_once = PTHREAD_ONCE_INIT;

static void byte_tables_init(void)
{
    for (unsigned i = 0; i < 324; i++)
        g_bytes.dec[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        uint16_t cp = byte_to_cp(b);
        g_bytes.enc_len[b] = (uint8_t)tok_utf8_encode(cp, g_bytes.enc[b]);
        g_bytes.dec[cp] = (int16_t)b;
    }
}

const tok_byte_tables *tok_byte_tables_get(void)
{
    pthread_once(&g_bytes_once, byte_tables_init);
    return &g_bytes;
}

/* ---- growable buffers ------------------------------------------------------- */

kiln_status tok_buf_reserve(tok_buf *b, size_t extra)
{
    size_t need;
    if (kiln_add_overflow(b->len, extra, &need))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: buffer size overflows");
    if (need <= b->cap)
        return KILN_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (kiln_mul_overflow(cap, 2, &cap))
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: buffer size overflows");
    }
    char *p = realloc(b->p, cap);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory growing a buffer to %zu bytes", cap);
    b->p = p;
    b->cap = cap;
    return KILN_OK;
}

kiln_status tok_buf_put(tok_buf *b, const void *s, size_t n)
{
    KILN_TRY(tok_buf_reserve(b, n));
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    return KILN_OK;
}


kiln_status tok_ids_push(tok_ids *ids, int32_t id)
{
    VEC_GROW(ids->v, ids->n, ids->cap, "token ids");
    ids->v[ids->n++] = id;
    return KILN_OK;
}

kiln_status tok_push_id(int32_t **arr, size_t *n, int32_t id)
{
    int32_t *p = realloc(*arr, (*n + 1) * sizeof *p);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    p[(*n)++] = id;
    *arr = p;
    return KILN_OK;
}
