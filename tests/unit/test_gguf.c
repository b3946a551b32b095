/* GGUF reader and dequantization against files and values written by the
 * ggml project's `gguf` Python package (tests/data/gguf/make_fixtures.py). */
#include "test.h"

#include <jansson.h>
#include <kiln/kiln.h>

#include "llm/gguf.h"

#define DATA "tests/data/gguf/"

static void *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static void test_metadata(void)
{
    kiln_gguf *g = NULL;
    CHECK_OK(kiln_gguf_open(DATA "types.gguf", &g));
    if (!g)
        return;
    CHECK(g->version == 3);
    int64_t i;
    float f;
    const char *s;
    size_t len;
    CHECK_OK(kiln_gguf_get_i64(g, "test.u32", &i));
    CHECK(i == 4294967295LL);
    CHECK_OK(kiln_gguf_get_i64(g, "test.i32", &i));
    CHECK(i == -7);
    CHECK_OK(kiln_gguf_get_i64(g, "test.u64", &i));
    CHECK(i == (1LL << 40));
    CHECK_OK(kiln_gguf_get_f32(g, "test.f32", &f));
    CHECK(f == 0.25f);
    CHECK_OK(kiln_gguf_get_string(g, "test.string", &s, &len));
    CHECK(len == strlen("héllo ✓") && memcmp(s, "héllo ✓", len) == 0);
    CHECK_OK(kiln_gguf_get_string(g, "general.architecture", &s, &len));
    CHECK(len == 5 && memcmp(s, "llama", 5) == 0);
    CHECK_FAILS(kiln_gguf_get_i64(g, "test.f32", &i), KILN_ERROR_FORMAT, "test.f32");
    CHECK_FAILS(kiln_gguf_get_i64(g, "no.such.key", &i), KILN_ERROR_NOT_FOUND, "no.such.key");
    CHECK_FAILS(kiln_gguf_get_string(g, "test.u32", &s, &len), KILN_ERROR_FORMAT, "not a string");

    const kiln_gguf_kv *kv = kiln_gguf_find_kv(g, "test.strings");
    CHECK(kv && kv->type == KILN_GGUF_ARRAY && kv->array_type == KILN_GGUF_STRING && kv->count == 4);
    if (kv && kv->count == 4) {
        kiln_gguf_array_string(kv, 2, &s, &len);
        CHECK(len == strlen("ünï") && memcmp(s, "ünï", len) == 0);
        kiln_gguf_array_string(kv, 1, &s, &len);
        CHECK(len == 0);
    }
    kv = kiln_gguf_find_kv(g, "test.ints");
    CHECK(kv && kv->count == 3);
    int64_t iv = 0;
    if (kv && kv->count == 3) {
        CHECK_OK(kiln_gguf_array_int(kv, 1, -10, 10, &iv));
        CHECK(iv == -1);
        CHECK_FAILS(kiln_gguf_array_int(kv, 1, 0, 10, &iv), KILN_ERROR_FORMAT, "\"test.ints\"[1] is outside 0..10");
    }
    kiln_gguf_close(g);
}

static void test_dequantize_matches_gguf_package(void)
{
    static const char *names[] = {"t.f32",  "t.f16",  "t.bf16", "t.q8_0", "t.q4_0", "t.q4_1",
                                  "t.q5_0", "t.q5_1", "t.q4_k", "t.q5_k", "t.q6_k"};
    kiln_gguf *g = NULL;
    CHECK_OK(kiln_gguf_open(DATA "types.gguf", &g));
    if (!g)
        return;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g, names[k]);
        CHECK(t != NULL);
        if (!t)
            continue;
        CHECK(t->n_dims == 2 && t->ne[0] == 512 && t->ne[1] == 2 && t->n_elements == 1024);
        char path[256];
        snprintf(path, sizeof path, DATA "%s.f32", names[k]);
        size_t size;
        float *want = read_file(path, &size);
        CHECK(want && size == 1024 * sizeof(float));
        float *got = calloc(1024, sizeof(float));
        CHECK_OK(kiln_ggml_dequantize(t->type, t->data, t->n_elements, got));
        /* bit for bit: the same roundings in the same order */
        int same = want && memcmp(got, want, 1024 * sizeof(float)) == 0;
        if (!same)
            fprintf(stderr, "%s: differs from the gguf package's dequantize\n", names[k]);
        CHECK(same);
        free(want);
        free(got);
    }
    kiln_gguf_close(g);
}

/* Tensors llama.cpp's quantizer wrote (tests/data/llm/quantized/
 * make_model.py: Q4_K, Q5_K, Q6_K and Q5_1 of its Q4_K_M, Q5_K_M and Q5_1
 * files) against the gguf package's dequantize of them, bit for bit. */
static void test_llamacpp_tensors_match_gguf_package(void)
{
    const char *dir = "tests/data/llm/quantized/";
    char path[512];
    snprintf(path, sizeof path, "%srefs.json", dir);
    json_t *refs = json_load_file(path, 0, NULL), *deq = json_object_get(refs, "dequantized");
    CHECK(json_object_size(deq) == 4);
    const char *npy;
    json_t *kind;
    json_object_foreach(deq, npy, kind)
    {
        /* "<file type>.<tensor>.npy" from model-<file type>.gguf */
        const char *dot = strchr(npy, '.');
        size_t len = strlen(npy);
        CHECK(dot && len > 4 && strcmp(npy + len - 4, ".npy") == 0);
        if (!dot || len <= 4)
            continue;
        char file[512], tensor[128];
        snprintf(file, sizeof file, "%smodel-%.*s.gguf", dir, (int)(dot - npy), npy);
        snprintf(tensor, sizeof tensor, "%.*s", (int)(npy + len - 4 - dot - 1), dot + 1);
        kiln_gguf *g = NULL;
        CHECK_OK(kiln_gguf_open(file, &g));
        const kiln_gguf_tensor *t = g ? kiln_gguf_find_tensor(g, tensor) : NULL;
        CHECK(t != NULL);
        snprintf(path, sizeof path, "%s%s", dir, npy);
        kiln_dtype dt;
        kiln_dims dims;
        void *want = NULL;
        size_t size = 0;
        CHECK_OK(kiln_npy_read(path, &dt, &dims, &want, &size));
        if (t && want) {
            CHECK(strcmp(kiln_ggml_type_name(t->type), json_string_value(kind)) == 0);
            CHECK(dt == KILN_DTYPE_F32 && dims.rank == 2 && dims.d[0] == t->ne[1] && dims.d[1] == t->ne[0] &&
                  size == (size_t)t->n_elements * sizeof(float));
            float *got = malloc((size_t)t->n_elements * sizeof(float));
            CHECK_OK(kiln_ggml_dequantize(t->type, t->data, t->n_elements, got));
            int same = size == (size_t)t->n_elements * sizeof(float) && memcmp(got, want, size) == 0;
            if (!same)
                fprintf(stderr, "%s: %s differs from the gguf package's dequantize\n", file, tensor);
            CHECK(same);
            free(got);
        }
        kiln_free(want);
        kiln_gguf_close(g);
    }
    json_decref(refs);
}

/* Every prefix of a valid file is refused with a format error, never a crash. */
static void test_truncated(void)
{
    size_t size;
    uint8_t *buf = read_file(DATA "types.gguf", &size);
    CHECK(buf != NULL);
    if (!buf)
        return;
    int refused = 0, tried = 0;
    for (size_t n = 0; n < size; n += (n < 512 ? 1 : 97)) {
        kiln_gguf *g = NULL;
        kiln_status s = kiln_gguf_parse(buf, n, "cut.gguf", &g);
        tried++;
        if (s != KILN_OK && strstr(kiln_last_error(), "cut.gguf"))
            refused++;
        kiln_gguf_close(g);
    }
    CHECK(refused == tried);
    free(buf);
}

static void test_bad_headers(void)
{
    kiln_gguf *g = NULL;
    uint8_t bad_magic[24] = "GGML";
    CHECK_FAILS(kiln_gguf_parse(bad_magic, sizeof bad_magic, "x.gguf", &g), KILN_ERROR_FORMAT, "bad magic");
    uint8_t v1[24] = {'G', 'G', 'U', 'F', 1};
    CHECK_FAILS(kiln_gguf_parse(v1, sizeof v1, "x.gguf", &g), KILN_ERROR_VERSION, "version 1");
    /* Counts far beyond what 24 bytes can hold. */
    uint8_t huge[24] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    CHECK_FAILS(kiln_gguf_parse(huge, sizeof huge, "x.gguf", &g), KILN_ERROR_FORMAT, "more than the file can hold");
    /* One key whose string length points past the end. */
    uint8_t key[40] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0,    0,    0,    0,    0, 0, 0, 0,
                       1,   0,   0,   0,   0, 0, 0, 0, 0xf0, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    CHECK_FAILS(kiln_gguf_parse(key, sizeof key, "x.gguf", &g), KILN_ERROR_FORMAT, "past the end");
    CHECK_FAILS(kiln_gguf_open("tests/data/gguf/does-not-exist.gguf", &g), KILN_ERROR_IO, "cannot open");
}

static void test_unsupported_type(void)
{
    float out[256];
    uint8_t block[110] = {0};
    CHECK_FAILS(kiln_ggml_dequantize(KILN_GGML_Q3_K, block, 256, out), KILN_ERROR_UNSUPPORTED, "Q3_K");
    CHECK_FAILS(kiln_ggml_dequantize(KILN_GGML_Q8_0, block, 31, out), KILN_ERROR_INVALID_ARGUMENT, "multiple");
}

static const test_case_ tests[] = {TEST(test_metadata),
                                   TEST(test_dequantize_matches_gguf_package),
                                   TEST(test_llamacpp_tensors_match_gguf_package),
                                   TEST(test_truncated),
                                   TEST(test_bad_headers),
                                   TEST(test_unsupported_type)};
TEST_MAIN(tests)
