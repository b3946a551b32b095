/* safetensors parser against files written by the reference `safetensors`
 * package (tests/data/safetensors, made by make_fixtures.py there) and
 * against hand-made malformed headers. */
#include "test.h"

#include "core/safetensors.h"

#define ST_DIR "tests/data/safetensors/"

static void test_open_small(void)
{
    kiln_safetensors *st = NULL;
    CHECK_OK(kiln_safetensors_open(ST_DIR "small.safetensors", &st));
    if (!st)
        return;
    CHECK(kiln_safetensors_count(st) == 8);

    const kiln_safetensors_tensor *t = NULL;
    CHECK_OK(kiln_safetensors_find(st, "a", &t));
    CHECK(t && t->dtype == KILN_DTYPE_F32 && t->dims.rank == 2 && t->dims.d[0] == 2 && t->dims.d[1] == 3 &&
          t->size == 24 && strcmp(t->dtype_name, "F32") == 0);
    for (int i = 0; t && i < 6; i++) {
        float v;
        memcpy(&v, (const char *)t->data + 4 * i, 4);
        CHECK(v == i * 0.5f - 1.0f);
    }
    CHECK_OK(kiln_safetensors_find(st, "b", &t));
    const uint16_t want16[2] = {0x3c00, 0xc000}; /* binary16 of 1, -2 */
    CHECK(t->dtype == KILN_DTYPE_F16 && t->size == 4 && memcmp(t->data, want16, 4) == 0);
    CHECK_OK(kiln_safetensors_find(st, "c", &t));
    int64_t c;
    memcpy(&c, t->data, 8);
    CHECK(t->dtype == KILN_DTYPE_I64 && t->dims.rank == 2 && c == 5);
    CHECK_OK(kiln_safetensors_find(st, "d", &t));
    CHECK(t->dtype == KILN_DTYPE_U8 && memcmp(t->data, "\x00\x07\xff", 3) == 0);
    CHECK_OK(kiln_safetensors_find(st, "e", &t));
    CHECK(t->dtype == KILN_DTYPE_BOOL && memcmp(t->data, "\x01\x00\x01", 3) == 0);
    CHECK_OK(kiln_safetensors_find(st, "f", &t));
    int32_t f;
    memcpy(&f, t->data, 4);
    CHECK(t->dtype == KILN_DTYPE_I32 && t->dims.rank == 0 && t->size == 4 && f == -9);
    CHECK_OK(kiln_safetensors_find(st, "g", &t));
    CHECK(t->dtype == KILN_DTYPE_I8 && ((const int8_t *)t->data)[0] == -128);
    CHECK_OK(kiln_safetensors_find(st, "empty", &t));
    CHECK(t->dims.rank == 2 && t->dims.d[0] == 0 && t->dims.d[1] == 4 && t->size == 0);

    CHECK_FAILS(kiln_safetensors_find(st, "zz", &t), KILN_ERROR_NOT_FOUND, "\"zz\"");

    /* listed in file order: data offsets never decrease */
    const char *prev_end = NULL;
    for (int32_t i = 0; i < kiln_safetensors_count(st); i++) {
        const kiln_safetensors_tensor *ti = kiln_safetensors_tensor_at(st, i);
        CHECK(ti != NULL);
        if (prev_end)
            CHECK((const char *)ti->data == prev_end);
        prev_end = (const char *)ti->data + ti->size;
    }
    CHECK(kiln_safetensors_tensor_at(st, 8) == NULL);

    CHECK(kiln_safetensors_metadata_count(st) == 2);
    CHECK(kiln_safetensors_metadata(st, "format") && strcmp(kiln_safetensors_metadata(st, "format"), "pt") == 0);
    CHECK(kiln_safetensors_metadata(st, "note") && strcmp(kiln_safetensors_metadata(st, "note"), "kiln") == 0);
    CHECK(kiln_safetensors_metadata(st, "missing") == NULL);
    kiln_safetensors_destroy(st);
}

static void test_open_mixed(void)
{
    kiln_safetensors *st = NULL;
    CHECK_OK(kiln_safetensors_open(ST_DIR "mixed.safetensors", &st));
    if (!st)
        return;
    CHECK(kiln_safetensors_count(st) == 3);
    const kiln_safetensors_tensor *t = NULL;
    CHECK_OK(kiln_safetensors_find(st, "w", &t));
    CHECK(t->dtype == KILN_DTYPE_BF16 && t->size == 4 && memcmp(t->data, "\xc0\x3f\x20\xc1", 4) == 0);
    CHECK_OK(kiln_safetensors_find(st, "y", &t));
    CHECK(t->dtype == KILN_DTYPE_FP8_E4M3 && ((const uint8_t *)t->data)[0] == 0x38);
    /* F64 is listed (so a reader can skip it) but refused by name */
    CHECK_FAILS(kiln_safetensors_find(st, "x", &t), KILN_ERROR_UNSUPPORTED, "dtype F64");
    int seen_f64 = 0;
    for (int32_t i = 0; i < kiln_safetensors_count(st); i++) {
        const kiln_safetensors_tensor *ti = kiln_safetensors_tensor_at(st, i);
        if (strcmp(ti->name, "x") == 0)
            seen_f64 = ti->dtype == KILN_DTYPE_COUNT && ti->size == 16;
    }
    CHECK(seen_f64);
    kiln_safetensors_destroy(st);
    kiln_safetensors_destroy(NULL);
}

/* [u64 LE header length][header][data_len bytes of 0x5a] */
static size_t make_st(uint8_t *out, const char *header, size_t data_len)
{
    size_t n = strlen(header);
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(out + 8, header, n);
    memset(out + 8 + n, 0x5a, data_len);
    return 8 + n + data_len;
}

static void test_parse_malformed(void)
{
    uint8_t buf[1024];
    kiln_safetensors *st = NULL;
    size_t n;

#define BAD(header, data_len, status, needle) \
    do { \
        n = make_st(buf, header, data_len); \
        CHECK_FAILS(kiln_safetensors_parse(buf, n, "t.st", &st), status, needle); \
        CHECK(st == NULL); \
    } while (0)

    n = make_st(buf, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ", 8);
    CHECK_OK(kiln_safetensors_parse(buf, n, "t.st", &st));
    kiln_safetensors_destroy(st);
    st = NULL;
    n = make_st(buf, "{}", 0);
    CHECK_OK(kiln_safetensors_parse(buf, n, NULL, &st));
    CHECK(kiln_safetensors_count(st) == 0);
    kiln_safetensors_destroy(st);
    st = NULL;

    CHECK_FAILS(kiln_safetensors_parse(buf, 7, "t.st", &st), KILN_ERROR_FORMAT, "too short");
    n = make_st(buf, "{}", 0);
    buf[0] = 200;
    CHECK_FAILS(kiln_safetensors_parse(buf, n, "t.st", &st), KILN_ERROR_FORMAT, "runs past the end");
    buf[0] = 0;
    buf[7] = 0x80; /* 2^63: larger than any limit */
    CHECK_FAILS(kiln_safetensors_parse(buf, n, "t.st", &st), KILN_ERROR_FORMAT, "limit");
    BAD(" {}", 0, KILN_ERROR_FORMAT, "start with '{'");
    BAD("{\"a\":", 0, KILN_ERROR_FORMAT, "header JSON");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
        8, KILN_ERROR_FORMAT, "header JSON");
    BAD("{\"a\":[1]}", 0, KILN_ERROR_FORMAT, "tensor \"a\": expected an object");
    BAD("{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, KILN_ERROR_FORMAT,
        "unknown dtype \"Q4\"");
    BAD("{\"a\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, KILN_ERROR_FORMAT, "field \"dtype\"");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, KILN_ERROR_FORMAT,
        "dim 0 is not a non-negative integer");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, KILN_ERROR_FORMAT, "dim 0");
    /* integers beyond int64 read (as reals) and are refused by range */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[100000000000000000000000],\"data_offsets\":[0,4]}}", 4, KILN_ERROR_FORMAT,
        "dim 0");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1000000000000000019884624838656]}}", 4,
        KILN_ERROR_FORMAT, "data_offsets");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}", 4, KILN_ERROR_FORMAT, "field \"shape\"");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, KILN_ERROR_UNSUPPORTED,
        "rank 9");
    /* 2^32 * 2^32 elements overflow a 64-bit count */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, KILN_ERROR_FORMAT,
        "overflows");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, KILN_ERROR_FORMAT,
        "outside the data region");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, KILN_ERROR_FORMAT,
        "outside the data region");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,-8]}}", 8, KILN_ERROR_FORMAT, "data_offsets");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, KILN_ERROR_FORMAT, "data_offsets");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,6]}}", 6, KILN_ERROR_FORMAT,
        "span 6 bytes but shape and dtype F32 need 8");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, KILN_ERROR_FORMAT, "expected 0");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        4, KILN_ERROR_FORMAT, "overlap");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, KILN_ERROR_FORMAT,
        "cover 4 bytes of a 6 byte");
    BAD("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1, KILN_ERROR_FORMAT, "whole bytes");
    BAD("{\"__metadata__\":{\"k\":1}}", 0, KILN_ERROR_FORMAT, "value of \"k\" is not a string");
    BAD("{\"__metadata__\":[]}", 0, KILN_ERROR_FORMAT, "\"__metadata__\": expected an object");
    BAD("[]", 0, KILN_ERROR_FORMAT, "start with '{'");
#undef BAD
}

static void test_open_errors(void)
{
    kiln_safetensors *st = NULL;
    CHECK_FAILS(kiln_safetensors_open(ST_DIR "missing.safetensors", &st), KILN_ERROR_IO, "missing.safetensors");
    CHECK_FAILS(kiln_safetensors_open(ST_DIR "make_fixtures.py", &st), KILN_ERROR_FORMAT, "make_fixtures.py");
    CHECK(st == NULL);
}

static const test_case_ tests[] = {
    TEST(test_open_small),
    TEST(test_open_mixed),
    TEST(test_parse_malformed),
    TEST(test_open_errors),
};
TEST_MAIN(tests)
