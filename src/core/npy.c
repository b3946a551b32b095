/* NumPy .npy reader and writer. Format reference:
 * numpy/lib/format.py ("NEP 1 — A Simple File Format for NumPy Arrays").
 *
 *   "\x93NUMPY" major minor | header length (u16 LE in 1.0, u32 LE in 2.0/3.0)
 *   | header: a Python dict literal, space-padded, ending in '\n'
 *   | raw element data, C order
 */
#include "core/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c reads and writes little-endian data in place: port it for big-endian hosts"
#endif

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

/* The largest prefix (magic, version, 4-byte header length). */
#define NPY_PREFIX_MAX 12

/* ---- descr <-> dtype -------------------------------------------------------------- */

static const struct {
    const char *descr;
    kiln_dtype dtype;
} npy_types[] = {
    {"<f4", KILN_DTYPE_F32}, {"<f2", KILN_DTYPE_F16}, {"<i4", KILN_DTYPE_I32},  {"<i8", KILN_DTYPE_I64},
    {"|i1", KILN_DTYPE_I8},  {"|u1", KILN_DTYPE_U8},  {"|b1", KILN_DTYPE_BOOL},
};

static const char *npy_descr_of(kiln_dtype t)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dtype == t)
            return npy_types[i].descr;
    return NULL;
}

/* ---- header parsing ----------------------------------------------------------------- */

typedef struct npy_header {
    kiln_dtype dtype;
    kiln_dims dims;
    size_t data_offset; /* bytes from the start of the file */
    size_t data_size;
} npy_header;

/* Cursor over the header dict text. */
typedef struct npy_lexer {
    const char *s;
    size_t n;
    size_t i;
    const char *what; /* file name for messages */
} npy_lexer;

static void lex_skip_space(npy_lexer *lx)
{
    while (lx->i < lx->n && (lx->s[lx->i] == ' ' || lx->s[lx->i] == '\t'))
        lx->i++;
}

static kiln_status lex_expect(npy_lexer *lx, char c, const char *context)
{
    lex_skip_space(lx);
    if (lx->i >= lx->n || lx->s[lx->i] != c)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: expected '%c' %s", lx->what, c, context);
    lx->i++;
    return KILN_OK;
}

/* A quoted Python string without escapes, copied into out (NUL-terminated). */
static kiln_status lex_string(npy_lexer *lx, char *out, size_t cap, const char *context)
{
    lex_skip_space(lx);
    if (lx->i >= lx->n || (lx->s[lx->i] != '\'' && lx->s[lx->i] != '"'))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: expected a quoted string %s", lx->what, context);
    char quote = lx->s[lx->i++];
    size_t len = 0;
    while (lx->i < lx->n && lx->s[lx->i] != quote) {
        char c = lx->s[lx->i++];
        if (c == '\\' || c == '\n' || len + 1 >= cap)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: unsupported string %s", lx->what, context);
        out[len++] = c;
    }
    if (lx->i >= lx->n)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: unterminated string %s", lx->what, context);
    lx->i++;
    out[len] = '\0';
    return KILN_OK;
}

static int lex_word(npy_lexer *lx, const char *word)
{
    size_t len = strlen(word);
    if (lx->n - lx->i >= len && memcmp(lx->s + lx->i, word, len) == 0) {
        lx->i += len;
        return 1;
    }
    return 0;
}

static kiln_status parse_descr(npy_lexer *lx, kiln_dtype *out)
{
    char descr[16];
    lex_skip_space(lx);
    if (lx->i < lx->n && lx->s[lx->i] == '[')
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: structured npy dtypes are not supported", lx->what);
    KILN_TRY(lex_string(lx, descr, sizeof descr, "for 'descr'"));
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++) {
        if (strcmp(descr, npy_types[i].descr) == 0) {
            *out = npy_types[i].dtype;
            return KILN_OK;
        }
    }
    return kiln_fail(KILN_ERROR_UNSUPPORTED,
                     "%s: npy dtype '%s' is not supported (expected '<f4', '<f2', '<i4', '<i8', "
                     "'|i1', '|u1' or '|b1')",
                     lx->what, descr);
}

static kiln_status parse_fortran_order(npy_lexer *lx)
{
    lex_skip_space(lx);
    if (lex_word(lx, "False"))
        return KILN_OK;
    if (lex_word(lx, "True"))
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "%s: fortran_order True is not supported (save a C-order array, e.g. "
                         "numpy.ascontiguousarray)",
                         lx->what);
    return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: 'fortran_order' must be True or False", lx->what);
}

/* A tuple of non-negative integers: "()", "(3,)", "(2, 3)", "(2, 3,)". */
static kiln_status parse_shape(npy_lexer *lx, kiln_dims *dims)
{
    kiln_dims d = {0};
    int comma = 0; /* the last item was followed by a comma */
    KILN_TRY(lex_expect(lx, '(', "to open 'shape'"));
    for (;;) {
        lex_skip_space(lx);
        if (lx->i < lx->n && lx->s[lx->i] == ')') {
            /* Python needs the comma for a 1-tuple: "(3)" is the int 3. */
            if (d.rank == 1 && !comma)
                return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: 'shape' is not a tuple", lx->what);
            lx->i++;
            break;
        }
        if (lx->i >= lx->n || lx->s[lx->i] < '0' || lx->s[lx->i] > '9')
            return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: 'shape' must be a tuple of non-negative integers",
                             lx->what);
        if (d.rank == KILN_MAX_RANK)
            return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: npy array has more than %d dims", lx->what, KILN_MAX_RANK);
        int64_t v = 0;
        while (lx->i < lx->n && lx->s[lx->i] >= '0' && lx->s[lx->i] <= '9') {
            if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (int64_t)(lx->s[lx->i] - '0'), &v))
                return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: dim %d of 'shape' overflows", lx->what, d.rank);
            lx->i++;
        }
        d.d[d.rank++] = v;
        lex_skip_space(lx);
        comma = lx->i < lx->n && lx->s[lx->i] == ',';
        if (comma) {
            lx->i++;
            continue;
        }
        if (lx->i < lx->n && lx->s[lx->i] == ')')
            continue;
        return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: expected ',' or ')' in 'shape'", lx->what);
    }
    *dims = d;
    return KILN_OK;
}

/* Parses the dict text of a header; fills dtype and dims of h. */
static kiln_status parse_dict(const char *s, size_t n, const char *what, npy_header *h)
{
    npy_lexer lx = {s, n, 0, what};
    int seen_descr = 0, seen_fortran = 0, seen_shape = 0;
    KILN_TRY(lex_expect(&lx, '{', "at the start of the header"));
    for (;;) {
        lex_skip_space(&lx);
        if (lx.i < lx.n && lx.s[lx.i] == '}') {
            lx.i++;
            break;
        }
        char key[32];
        KILN_TRY(lex_string(&lx, key, sizeof key, "as a key"));
        KILN_TRY(lex_expect(&lx, ':', "after a key"));
        int *seen;
        if (strcmp(key, "descr") == 0) {
            seen = &seen_descr;
            KILN_TRY(parse_descr(&lx, &h->dtype));
        } else if (strcmp(key, "fortran_order") == 0) {
            seen = &seen_fortran;
            KILN_TRY(parse_fortran_order(&lx));
        } else if (strcmp(key, "shape") == 0) {
            seen = &seen_shape;
            KILN_TRY(parse_shape(&lx, &h->dims));
        } else {
            return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: unknown key '%s'", what, key);
        }
        if ((*seen)++)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: duplicate key '%s'", what, key);
        lex_skip_space(&lx);
        if (lx.i < lx.n && lx.s[lx.i] == ',') {
            lx.i++;
            continue;
        }
        KILN_TRY(lex_expect(&lx, '}', "or ',' after a value"));
        break;
    }
    if (!seen_descr || !seen_fortran || !seen_shape)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: missing key '%s'", what,
                         !seen_descr     ? "descr"
                         : !seen_fortran ? "fortran_order"
                                         : "shape");
    /* Only the padding may follow: spaces and the final newline. */
    for (; lx.i < lx.n; lx.i++) {
        char c = lx.s[lx.i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return kiln_fail(KILN_ERROR_FORMAT, "%s: npy header: unexpected text after the dict", what);
    }
    return KILN_OK;
}

/* Reads the prefix in p[0..len): on success *header_at and *header_len give
 * the dict text's place. len may exceed the prefix. */
static kiln_status parse_prefix(const uint8_t *p, size_t len, const char *what, size_t *header_at, size_t *header_len)
{
    if (len < sizeof npy_magic || memcmp(p, npy_magic, sizeof npy_magic) != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: not a .npy file (bad magic)", what);
    if (len < 10)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: truncated .npy header", what);
    uint8_t major = p[6], minor = p[7];
    if (major == 1 && minor == 0) {
        *header_at = 10;
        *header_len = (size_t)p[8] | (size_t)p[9] << 8;
        return KILN_OK;
    }
    if ((major == 2 || major == 3) && minor == 0) {
        if (len < 12)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: truncated .npy header", what);
        *header_at = 12;
        *header_len = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
        return KILN_OK;
    }
    return kiln_fail(KILN_ERROR_VERSION,
                     "%s: .npy format version %u.%u is not supported "
                     "(expected 1.0, 2.0 or 3.0)",
                     what, major, minor);
}

/* Element count and byte size of the data, overflow-checked. */
static kiln_status data_size_of(npy_header *h, const char *what)
{
    size_t n = kiln_dtype_size(h->dtype);
    for (int32_t i = 0; i < h->dims.rank; i++) {
        if (kiln_mul_overflow(n, (size_t)h->dims.d[i], &n))
            return kiln_fail(KILN_ERROR_FORMAT, "%s: npy array size overflows", what);
    }
    h->data_size = n;
    return KILN_OK;
}

/* numpy writes only 0 and 1; anything else is not a kiln bool. */
static kiln_status check_bools(const uint8_t *p, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] > 1)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: bool element %zu is %u, not 0 or 1", what, i, p[i]);
    return KILN_OK;
}

kiln_status kiln_npy_parse(const void *buf, size_t len, kiln_dtype *dtype, kiln_dims *dims, const void **data,
                           size_t *size)
{
    const char *what = "npy";
    if (!buf || !dtype || !dims || !data || !size)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_npy_parse: NULL argument");
    const uint8_t *p = buf;
    size_t at, hlen, end;
    npy_header h = {0};
    KILN_TRY(parse_prefix(p, len, what, &at, &hlen));
    if (kiln_add_overflow(at, hlen, &end) || end > len)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: header length %zu runs past the end (%zu bytes)", what, hlen, len);
    KILN_TRY(parse_dict((const char *)p + at, hlen, what, &h));
    KILN_TRY(data_size_of(&h, what));
    if (len - end != h.data_size)
        return kiln_fail(KILN_ERROR_FORMAT,
                         "%s: expected %zu data bytes for shape and dtype, "
                         "found %zu",
                         what, h.data_size, len - end);
    if (h.dtype == KILN_DTYPE_BOOL)
        KILN_TRY(check_bools(p + end, h.data_size, what));
    *dtype = h.dtype;
    *dims = h.dims;
    *data = p + end;
    *size = h.data_size;
    return KILN_OK;
}

/* ---- files ------------------------------------------------------------------------ */

static kiln_status read_exact(FILE *f, void *buf, size_t n, const char *path)
{
    if (n && fread(buf, 1, n, f) != n)
        return kiln_fail(ferror(f) ? KILN_ERROR_IO : KILN_ERROR_FORMAT, "%s: file is truncated or unreadable", path);
    return KILN_OK;
}

/* The body of kiln_npy_read with the FILE opened; fills h and *data. */
static kiln_status npy_read_file(FILE *f, const char *path, npy_header *h, void **data)
{
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        return kiln_fail(KILN_ERROR_IO, "%s: not a regular file", path);
    size_t file_size = (size_t)st.st_size;
    uint8_t prefix[NPY_PREFIX_MAX];
    size_t got = fread(prefix, 1, sizeof prefix, f);
    size_t at, hlen, end;
    KILN_TRY(parse_prefix(prefix, got, path, &at, &hlen));
    if (kiln_add_overflow(at, hlen, &end) || end > file_size)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: header length %zu runs past the end of the file", path, hlen);
    char *text = malloc(hlen ? hlen : 1);
    if (!text)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory for the npy header", path);
    kiln_status s = KILN_OK;
    if (fseek(f, (long)at, SEEK_SET) != 0)
        s = kiln_fail(KILN_ERROR_IO, "%s: seek failed", path);
    if (!s)
        s = read_exact(f, text, hlen, path);
    if (!s)
        s = parse_dict(text, hlen, path, h);
    free(text);
    KILN_TRY(s);
    KILN_TRY(data_size_of(h, path));
    if (file_size - end != h->data_size)
        return kiln_fail(KILN_ERROR_FORMAT,
                         "%s: expected %zu data bytes for shape and dtype, "
                         "found %zu",
                         path, h->data_size, file_size - end);
    void *buf = malloc(h->data_size ? h->data_size : 1);
    if (!buf)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", path, h->data_size);
    s = read_exact(f, buf, h->data_size, path);
    if (!s && h->dtype == KILN_DTYPE_BOOL)
        s = check_bools(buf, h->data_size, path);
    if (s) {
        free(buf);
        return s;
    }
    *data = buf;
    return KILN_OK;
}

kiln_status kiln_npy_read(const char *path, kiln_dtype *dtype, kiln_dims *dims, void **data, size_t *size)
{
    if (!path || !dtype || !dims || !data || !size)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_npy_read: NULL argument");
    FILE *f;
    size_t file_size;
    if (kiln_file_fopen_read(path, &f, &file_size) != KILN_OK)
        return KILN_ERROR_IO;
    npy_header h = {0};
    void *buf = NULL;
    kiln_status s = npy_read_file(f, path, &h, &buf);
    fclose(f);
    KILN_TRY(s);
    *dtype = h.dtype;
    *dims = h.dims;
    *data = buf;
    *size = h.data_size;
    return KILN_OK;
}

/* Writes n elements of a bf16 buffer as f32, in chunks so no second copy of
 * the whole tensor is needed. */
static int write_bf16_as_f32(FILE *f, const uint16_t *src, size_t n)
{
    float chunk[1024];
    while (n) {
        size_t k = n < 1024 ? n : 1024;
        for (size_t i = 0; i < k; i++)
            chunk[i] = kiln_bf16_to_float(src[i]);
        if (fwrite(chunk, sizeof chunk[0], k, f) != k)
            return -1;
        src += k;
        n -= k;
    }
    return 0;
}

kiln_status kiln_npy_write(const char *path, kiln_dtype dtype, const kiln_dims *dims, const void *data)
{
    if (!path || !dims)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_npy_write: NULL argument");
    kiln_dtype file_type = dtype == KILN_DTYPE_BF16 ? KILN_DTYPE_F32 : dtype;
    const char *descr = npy_descr_of(file_type);
    if (!descr)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: dtype %s has no .npy form", path, kiln_dtype_name(dtype));
    if (dims->rank < 0 || dims->rank > KILN_MAX_RANK)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s: rank %d is out of range", path, dims->rank);
    size_t count = 1;
    for (int32_t i = 0; i < dims->rank; i++) {
        if (dims->d[i] < 0)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s: dim %d is negative (%lld)", path, i,
                             (long long)dims->d[i]);
        if (kiln_mul_overflow(count, (size_t)dims->d[i], &count))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s: element count overflows", path);
    }
    size_t bytes;
    if (kiln_mul_overflow(count, kiln_dtype_size(dtype), &bytes))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s: byte size overflows", path);
    if (bytes && !data)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_npy_write: NULL data");

    /* The dict as numpy writes it, so numpy reads it back byte for byte. */
    char dict[64 + KILN_MAX_RANK * 24];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int32_t i = 0; i < dims->rank; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%s%lld", i ? ", " : "", (long long)dims->d[i]);
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%s), }", dims->rank == 1 ? "," : "");
    /* Pad with spaces so magic + version + length + header (ending in
     * '\n') is a multiple of 64, numpy's alignment for memory mapping. */
    size_t total = 10 + (size_t)n + 1;
    size_t padded = (total + 63) / 64 * 64;
    size_t hlen = padded - 10;
    uint8_t prefix[10];
    memcpy(prefix, npy_magic, sizeof npy_magic);
    prefix[6] = 1;
    prefix[7] = 0;
    prefix[8] = (uint8_t)(hlen & 0xff);
    prefix[9] = (uint8_t)(hlen >> 8);
    char header[sizeof dict + 64];
    memcpy(header, dict, (size_t)n);
    memset(header + n, ' ', hlen - (size_t)n - 1);
    header[hlen - 1] = '\n';

    KILN_TRY(kiln_file_check_output(path));
    FILE *f = fopen(path, "wb");
    if (!f)
        return kiln_fail(KILN_ERROR_IO, "%s: cannot create: %s", path, strerror(errno));
    int bad = fwrite(prefix, 1, sizeof prefix, f) != sizeof prefix || fwrite(header, 1, hlen, f) != hlen;
    if (!bad && dtype == KILN_DTYPE_BF16)
        bad = write_bf16_as_f32(f, data, count) != 0;
    else if (!bad && bytes)
        bad = fwrite(data, 1, bytes, f) != bytes;
    if (fclose(f) != 0)
        bad = 1;
    if (bad)
        return kiln_fail(KILN_ERROR_IO, "%s: write failed: %s", path, strerror(errno));
    return KILN_OK;
}
