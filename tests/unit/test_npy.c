/* .npy reader/writer against files written by numpy (tests/data/npy, made
 * by make_fixtures.py there) and against hand-made malformed headers. */
#include "test.h"

#include <unistd.h>

#include "core/npy.h"

#define NPY_DIR "tests/data/npy/"

static int read_file(const char *path, uint8_t **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)n + 1);
    *len = *buf ? fread(*buf, 1, (size_t)n, f) : 0;
    fclose(f);
    return *len == (size_t)n ? 0 : -1;
}

static void test_read_f32(void)
{
    kiln_dtype t;
    kiln_dims d;
    void *data = NULL;
    size_t size = 0;
    CHECK_OK(kiln_npy_read(NPY_DIR "f32_2x3.npy", &t, &d, &data, &size));
    CHECK(t == KILN_DTYPE_F32);
    CHECK(d.rank == 2 && d.d[0] == 2 && d.d[1] == 3);
    CHECK(size == 24);
    const float *f = data;
    for (int i = 0; i < 6; i++)
        CHECK(f[i] == i * 0.5f - 1.0f);
    free(data);
}

static void test_read_other_dtypes(void)
{
    kiln_dtype t;
    kiln_dims d;
    void *data;
    size_t size;

    CHECK_OK(kiln_npy_read(NPY_DIR "f16_4.npy", &t, &d, &data, &size));
    CHECK(t == KILN_DTYPE_F16 && d.rank == 1 && d.d[0] == 4 && size == 8);
    /* IEEE binary16 encodings of 1, -2, 0.5, 65504 */
    const uint16_t want16[4] = {0x3c00, 0xc000, 0x3800, 0x7bff};
    CHECK(memcmp(data, want16, sizeof want16) == 0);
    free(data);

    CHECK_OK(kiln_npy_read(NPY_DIR "i32_3.npy", &t, &d, &data, &size));
    CHECK(t == KILN_DTYPE_I32 && d.rank == 1 && d.d[0] == 3);
    CHECK(((int32_t *)data)[0] == -7 && ((int32_t *)data)[2] == 2147483647);
    free(data);

    CHECK_OK(kiln_npy_read(NPY_DIR "i64_2x2.npy", &t, &d, &data, &size));
    CHECK(t == KILN_DTYPE_I64 && d.rank == 2 && size == 32);
    CHECK(((int64_t *)data)[1] == (int64_t)1 << 40);
    CHECK(((int64_t *)data)[3] == -((int64_t)1 << 62));
    free(data);

    CHECK_OK(kiln_npy_read(NPY_DIR "i8_3.npy", &t, &d, &data, &size));
    CHECK(t == KILN_DTYPE_I8 && size == 3 && ((int8_t *)data)[0] == -128);
    free(data);

    CHECK_OK(kiln_npy_read(NPY_DIR "u8_3.npy", &t, &d, &data, &size));
    CHECK(t == KILN_DTYPE_U8 && size == 3 && ((uint8_t *)data)[2] == 255);
    free(data);

    CHECK_OK(kiln_npy_read(NPY_DIR "bool_4.npy", &t, &d, &data, &size));
    const uint8_t wantb[4] = {1, 0, 0, 1};
    CHECK(t == KILN_DTYPE_BOOL && size == 4 && memcmp(data, wantb, 4) == 0);
    free(data);
}

static void test_read_shapes_and_versions(void)
{
    kiln_dtype t;
    kiln_dims d;
    void *data;
    size_t size;

    CHECK_OK(kiln_npy_read(NPY_DIR "f32_scalar.npy", &t, &d, &data, &size));
    CHECK(d.rank == 0 && size == 4 && *(float *)data == 3.25f);
    free(data);

    CHECK_OK(kiln_npy_read(NPY_DIR "f32_0x3.npy", &t, &d, &data, &size));
    CHECK(d.rank == 2 && d.d[0] == 0 && d.d[1] == 3 && size == 0 && data != NULL);
    free(data);

    const char *versions[] = {NPY_DIR "f32_v2.npy", NPY_DIR "f32_v3.npy"};
    for (int v = 0; v < 2; v++) {
        CHECK_OK(kiln_npy_read(versions[v], &t, &d, &data, &size));
        CHECK(t == KILN_DTYPE_F32 && d.rank == 1 && d.d[0] == 4);
        for (int i = 0; i < 4; i++)
            CHECK(((float *)data)[i] == (float)i);
        free(data);
    }
}

static void test_read_refused(void)
{
    kiln_dtype t = KILN_DTYPE_I8;
    kiln_dims d = {0};
    void *data = NULL;
    size_t size = 0;
    CHECK_FAILS(kiln_npy_read(NPY_DIR "fortran_2x3.npy", &t, &d, &data, &size), KILN_ERROR_UNSUPPORTED,
                "fortran_order True");
    CHECK_FAILS(kiln_npy_read(NPY_DIR "f64_2.npy", &t, &d, &data, &size), KILN_ERROR_UNSUPPORTED, "'<f8'");
    CHECK_FAILS(kiln_npy_read(NPY_DIR "f32_be_2.npy", &t, &d, &data, &size), KILN_ERROR_UNSUPPORTED, "'>f4'");
    CHECK_FAILS(kiln_npy_read(NPY_DIR "missing.npy", &t, &d, &data, &size), KILN_ERROR_IO, "missing.npy");
    /* outputs untouched on failure */
    CHECK(t == KILN_DTYPE_I8 && d.rank == 0 && data == NULL && size == 0);
}

/* What we write must be byte-identical to what numpy writes. */
static void test_write_matches_numpy(void)
{
    char dir[] = "/tmp/kiln_npy_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/out.npy", dir);

    float v[6];
    for (int i = 0; i < 6; i++)
        v[i] = i * 0.5f - 1.0f;
    kiln_dims d = {.rank = 2, .d = {2, 3}};
    CHECK_OK(kiln_npy_write(path, KILN_DTYPE_F32, &d, v));
    uint8_t *mine = NULL, *ref = NULL;
    size_t n_mine = 0, n_ref = 0;
    CHECK(read_file(path, &mine, &n_mine) == 0);
    CHECK(read_file(NPY_DIR "f32_2x3.npy", &ref, &n_ref) == 0);
    CHECK(mine && ref && n_mine == n_ref && memcmp(mine, ref, n_ref) == 0);
    free(mine);
    free(ref);

    const uint8_t b[4] = {1, 0, 0, 1};
    kiln_dims d1 = {.rank = 1, .d = {4}};
    CHECK_OK(kiln_npy_write(path, KILN_DTYPE_BOOL, &d1, b));
    CHECK(read_file(path, &mine, &n_mine) == 0);
    CHECK(read_file(NPY_DIR "bool_4.npy", &ref, &n_ref) == 0);
    CHECK(mine && ref && n_mine == n_ref && memcmp(mine, ref, n_ref) == 0);
    free(mine);
    free(ref);

    kiln_dims d0 = {.rank = 0};
    float s = 3.25f;
    CHECK_OK(kiln_npy_write(path, KILN_DTYPE_F32, &d0, &s));
    CHECK(read_file(path, &mine, &n_mine) == 0);
    CHECK(read_file(NPY_DIR "f32_scalar.npy", &ref, &n_ref) == 0);
    CHECK(mine && ref && n_mine == n_ref && memcmp(mine, ref, n_ref) == 0);
    free(mine);
    free(ref);
    unlink(path);
    rmdir(dir);
}

static void test_round_trip(void)
{
    char dir[] = "/tmp/kiln_npy_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/rt.npy", dir);
    kiln_dtype t;
    kiln_dims d;
    void *data;
    size_t size;

    const kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_I32,
                                KILN_DTYPE_I64, KILN_DTYPE_I8,  KILN_DTYPE_U8};
    uint8_t src[2 * 3 * 4 * 8];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)(i * 37 + 11);
    kiln_dims shape = {.rank = 3, .d = {2, 3, 4}};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        CHECK_OK(kiln_npy_write(path, types[k], &shape, src));
        CHECK_OK(kiln_npy_read(path, &t, &d, &data, &size));
        CHECK(t == types[k] && d.rank == 3 && d.d[0] == 2 && d.d[1] == 3 && d.d[2] == 4);
        CHECK(size == 24 * kiln_dtype_size(types[k]) && memcmp(data, src, size) == 0);
        free(data);
    }

    /* bf16 comes back as f32 with the same values: bf16 is the top half of
     * an f32, so 0x3fc0 is 1.5 and 0xc120 is -10. */
    const uint16_t bf[2] = {0x3fc0, 0xc120};
    kiln_dims d2 = {.rank = 1, .d = {2}};
    CHECK_OK(kiln_npy_write(path, KILN_DTYPE_BF16, &d2, bf));
    CHECK_OK(kiln_npy_read(path, &t, &d, &data, &size));
    CHECK(t == KILN_DTYPE_F32 && size == 8);
    CHECK(((float *)data)[0] == 1.5f && ((float *)data)[1] == -10.0f);
    free(data);

    CHECK_FAILS(kiln_npy_write(path, KILN_DTYPE_FP8_E4M3, &d2, bf), KILN_ERROR_UNSUPPORTED, "fp8_e4m3");
    kiln_dims neg = {.rank = 1, .d = {-1}};
    CHECK_FAILS(kiln_npy_write(path, KILN_DTYPE_F32, &neg, bf), KILN_ERROR_INVALID_ARGUMENT, "negative");
    unlink(path);
    rmdir(dir);
}

/* Builds a version 1.0 file from a header dict and `data_len` zero bytes. */
static size_t make_npy(uint8_t *out, const char *dict, size_t data_len)
{
    size_t n = strlen(dict);
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)(n + 1);
    out[9] = 0;
    memcpy(out + 10, dict, n);
    out[10 + n] = '\n';
    memset(out + 11 + n, 0, data_len);
    return 11 + n + data_len;
}

static void test_parse_malformed(void)
{
    uint8_t buf[512];
    kiln_dtype t;
    kiln_dims d;
    const void *data;
    size_t size, n;

    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
    CHECK_OK(kiln_npy_parse(buf, n, &t, &d, &data, &size));
    CHECK(d.rank == 2 && size == 24 && data == buf + n - 24);
    /* double quotes and no trailing comma are valid Python too */
    n = make_npy(buf, "{\"descr\": \"<i4\", \"shape\": (5,), \"fortran_order\": False}", 20);
    CHECK_OK(kiln_npy_parse(buf, n, &t, &d, &data, &size));
    CHECK(t == KILN_DTYPE_I32 && d.rank == 1 && d.d[0] == 5);

    CHECK_FAILS(kiln_npy_parse(buf, 5, &t, &d, &data, &size), KILN_ERROR_FORMAT, "bad magic");
    CHECK_FAILS(kiln_npy_parse(buf, 8, &t, &d, &data, &size), KILN_ERROR_FORMAT, "truncated");
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 23);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "expected 24 data bytes");
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 25);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "found 25");
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,3), 'x': 1}", 24);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "unknown key 'x'");
    n = make_npy(buf, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", 4);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "duplicate key 'descr'");
    n = make_npy(buf, "{'descr': '<f4', 'shape': ()}", 4);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "missing key 'fortran_order'");
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", 12);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "not a tuple");
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}", 12);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "non-negative");
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}", 12);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "True or False");
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)} x", 12);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "after the dict");
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1)}", 4);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_UNSUPPORTED, "more than 8 dims");
    /* 2^32 * 2^32 elements overflow a 64-bit byte count */
    n = make_npy(buf,
                 "{'descr': '<f4', 'fortran_order': False, "
                 "'shape': (4294967296, 4294967296)}",
                 0);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "overflows");
    n = make_npy(buf,
                 "{'descr': '<f4', 'fortran_order': False, "
                 "'shape': (99999999999999999999,)}",
                 0);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "overflows");
    n = make_npy(buf, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", 4);
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_UNSUPPORTED, "structured");
    n = make_npy(buf, "{'descr': '|b1', 'fortran_order': False, 'shape': (2,)}", 2);
    buf[n - 1] = 2;
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "bool element 1 is 2");
    /* header length past the end */
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", 0);
    buf[8] = 0xff;
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_FORMAT, "runs past the end");
    n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", 12);
    buf[6] = 4;
    CHECK_FAILS(kiln_npy_parse(buf, n, &t, &d, &data, &size), KILN_ERROR_VERSION, "version 4.0");
    /* version 2.0 with a length field cut short */
    memcpy(buf, "\x93NUMPY\x02\x00\x10\x00", 10);
    CHECK_FAILS(kiln_npy_parse(buf, 10, &t, &d, &data, &size), KILN_ERROR_FORMAT, "truncated");
}

static const test_case_ tests[] = {
    TEST(test_read_f32),        TEST(test_read_other_dtypes),   TEST(test_read_shapes_and_versions),
    TEST(test_read_refused),    TEST(test_write_matches_numpy), TEST(test_round_trip),
    TEST(test_parse_malformed),
};
TEST_MAIN(tests)
