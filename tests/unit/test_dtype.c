/* dtype conversions, names, status names, last error and logging.
 * Expected bit patterns come from the IEEE 754 binary16 definition and the
 * bfloat16 definition (upper half of binary32), worked by hand. */
#include "test.h"

#include <pthread.h>

#include "core/dtype.h"
#include "core/error.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_half_known_values(void)
{
    CHECK(kiln_half_to_float(0x3C00) == 1.0f);
    CHECK(kiln_half_to_float(0xC000) == -2.0f);
    CHECK(kiln_half_to_float(0x7BFF) == 65504.0f);
    CHECK(kiln_half_to_float(0x0001) == ldexpf(1.0f, -24));
    CHECK(kiln_half_to_float(0x03FF) == ldexpf(1023.0f, -24));
    CHECK(kiln_half_to_float(0x0400) == ldexpf(1.0f, -14));
    CHECK(kiln_half_to_float(0x3555) == 0.333251953125f);
    CHECK(bits(kiln_half_to_float(0x8000)) == 0x80000000u);
    CHECK(isinf(kiln_half_to_float(0x7C00)) && kiln_half_to_float(0x7C00) > 0);
    CHECK(isinf(kiln_half_to_float(0xFC00)) && kiln_half_to_float(0xFC00) < 0);
    CHECK(isnan(kiln_half_to_float(0x7E00)));
    CHECK(isnan(kiln_half_to_float(0x7C01)));

    CHECK(kiln_float_to_half(1.0f) == 0x3C00);
    CHECK(kiln_float_to_half(-2.0f) == 0xC000);
    CHECK(kiln_float_to_half(65504.0f) == 0x7BFF);
    CHECK(kiln_float_to_half(1.0f / 3.0f) == 0x3555);
    CHECK(kiln_float_to_half(ldexpf(1.0f, -24)) == 0x0001);
    CHECK(kiln_float_to_half(ldexpf(1.0f, -14)) == 0x0400);
    CHECK(kiln_float_to_half(-0.0f) == 0x8000);
    CHECK(kiln_float_to_half(INFINITY) == 0x7C00);
    CHECK(kiln_float_to_half(-INFINITY) == 0xFC00);
    uint16_t n = kiln_float_to_half(NAN);
    CHECK((n & 0x7C00) == 0x7C00 && (n & 0x03FF) != 0);
    /* a signalling NaN whose payload sits only in the low bits must stay NaN */
    n = kiln_float_to_half(from_bits(0x7F800001u));
    CHECK((n & 0x7C00) == 0x7C00 && (n & 0x03FF) != 0);
}

static void test_half_rounding(void)
{
    /* 1 + 2^-11 is halfway between 1 (0x3C00, even) and 1 + 2^-10 (0x3C01). */
    CHECK(kiln_float_to_half(1.0f + ldexpf(1.0f, -11)) == 0x3C00);
    /* 1 + 3*2^-11 is halfway between 0x3C01 (odd) and 0x3C02 (even). */
    CHECK(kiln_float_to_half(1.0f + 3.0f * ldexpf(1.0f, -11)) == 0x3C02);
    /* just above the tie rounds up */
    CHECK(kiln_float_to_half(1.0f + ldexpf(1.0f, -11) + ldexpf(1.0f, -20)) == 0x3C01);
    /* 65519 rounds down to 65504; 65520 is the tie to 2^16 (odd 0x7BFF) -> Inf */
    CHECK(kiln_float_to_half(65519.0f) == 0x7BFF);
    CHECK(kiln_float_to_half(65520.0f) == 0x7C00);
    CHECK(kiln_float_to_half(1e6f) == 0x7C00);
    CHECK(kiln_float_to_half(-1e6f) == 0xFC00);
    /* subnormals: 2^-25 is the tie between 0 and 2^-24 -> 0 (even) */
    CHECK(kiln_float_to_half(ldexpf(1.0f, -25)) == 0x0000);
    CHECK(kiln_float_to_half(ldexpf(1.0f, -25) + ldexpf(1.0f, -35)) == 0x0001);
    CHECK(kiln_float_to_half(3.0f * ldexpf(1.0f, -25)) == 0x0002); /* tie 1|2 -> 2 */
    CHECK(kiln_float_to_half(5.0f * ldexpf(1.0f, -25)) == 0x0002); /* tie 2|3 -> 2 */
    CHECK(kiln_float_to_half(ldexpf(1.0f, -30)) == 0x0000);
    CHECK(kiln_float_to_half(-ldexpf(1.0f, -24)) == 0x8001);
    /* 2^-14 - 2^-25 is the tie between 0x03FF (odd) and 0x0400 -> 0x0400 */
    CHECK(kiln_float_to_half(ldexpf(1.0f, -14) - ldexpf(1.0f, -25)) == 0x0400);
}

/* Every half value, against the definition
 * (-1)^s * (e == 0 ? m * 2^-24 : (1024 + m) * 2^(e - 25)), and back. */
static void test_half_exhaustive(void)
{
    int bad_value = 0, bad_round_trip = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint32_t e = (h >> 10) & 31, m = h & 1023;
        float f = kiln_half_to_float((uint16_t)h);
        if (e == 31) {
            if (m ? !isnan(f) : !isinf(f))
                bad_value++;
            continue;
        }
        double ref = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, (int)e - 25);
        if (h & 0x8000)
            ref = -ref;
        if ((double)f != ref || (h & 0x8000) != ((bits(f) >> 16) & 0x8000))
            bad_value++;
        if (kiln_float_to_half(f) != h)
            bad_round_trip++;
    }
    CHECK(bad_value == 0);
    CHECK(bad_round_trip == 0);
}

static void test_bf16(void)
{
    CHECK(kiln_bf16_to_float(0x3F80) == 1.0f);
    CHECK(kiln_bf16_to_float(0xC000) == -2.0f);
    CHECK(kiln_float_to_bf16(1.0f) == 0x3F80);
    /* pi = 0x40490FDB: the dropped half 0x0FDB is below the tie */
    CHECK(kiln_float_to_bf16(3.14159265f) == 0x4049);
    /* ties: 0x3F808000 between 0x3F80 (even) and 0x3F81 */
    CHECK(kiln_float_to_bf16(from_bits(0x3F808000u)) == 0x3F80);
    CHECK(kiln_float_to_bf16(from_bits(0x3F818000u)) == 0x3F82);
    CHECK(kiln_float_to_bf16(from_bits(0x3F808001u)) == 0x3F81);
    /* the largest float rounds past the largest bf16 (0x7F7F, odd) to Inf */
    CHECK(kiln_float_to_bf16(from_bits(0x7F7FFFFFu)) == 0x7F80);
    CHECK(kiln_float_to_bf16(INFINITY) == 0x7F80);
    CHECK(kiln_float_to_bf16(-INFINITY) == 0xFF80);
    CHECK(kiln_float_to_bf16(from_bits(0x7FC00000u)) == 0x7FC0);
    uint16_t n = kiln_float_to_bf16(from_bits(0x7F800001u));
    CHECK((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);
    /* bf16 subnormal: 0x0001 is 2^-133 */
    CHECK(kiln_bf16_to_float(0x0001) == ldexpf(1.0f, -133));
}

static void test_load_store(void)
{
    int8_t i8[6];
    kiln_store_f32(i8, KILN_DTYPE_I8, 0, 300.7f);
    kiln_store_f32(i8, KILN_DTYPE_I8, 1, -300.0f);
    kiln_store_f32(i8, KILN_DTYPE_I8, 2, 3.9f);
    kiln_store_f32(i8, KILN_DTYPE_I8, 3, -3.9f);
    kiln_store_f32(i8, KILN_DTYPE_I8, 4, NAN);
    kiln_store_f32(i8, KILN_DTYPE_I8, 5, -128.5f);
    CHECK(i8[0] == 127 && i8[1] == -128 && i8[2] == 3 && i8[3] == -3 && i8[4] == 0 && i8[5] == -128);
    uint8_t u8[3];
    kiln_store_f32(u8, KILN_DTYPE_U8, 0, -1.0f);
    kiln_store_f32(u8, KILN_DTYPE_U8, 1, 255.9f);
    kiln_store_f32(u8, KILN_DTYPE_U8, 2, 1000.0f);
    CHECK(u8[0] == 0 && u8[1] == 255 && u8[2] == 255);
    int32_t i32[3];
    kiln_store_f32(i32, KILN_DTYPE_I32, 0, 3e9f);
    kiln_store_f32(i32, KILN_DTYPE_I32, 1, -3e9f);
    kiln_store_f32(i32, KILN_DTYPE_I32, 2, -7.5f);
    CHECK(i32[0] == INT32_MAX && i32[1] == INT32_MIN && i32[2] == -7);
    int64_t i64[2];
    kiln_store_f32(i64, KILN_DTYPE_I64, 0, 1e19f);
    kiln_store_f32(i64, KILN_DTYPE_I64, 1, -1e19f);
    CHECK(i64[0] == INT64_MAX && i64[1] == INT64_MIN);
    uint8_t b[3];
    kiln_store_f32(b, KILN_DTYPE_BOOL, 0, 0.5f);
    kiln_store_f32(b, KILN_DTYPE_BOOL, 1, 0.0f);
    kiln_store_f32(b, KILN_DTYPE_BOOL, 2, -2.0f);
    CHECK(b[0] == 1 && b[1] == 0 && b[2] == 1);
    uint16_t h[2];
    kiln_store_f32(h, KILN_DTYPE_F16, 1, 65504.0f);
    CHECK(h[1] == 0x7BFF);
    kiln_store_f32(h, KILN_DTYPE_BF16, 0, 1.0f);
    CHECK(h[0] == 0x3F80);
    CHECK(kiln_load_f32(h, KILN_DTYPE_F16, 1) == 65504.0f);
    CHECK(kiln_load_f32(i8, KILN_DTYPE_I8, 1) == -128.0f);
    CHECK(kiln_load_f32(u8, KILN_DTYPE_U8, 1) == 255.0f);
    CHECK(kiln_load_f32(b, KILN_DTYPE_BOOL, 2) == 1.0f);
    CHECK(kiln_load_f32(i64, KILN_DTYPE_I64, 1) == -9223372036854775808.0f);
    uint8_t fp8 = 0x38;
    CHECK(isnan(kiln_load_f32(&fp8, KILN_DTYPE_FP8_E4M3, 0)));
}

static void test_convert(void)
{
    /* 123456789 is not representable in f32 (nearest is 123456792): integer
     * pairs must not go through float. */
    int32_t a[3] = {123456789, -5, INT32_MIN};
    int64_t w[3];
    kiln_convert(w, KILN_DTYPE_I64, a, KILN_DTYPE_I32, 3);
    CHECK(w[0] == 123456789 && w[1] == -5 && w[2] == INT32_MIN);
    int64_t big[3] = {(int64_t)1 << 40, -((int64_t)1 << 40), 77};
    int32_t n[3];
    kiln_convert(n, KILN_DTYPE_I32, big, KILN_DTYPE_I64, 3);
    CHECK(n[0] == INT32_MAX && n[1] == INT32_MIN && n[2] == 77);
    uint8_t u[3];
    kiln_convert(u, KILN_DTYPE_U8, a, KILN_DTYPE_I32, 3);
    CHECK(u[0] == 255 && u[1] == 0 && u[2] == 0);
    float f[4] = {1.0f, -2.0f, 65504.0f, 0.5f};
    uint16_t h[4], bf[4];
    kiln_convert(h, KILN_DTYPE_F16, f, KILN_DTYPE_F32, 4);
    CHECK(h[0] == 0x3C00 && h[1] == 0xC000 && h[2] == 0x7BFF && h[3] == 0x3800);
    kiln_convert(bf, KILN_DTYPE_BF16, h, KILN_DTYPE_F16, 4);
    CHECK(bf[0] == 0x3F80 && bf[1] == 0xC000 && bf[3] == 0x3F00);
    /* 65504 = 0x477FE000: the dropped half 0xE000 is above the tie, so it
     * rounds up to 0x4780 (65536) */
    CHECK(bf[2] == 0x4780);
    float g[4];
    kiln_convert(g, KILN_DTYPE_F32, h, KILN_DTYPE_F16, 4);
    CHECK(g[0] == 1.0f && g[1] == -2.0f && g[2] == 65504.0f && g[3] == 0.5f);
    int32_t t[2];
    float src[2] = {-1.9f, 2.9f};
    kiln_convert(t, KILN_DTYPE_I32, src, KILN_DTYPE_F32, 2);
    CHECK(t[0] == -1 && t[1] == 2);
    float same[2];
    kiln_convert(same, KILN_DTYPE_F32, src, KILN_DTYPE_F32, 2);
    CHECK(same[0] == -1.9f && same[1] == 2.9f);
}

static void test_names(void)
{
    CHECK(strcmp(kiln_version(), "0.1.0") == 0);
    CHECK(strcmp(kiln_dtype_name(KILN_DTYPE_BF16), "bf16") == 0);
    CHECK(strcmp(kiln_dtype_name(KILN_DTYPE_COUNT), "?") == 0);
    static const size_t sizes[KILN_DTYPE_COUNT] = {4, 2, 2, 1, 1, 4, 8, 1, 1, 1};
    for (int i = 0; i < KILN_DTYPE_COUNT; i++) {
        kiln_dtype d;
        CHECK_OK(kiln_dtype_parse(kiln_dtype_name((kiln_dtype)i), &d));
        CHECK(d == (kiln_dtype)i);
        CHECK(kiln_dtype_size((kiln_dtype)i) == sizes[i]);
    }
    CHECK(kiln_dtype_size(KILN_DTYPE_COUNT) == 0);
    CHECK(kiln_dtype_size((kiln_dtype)-1) == 0);
    kiln_dtype d = KILN_DTYPE_I8;
    CHECK_FAILS(kiln_dtype_parse("float32", &d), KILN_ERROR_INVALID_ARGUMENT, "\"float32\"");
    CHECK(d == KILN_DTYPE_I8);
    CHECK(strcmp(kiln_backend_name(KILN_BACKEND_CPU), "cpu") == 0);
    CHECK(strcmp(kiln_backend_name(KILN_BACKEND_CUDA), "cuda") == 0);
    CHECK(kiln_dtype_is_float(KILN_DTYPE_BF16) && !kiln_dtype_is_float(KILN_DTYPE_I32));
    CHECK(kiln_dtype_is_integer(KILN_DTYPE_BOOL) && !kiln_dtype_is_integer(KILN_DTYPE_FP8_E5M2));
}

static void test_status_and_errors(void)
{
    CHECK(strcmp(kiln_status_name(KILN_OK), "KILN_OK") == 0);
    CHECK(strcmp(kiln_status_name(KILN_ERROR_SHAPE), "KILN_ERROR_SHAPE") == 0);
    CHECK(strcmp(kiln_status_name(KILN_ERROR_LIMIT), "KILN_ERROR_LIMIT") == 0);
    CHECK(strcmp(kiln_status_name(KILN_STATUS_COUNT), "KILN_ERROR_UNKNOWN") == 0);
    for (int i = 0; i < KILN_STATUS_COUNT; i++)
        CHECK(strncmp(kiln_status_name((kiln_status)i), "KILN_", 5) == 0);

    kiln_clear_error();
    CHECK(strcmp(kiln_last_error(), "") == 0);
    CHECK(kiln_fail(KILN_ERROR_IO, "cannot open \"%s\"\nline two\r", "x.bin") == KILN_ERROR_IO);
    CHECK(strcmp(kiln_last_error(), "cannot open \"x.bin\" line two ") == 0);
    CHECK(kiln_fail_context(KILN_ERROR_IO, "layer \"%s\"", "fc1") == KILN_ERROR_IO);
    CHECK(strcmp(kiln_last_error(), "layer \"fc1\": cannot open \"x.bin\" line two ") == 0);
    kiln_clear_error();
    kiln_fail_context(KILN_ERROR_PLUGIN, "plugin %d", 3);
    CHECK(strcmp(kiln_last_error(), "plugin 3") == 0);

    /* a very long message is cut, still one terminated line */
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kiln_fail(KILN_ERROR_IO, "%s", big);
    kiln_fail_context(KILN_ERROR_IO, "%s", big);
    CHECK(strlen(kiln_last_error()) > 500 && strlen(kiln_last_error()) < sizeof big);

    char *s = kiln_strdup("abc");
    CHECK(s && strcmp(s, "abc") == 0);
    free(s);
    CHECK(kiln_strdup(NULL) == NULL);
}

static void *fail_in_thread(void *arg)
{
    kiln_fail(KILN_ERROR_INTERNAL, "from the other thread");
    *(int *)arg = strcmp(kiln_last_error(), "from the other thread") == 0;
    return NULL;
}

static void test_error_is_thread_local(void)
{
    kiln_fail(KILN_ERROR_IO, "main thread");
    int ok = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, fail_in_thread, &ok) == 0);
    pthread_join(t, NULL);
    CHECK(ok);
    CHECK(strcmp(kiln_last_error(), "main thread") == 0);
}

typedef struct log_capture {
    int count;
    kiln_log_level level;
    char last[256];
} log_capture;

static void capture(void *user, kiln_log_level level, const char *message)
{
    log_capture *c = user;
    c->count++;
    c->level = level;
    snprintf(c->last, sizeof c->last, "%s", message);
}

static void test_log_sink(void)
{
    log_capture c = {0};
    kiln_set_log(capture, &c, KILN_LOG_INFO);
    kiln_log(KILN_LOG_INFO, "pass %s removed %d layers\n", "dce", 3);
    CHECK(c.count == 1 && c.level == KILN_LOG_INFO && strcmp(c.last, "pass dce removed 3 layers ") == 0);
    kiln_log(KILN_LOG_DEBUG, "too verbose");
    CHECK(c.count == 1);
    kiln_log(KILN_LOG_ERROR, "bad");
    CHECK(c.count == 2 && c.level == KILN_LOG_ERROR);
    kiln_set_log(NULL, NULL, KILN_LOG_DEBUG);
    kiln_log(KILN_LOG_INFO, "goes nowhere: default shows only warnings and errors");
    CHECK(c.count == 2);
}

static const test_case_ tests[] = {
    TEST(test_half_known_values),
    TEST(test_half_rounding),
    TEST(test_half_exhaustive),
    TEST(test_bf16),
    TEST(test_load_store),
    TEST(test_convert),
    TEST(test_names),
    TEST(test_status_and_errors),
    TEST(test_error_is_thread_local),
    TEST(test_log_sink),
};
TEST_MAIN(tests)
