/* Tokenizer tests. Without reference data: byte mapping, merge order,
 * UTF-8 streaming, llama2.c's tokenizer.bin from tests/data/tokenizer, error
 * cases. With KILN_TOKREF_DIR (written by tests/data/tokenizer/
 * make_reference.py, run by tests/e2e/tokenizer_reference.sh): exact ids and
 * decoded text against Hugging Face tokenizers for every family. */
#include <jansson.h>
#include <stdint.h>
#include <time.h>

#include "llm/tokenizer.h"
#include "test.h"

static const char *vocab_dir(char *buf, size_t n)
{
    const char *src = getenv("KILN_SOURCE_DIR");
    snprintf(buf, n, "%s/tests/data/tokenizer", src ? src : ".");
    return buf;
}

static int ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, "\n");
}

/* Encodes and compares with expected ids. */
static int check_encode(const kiln_tokenizer *t, const char *text, size_t len, uint32_t flags, const int32_t *want,
                        size_t n_want)
{
    int32_t *ids = NULL;
    size_t n = 0;
    kiln_status st = kiln_tokenizer_encode(t, text, len, flags, &ids, &n);
    int ok = st == KILN_OK && ids_equal(ids, n, want, n_want);
    if (!ok) {
        fprintf(stderr, "encode(\"%.*s\", flags %u): %s %s\n", (int)len, text, flags, kiln_status_name(st),
                kiln_last_error());
        print_ids("got ", ids, n);
        print_ids("want", want, n_want);
    }
    free(ids);
    return ok;
}

static char *decode(const kiln_tokenizer *t, const int32_t *ids, size_t n, uint32_t flags)
{
    char *text = NULL;
    size_t len;
    if (kiln_tokenizer_decode(t, ids, n, flags, &text, &len) != KILN_OK)
        return NULL;
    return text;
}

/* ---- in-memory vocabularies ---- */

/* GPT-2's byte->unicode map written out from its definition: printable
 * Latin-1 maps to itself, the 68 others to U+0100.. in byte order. */
static void gpt2_byte_char(unsigned b, char out[3])
{
    unsigned cp = b, n = 0;
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    if (!printable) {
        for (unsigned x = 0; x < b; x++)
            n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174));
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static void test_byte_level_mapping(void)
{
    /* 256 byte tokens, id = byte, plus "Ġh" -> 256 ... merges. */
    static char names[256][3];
    const char *toks[259];
    for (unsigned b = 0; b < 256; b++) {
        gpt2_byte_char(b, names[b]);
        toks[b] = names[b];
    }
    /* Well-known fixed points of GPT-2's map. */
    CHECK(!strcmp(names[' '], "\xC4\xA0"));  /* U+0120 'Ġ' */
    CHECK(!strcmp(names['\n'], "\xC4\x8A")); /* U+010A 'Ċ' */
    CHECK(!strcmp(names[0xAD], "\xC5\x83")); /* soft hyphen -> U+0143 */
    toks[256] = "\xC4\xA0h";
    toks[257] = "\xC4\xA0hi";
    toks[258] = "<|end|>";
    int32_t types[259];
    for (int i = 0; i < 259; i++)
        types[i] = KILN_TOKEN_NORMAL;
    types[258] = KILN_TOKEN_CONTROL;
    const char *merges[] = {"\xC4\xA0 h", "\xC4\xA0h i"};
    kiln_tokenizer_vocab v = {.kind = KILN_TOKENIZER_BYTE_BPE,
                              .n_tokens = 259,
                              .tokens = toks,
                              .types = types,
                              .n_merges = 2,
                              .merges = merges,
                              .bos_id = -1,
                              .eos_id = 258,
                              .unk_id = -1};
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_create(&v, &t));
    if (!t)
        return;
    /* GPT-2 regex: " hi" is one piece (" ?\p{L}+"), "\n" another. */
    CHECK(check_encode(t, "a hi\n\xC3\xBF", 7, 0, (const int32_t[]){'a', 257, '\n', 0xC3, 0xBF}, 5));
    /* Every ASCII byte maps to its own token and back. */
    char all[127];
    for (int i = 0; i < 127; i++)
        all[i] = (char)(i + 1);
    int32_t *ids;
    size_t n;
    CHECK_OK(kiln_tokenizer_encode(t, all, 127, 0, &ids, &n));
    int same = n == 127;
    for (size_t i = 0; same && i < n; i++)
        same = ids[i] == (int32_t)i + 1;
    CHECK(same);
    char *text = decode(t, ids, n, 0);
    CHECK(text && strlen(text) == 127 && !memcmp(text, all, 127));
    free(text);
    free(ids);
    /* Raw byte tokens decode to their bytes (0xC3 0xBF = "ÿ"). */
    text = decode(t, (const int32_t[]){0xC3, 0xBF}, 2, 0);
    CHECK(text && !strcmp(text, "\xC3\xBF"));
    free(text);
    /* Control token: matched only with PARSE_SPECIAL, skipped on request. */
    CHECK(check_encode(t, "<|end|>", 7, KILN_TOKENIZE_PARSE_SPECIAL, (const int32_t[]){258}, 1));
    CHECK(check_encode(t, "<|end|>", 7, 0, (const int32_t[]){'<', '|', 'e', 'n', 'd', '|', '>'}, 7));
    text = decode(t, (const int32_t[]){'a', 258}, 2, KILN_DETOKENIZE_SKIP_SPECIAL);
    CHECK(text && !strcmp(text, "a"));
    free(text);
    CHECK(kiln_tokenizer_eos_id(t) == 258 && kiln_tokenizer_bos_id(t) == -1);
    CHECK(kiln_tokenizer_is_special(t, 258) && !kiln_tokenizer_is_special(t, 257));
    CHECK(kiln_tokenizer_token_id(t, "\xC4\xA0hi", 4) == 257);
    size_t plen;
    const char *piece = kiln_tokenizer_token_to_piece(t, 256, &plen);
    CHECK(piece && plen == 3 && !memcmp(piece, "\xC4\xA0h", 3));
    CHECK(kiln_tokenizer_token_to_piece(t, 259, &plen) == NULL);
    kiln_tokenizer_free(t);
}

/* Merge order: lowest rank first, leftmost on ties; with scores, the
 * highest-scoring merged token first. */
static void test_merge_order(void)
{
    const char *toks[] = {"a", "b", "c", "ab", "bc", "abc", "aa", "aaa"};
    kiln_tokenizer *t = NULL;
    /* Ranks: "b c" before "a b": "abc" -> a + bc -> no "a bc" merge. */
    const char *m1[] = {"b c", "a b", "ab c", "a a"};
    kiln_tokenizer_vocab v = {.kind = KILN_TOKENIZER_BYTE_BPE,
                              .n_tokens = 8,
                              .tokens = toks,
                              .n_merges = 4,
                              .merges = m1,
                              .bos_id = -1,
                              .eos_id = -1,
                              .unk_id = -1,
                              .n_pre_regexes = 1,
                              .pre_regexes = (const char *[]){"[abc]+"}};
    CHECK_OK(kiln_tokenizer_create(&v, &t));
    if (t) {
        CHECK(check_encode(t, "abc", 3, 0, (const int32_t[]){0, 4}, 2));
        /* "aaa": the two "a a" pairs tie; the leftmost merges: aa + a. */
        CHECK(check_encode(t, "aaa", 3, 0, (const int32_t[]){6, 0}, 2));
        kiln_tokenizer_free(t);
    }
    const char *m2[] = {"a b", "b c", "ab c", "a a"};
    v.merges = m2;
    CHECK_OK(kiln_tokenizer_create(&v, &t));
    if (t) {
        CHECK(check_encode(t, "abc", 3, 0, (const int32_t[]){5}, 1));
        kiln_tokenizer_free(t);
    }
    /* ignore_merges: a piece in the vocabulary is one token even without a
     * merge path ("aaa" has none from "aa"+"a" here). */
    v.ignore_merges = 1;
    CHECK_OK(kiln_tokenizer_create(&v, &t));
    if (t) {
        CHECK(check_encode(t, "aaa", 3, 0, (const int32_t[]){7}, 1));
        kiln_tokenizer_free(t);
    }
    /* SentencePiece by score: "▁", letters; "bc" scores above "ab". */
    const char *st[] = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c", "ab", "bc", "\xE2\x96\x81\x61"};
    float sc[] = {0, 0, 0, -1, -2, -3, -4, -6, -5, -7};
    int32_t ty[] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1};
    kiln_tokenizer_vocab s = {.kind = KILN_TOKENIZER_SPM,
                              .n_tokens = 10,
                              .tokens = st,
                              .scores = sc,
                              .types = ty,
                              .bos_id = 1,
                              .eos_id = 2,
                              .unk_id = 0,
                              .add_bos = 1};
    CHECK_OK(kiln_tokenizer_create(&s, &t));
    if (t) {
        /* "▁abc": ▁a (-7) vs ab (-6) vs bc (-5): bc first, then ▁a. */
        CHECK(check_encode(t, "abc", 3, KILN_TOKENIZE_ADD_SPECIAL, (const int32_t[]){1, 9, 8}, 3));
        /* No byte tokens: an unknown character is <unk>, fused with the next. */
        CHECK(check_encode(t, "a\xC3\xA9\xC3\xA9", 5, 0, (const int32_t[]){9, 0}, 2));
        char *text = decode(t, (const int32_t[]){1, 9, 8, 3, 4}, 5, KILN_DETOKENIZE_SKIP_SPECIAL);
        CHECK(text && !strcmp(text, "abc a")); /* leading space stripped once */
        free(text);
        kiln_tokenizer_free(t);
    }
}

/* A SentencePiece-style vocabulary with byte fallback for "€" (E2 82 AC). */
static kiln_tokenizer *byte_fallback_tokenizer(void)
{
    static char names[256][8];
    const char *toks[260];
    int32_t ty[260];
    float sc[260];
    toks[0] = "<unk>";
    toks[1] = "<s>";
    toks[2] = "</s>";
    toks[3] = "\xE2\x96\x81";
    ty[0] = 2;
    ty[1] = 3;
    ty[2] = 3;
    ty[3] = 1;
    for (int b = 0; b < 256; b++) {
        snprintf(names[b], sizeof names[b], "<0x%02X>", b);
        toks[4 + b] = names[b];
        ty[4 + b] = KILN_TOKEN_BYTE;
    }
    for (int i = 0; i < 260; i++)
        sc[i] = 0;
    kiln_tokenizer_vocab v = {.kind = KILN_TOKENIZER_SPM,
                              .n_tokens = 260,
                              .tokens = toks,
                              .scores = sc,
                              .types = ty,
                              .bos_id = 1,
                              .eos_id = 2,
                              .unk_id = 0,
                              .add_bos = 1};
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_create(&v, &t));
    return t;
}

static void test_utf8_streaming(void)
{
    kiln_tokenizer *t = byte_fallback_tokenizer();
    if (!t)
        return;
    /* "€" has no token: its three bytes. */
    CHECK(check_encode(t, "\xE2\x82\xAC", 3, KILN_TOKENIZE_ADD_SPECIAL,
                       (const int32_t[]){1, 3, 4 + 0xE2, 4 + 0x82, 4 + 0xAC}, 5));
    kiln_tokenizer_stream *s = NULL;
    CHECK_OK(kiln_tokenizer_stream_create(t, 0, &s));
    if (!s) {
        kiln_tokenizer_free(t);
        return;
    }
    const char *text;
    size_t len;
    CHECK_OK(kiln_tokenizer_stream_push(s, 1, &text, &len));
    CHECK(len == 3 && !strcmp(text, "<s>"));
    CHECK_OK(kiln_tokenizer_stream_push(s, 3, &text, &len));
    CHECK(len == 1 && !strcmp(text, " ")); /* not the first token: the space stays */
    CHECK_OK(kiln_tokenizer_stream_push(s, 4 + 0xE2, &text, &len));
    CHECK(len == 0);
    CHECK_OK(kiln_tokenizer_stream_push(s, 4 + 0x82, &text, &len));
    CHECK(len == 0);
    CHECK_OK(kiln_tokenizer_stream_push(s, 4 + 0xAC, &text, &len));
    CHECK(len == 3 && !memcmp(text, "\xE2\x82\xAC", 3));
    /* A lone continuation byte is invalid at once: U+FFFD. */
    CHECK_OK(kiln_tokenizer_stream_push(s, 4 + 0x80, &text, &len));
    CHECK(len == 3 && !memcmp(text, "\xEF\xBF\xBD", 3));
    /* An incomplete sequence broken by ASCII: U+FFFD then the ASCII. */
    CHECK_OK(kiln_tokenizer_stream_push(s, 4 + 0xE2, &text, &len));
    CHECK(len == 0);
    CHECK_OK(kiln_tokenizer_stream_push(s, 4 + 'A', &text, &len));
    CHECK(len == 4 && !memcmp(text,
                              "\xEF\xBF\xBD"
                              "A",
                              4));
    /* Held at the end: flushed as U+FFFD. */
    CHECK_OK(kiln_tokenizer_stream_push(s, 4 + 0xF0, &text, &len));
    CHECK(len == 0);
    CHECK_OK(kiln_tokenizer_stream_push(s, 4 + 0x9F, &text, &len));
    CHECK(len == 0);
    CHECK_OK(kiln_tokenizer_stream_finish(s, &text, &len));
    CHECK(len == 3 && !memcmp(text, "\xEF\xBF\xBD", 3));
    /* After finish the stream starts over: the first token's space goes. */
    CHECK_OK(kiln_tokenizer_stream_push(s, 3, &text, &len));
    CHECK(len == 0);
    CHECK_OK(kiln_tokenizer_stream_push(s, 4 + 'x', &text, &len));
    CHECK(len == 1 && text[0] == 'x');
    CHECK_FAILS(kiln_tokenizer_stream_push(s, 260, &text, &len), KILN_ERROR_INVALID_ARGUMENT, "token id 260");
    kiln_tokenizer_stream_free(s);
    /* decode() agrees with the stream. */
    char *d = decode(t, (const int32_t[]){1, 3, 4 + 0xE2, 4 + 0x82, 4 + 0xAC, 4 + 0xE2}, 6, 0);
    CHECK(d && !strcmp(d, "<s> \xE2\x82\xAC\xEF\xBF\xBD"));
    free(d);
    kiln_tokenizer_free(t);

    /* ByteFallback leaves a lone 0xF0; ByteLevel after it keeps the byte
     * (not a mapped character), and the text gets U+FFFD, as HF's does. */
    const char *json = "{\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},"
                       "{\"type\":\"ByteLevel\"}]},\"model\":{\"type\":\"BPE\",\"vocab\":{\"<0xF0>\":0,"
                       "\"H\":1},\"merges\":[],\"byte_fallback\":true}}";
    CHECK_OK(kiln_tokenizer_load_json_memory(json, strlen(json), &t));
    if (!t)
        return;
    d = decode(t, (const int32_t[]){0, 1}, 2, 0);
    CHECK(d && !strcmp(d, "\xEF\xBF\xBDH"));
    free(d);
    kiln_tokenizer_free(t);
}

static void test_llama2c_bin(void)
{
    char dir[4096], path[4200];
    snprintf(path, sizeof path, "%s/llama2-sp/tokenizer.bin", vocab_dir(dir, sizeof dir));
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load_llama2c(path, 32000, &t));
    if (!t)
        return;
    CHECK(kiln_tokenizer_vocab_size(t) == 32000);
    CHECK(kiln_tokenizer_bos_id(t) == 1 && kiln_tokenizer_eos_id(t) == 2);
    /* The ids Llama 2's HF tokenizer gives (tests brief; sentencepiece agrees). */
    CHECK(check_encode(t, "Hello world", 11, KILN_TOKENIZE_ADD_SPECIAL, (const int32_t[]){1, 15043, 3186}, 3));
    /* "\n" is byte-fallback <0x0A> = id 13 (3 + 10). */
    CHECK(check_encode(t, "\n", 1, 0, (const int32_t[]){29871, 13}, 2));
    char *text = decode(t, (const int32_t[]){1, 15043, 3186}, 3, KILN_DETOKENIZE_SKIP_SPECIAL);
    CHECK(text && !strcmp(text, "Hello world"));
    free(text);
    size_t len;
    const char *p = kiln_tokenizer_token_to_piece(t, 15043, &len);
    CHECK(p && len == 8 && !memcmp(p, "\xE2\x96\x81Hello", 8));
    /* Serialized and back: same ids. */
    void *blob;
    size_t blob_len;
    CHECK_OK(kiln_tokenizer_serialize(t, &blob, &blob_len));
    kiln_tokenizer *u = NULL;
    CHECK_OK(kiln_tokenizer_deserialize(blob, blob_len, &u));
    if (u) {
        CHECK(check_encode(u, "Hello world", 11, KILN_TOKENIZE_ADD_SPECIAL, (const int32_t[]){1, 15043, 3186}, 3));
        CHECK(kiln_tokenizer_eos_id(u) == 2);
        kiln_tokenizer_free(u);
    }
    free(blob);
    kiln_tokenizer_free(t);

    /* Read to the end when the size is not given; a wrong size fails. */
    CHECK_OK(kiln_tokenizer_load_llama2c(path, 0, &t));
    if (t) {
        CHECK(kiln_tokenizer_vocab_size(t) == 32000);
        kiln_tokenizer_free(t);
    }
    CHECK_FAILS(kiln_tokenizer_load_llama2c(path, 32001, &t), KILN_ERROR_FORMAT, "holds 32000 tokens, expected 32001");
}

static const char *MINI_JSON =
    "{\"added_tokens\":[{\"id\":5,\"content\":\"<X>\",\"special\":true,\"lstrip\":true,\"rstrip\":true}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},"
    "\"behavior\":\"%s\",\"invert\":false},\"post_processor\":null,\"decoder\":null,"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"-\":1,\"a-\":2,\"-a\":3,\" \":4},"
    "\"merges\":[\"a -\",[\"-\",\"a\"]]}}";

static kiln_tokenizer *mini(const char *behavior)
{
    char json[1024];
    snprintf(json, sizeof json, MINI_JSON, behavior);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load_json_memory(json, strlen(json), &t));
    return t;
}

static void test_split_behaviors(void)
{
    /* "a-a": where the "-" goes decides which merge can happen. */
    struct {
        const char *behavior;
        int32_t ids[3];
        size_t n;
    } cases[] = {
        {"Isolated", {0, 1, 0}, 3},    {"Removed", {0, 0}, 2},       {"MergedWithPrevious", {2, 0}, 2},
        {"MergedWithNext", {0, 3}, 2}, {"Contiguous", {0, 1, 0}, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_tokenizer *t = mini(cases[i].behavior);
        if (!t)
            continue;
        CHECK(check_encode(t, "a-a", 3, 0, cases[i].ids, cases[i].n));
        kiln_tokenizer_free(t);
    }
    /* Added token with lstrip/rstrip swallows the spaces around it. */
    kiln_tokenizer *t = mini("Isolated");
    if (!t)
        return;
    CHECK(check_encode(t, "a  <X> a", 8, KILN_TOKENIZE_PARSE_SPECIAL, (const int32_t[]){0, 5, 0}, 3));
    CHECK(check_encode(t, "a <X>", 5, 0, (const int32_t[]){0, 4}, 2)); /* "<X>" chars unknown, dropped */
    /* No decoder: tokens joined with spaces, as HF does. */
    char *text = decode(t, (const int32_t[]){0, 2, 5}, 3, KILN_DETOKENIZE_SKIP_SPECIAL);
    CHECK(text && !strcmp(text, "a a-"));
    free(text);
    kiln_tokenizer_free(t);
}

static void test_errors(void)
{
    kiln_tokenizer *t = NULL;
    const char *wp = "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(wp, strlen(wp), &t), KILN_ERROR_UNSUPPORTED, "WordPiece");
    const char *uni = "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(uni, strlen(uni), &t), KILN_ERROR_UNSUPPORTED, "Unigram");
    const char *nfkc = "{\"normalizer\":{\"type\":\"NFKC\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(nfkc, strlen(nfkc), &t), KILN_ERROR_UNSUPPORTED, "NFKC");
    const char *pre = "{\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"model\":{\"type\":\"BPE\",\"vocab\":{}}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(pre, strlen(pre), &t), KILN_ERROR_UNSUPPORTED, "BertPreTokenizer");
    const char *cont = "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"continuing_subword_prefix\":\"##\"}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(cont, strlen(cont), &t), KILN_ERROR_UNSUPPORTED,
                "continuing_subword_prefix");
    const char *merge = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(merge, strlen(merge), &t), KILN_ERROR_FORMAT, "\"b\" is not in");
    const char *dup = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0}}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(dup, strlen(dup), &t), KILN_ERROR_FORMAT, "token id 0");
    /* integers beyond 64 bits read (Python writes them); as an id, one is out of range */
    const char *big = "{\"truncation\":{\"max_length\":1000000000000000019884624838656},"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}";
    CHECK_OK(kiln_tokenizer_load_json_memory(big, strlen(big), &t));
    CHECK(t && kiln_tokenizer_vocab_size(t) == 1);
    kiln_tokenizer_free(t);
    t = NULL;
    const char *bigid = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":100000000000000000000000}}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(bigid, strlen(bigid), &t), KILN_ERROR_FORMAT, "bad id");
    const char *far = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":42994566}}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(far, strlen(far), &t), KILN_ERROR_FORMAT,
                "id 42994566 is out of range");
    const char *badre = "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":"
                        "\"Isolated\"},\"model\":{\"type\":\"BPE\",\"vocab\":{}}}";
    CHECK_FAILS(kiln_tokenizer_load_json_memory(badre, strlen(badre), &t), KILN_ERROR_FORMAT, "does not compile");
    CHECK_FAILS(kiln_tokenizer_load_json_memory("{\"model\":", 9, &t), KILN_ERROR_FORMAT, "tokenizer.json");
    CHECK_FAILS(kiln_tokenizer_load_json("/nonexistent/tokenizer.json", &t), KILN_ERROR_IO, "cannot open");
    CHECK_FAILS(kiln_tokenizer_deserialize("garbage", 7, &t), KILN_ERROR_FORMAT, "bad header");
    CHECK_FAILS(kiln_tokenizer_deserialize("kiln-tokenizer 1 hf 1 2\n{}", 26, &t), KILN_ERROR_FORMAT, "model");

    /* llama2.c files: truncated token, negative length. */
    unsigned char bin[32] = {8, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 'a', 'b'};
    CHECK_FAILS(kiln_tokenizer_load_llama2c_memory(bin, 14, 0, &t), KILN_ERROR_FORMAT, "bad length");
    unsigned char neg[12] = {8, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF};
    CHECK_FAILS(kiln_tokenizer_load_llama2c_memory(neg, 12, 0, &t), KILN_ERROR_FORMAT, "bad length");

    kiln_tokenizer *m = mini("Isolated");
    if (!m)
        return;
    int32_t *ids;
    size_t n;
    CHECK_FAILS(kiln_tokenizer_encode(m, "a\xC3", 2, 0, &ids, &n), KILN_ERROR_INVALID_ARGUMENT, "UTF-8 at byte 1");
    char *text;
    CHECK_FAILS(kiln_tokenizer_decode(m, (const int32_t[]){0, 99}, 2, 0, &text, &n), KILN_ERROR_INVALID_ARGUMENT,
                "token id 99");
    CHECK_FAILS(kiln_tokenizer_set_bos_eos(m, 77, -1), KILN_ERROR_INVALID_ARGUMENT, "bos id 77");
    kiln_tokenizer_free(m);

    const char *toks[] = {"a", "b"};
    kiln_tokenizer_vocab v = {
        .kind = KILN_TOKENIZER_BYTE_BPE, .n_tokens = 2, .tokens = toks, .bos_id = 5, .eos_id = -1, .unk_id = -1};
    CHECK_FAILS(kiln_tokenizer_create(&v, &t), KILN_ERROR_INVALID_ARGUMENT, "bos id 5");
    v.bos_id = -1;
    v.n_merges = 1;
    v.merges = (const char *[]){"ab"};
    CHECK_FAILS(kiln_tokenizer_create(&v, &t), KILN_ERROR_INVALID_ARGUMENT, "merge 0");
}

/* ---- against Hugging Face ---- */

static json_t *load_json_file(const char *path)
{
    json_error_t err;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &err);
    if (!j)
        fprintf(stderr, "%s: %s\n", path, err.text);
    return j;
}

static size_t json_ids(json_t *arr, int32_t *out, size_t cap)
{
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return n < cap ? n : cap;
}

/* Whether s ends inside a UTF-8 sequence or holds an invalid one. */
static int utf8_broken_(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = u[i] < 0x80 ? 1 : u[i] >= 0xF0 ? 4 : u[i] >= 0xE0 ? 3 : u[i] >= 0xC2 ? 2 : 0;
        if (k == 0 || i + k > n)
            return 1;
        for (size_t j = 1; j < k; j++)
            if ((u[i + j] & 0xC0) != 0x80)
                return 1;
        i += k;
    }
    return 0;
}

static int check_decode(const kiln_tokenizer *t, const int32_t *ids, size_t n, uint32_t flags, json_t *want_j)
{
    const char *want = json_string_value(want_j);
    size_t want_len = json_string_length(want_j);
    char *text = NULL;
    size_t len = 0;
    kiln_status st = kiln_tokenizer_decode(t, ids, n, flags, &text, &len);
    int ok = st == KILN_OK && want && len == want_len && !memcmp(text, want, len);
    /* The stream's pieces, each whole UTF-8, concatenate to the same text. */
    kiln_tokenizer_stream *s = NULL;
    char streamed[8192];
    size_t sl = 0;
    if (kiln_tokenizer_stream_create(t, flags, &s) == KILN_OK) {
        const char *piece;
        size_t plen;
        for (size_t i = 0; i < n; i++) {
            if (kiln_tokenizer_stream_push(s, ids[i], &piece, &plen) != KILN_OK || sl + plen >= sizeof streamed) {
                ok = 0;
                break;
            }
            if (utf8_broken_(piece, plen))
                ok = 0;
            memcpy(streamed + sl, piece, plen);
            sl += plen;
        }
        if (kiln_tokenizer_stream_finish(s, &piece, &plen) == KILN_OK && sl + plen < sizeof streamed) {
            memcpy(streamed + sl, piece, plen);
            sl += plen;
        }
        kiln_tokenizer_stream_free(s);
    }
    if (!want || sl != want_len || memcmp(streamed, want, sl))
        ok = 0;
    if (!ok)
        fprintf(stderr, "decode: got \"%.*s\", streamed \"%.*s\", want \"%s\"\n", (int)len, text ? text : "", (int)sl,
                streamed, want ? want : "?");
    free(text);
    return ok;
}

static int encode_matches(const kiln_tokenizer *t, json_t *text, uint32_t flags, json_t *want_arr, const char *family,
                          const char *what)
{
    int32_t want[4096];
    size_t nw = json_ids(want_arr, want, 4096);
    int ok = check_encode(t, json_string_value(text), json_string_length(text), flags, want, nw);
    if (!ok)
        fprintf(stderr, "  (%s, %s)\n", family, what);
    return ok;
}

/* Every corpus string of one family: ids with and without special tokens,
 * special tokens as text, decoded text; then the same after a
 * serialize/deserialize round trip. */
static void run_family(const char *dir, const char *family, const kiln_tokenizer *llama2c)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir, family);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load_json(path, &t));
    snprintf(path, sizeof path, "%s/%s/reference.json", dir, family);
    json_t *ref = load_json_file(path);
    CHECK(ref && json_array_size(ref) > 30);
    if (!t || !ref) {
        kiln_tokenizer_free(t);
        json_decref(ref);
        return;
    }
    void *blob;
    size_t blob_len;
    kiln_tokenizer *u = NULL;
    CHECK_OK(kiln_tokenizer_serialize(t, &blob, &blob_len));
    CHECK_OK(kiln_tokenizer_deserialize(blob, blob_len, &u));
    free(blob);
    int bad = 0;
    size_t i;
    json_t *e;
    json_array_foreach(ref, i, e)
    {
        json_t *text = json_object_get(e, "text");
        json_t *special = json_object_get(e, "ids_special");
        bad += !encode_matches(t, text, KILN_TOKENIZE_DEFAULT, special, family, "ids_special");
        bad +=
            !encode_matches(t, text, KILN_TOKENIZE_PARSE_SPECIAL, json_object_get(e, "ids_plain"), family, "ids_plain");
        bad += !encode_matches(t, text, 0, json_object_get(e, "ids_literal"), family, "ids_literal");
        if (u)
            bad += !encode_matches(u, text, KILN_TOKENIZE_DEFAULT, special, family, "deserialized");
        json_t *sp = json_object_get(e, "ids_sp");
        if (sp && llama2c)
            bad += !encode_matches(llama2c, text, 0, sp, family, "llama2.c tokenizer.bin vs sentencepiece");
        int32_t ids[4096];
        size_t n = json_ids(special, ids, 4096);
        bad += !check_decode(t, ids, n, 0, json_object_get(e, "decoded"));
        bad += !check_decode(t, ids, n, KILN_DETOKENIZE_SKIP_SPECIAL, json_object_get(e, "decoded_skip"));
    }
    printf("  %s: %zu strings, %d mismatches\n", family, json_array_size(ref), bad);
    CHECK(bad == 0);
    kiln_tokenizer_free(u);
    kiln_tokenizer_free(t);
    json_decref(ref);
}

/* CPU time of this thread: the encode is single-threaded, and a shared CI
 * machine's load would swell wall time many times over. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 1 MB of English-like text: GPT-2 BPE must take well under a second. For
 * Llama 2 (no pre-tokenizer: the whole text is one BPE word, as in HF) the
 * time is only reported. */
static void run_speed(const char *dir, const char *family, double limit_s)
{
    static const char *words[] = {"the",  "quick",       "brown",     "fox",       "jumps",       "over",
                                  "lazy", "dog",         "and",       "tokenizer", "performance", "measurement",
                                  "of",   "byte-level",  "encoding",  "with",      "merges,",     "ranks.",
                                  "In",   "1984",        "people",    "said:",     "\"hello\"",   "isn't",
                                  "it",   "remarkable?", "Compilers", "build",     "engines",     "quickly\n"};
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap + 32);
    uint32_t r = 12345;
    while (len < cap) {
        r = r * 1103515245u + 12345u;
        const char *w = words[(r >> 16) % (sizeof words / sizeof words[0])];
        size_t wl = strlen(w);
        memcpy(text + len, w, wl);
        len += wl;
        text[len++] = ' ';
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir, family);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load_json(path, &t));
    if (t) {
        int32_t *ids;
        size_t n;
        double t0 = cpu_s();
        CHECK_OK(kiln_tokenizer_encode(t, text, len, 0, &ids, &n));
        double dt = cpu_s() - t0;
        printf("  %s: encoded %zu bytes into %zu tokens in %.3f s of CPU time\n", family, len, n, dt);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__has_feature)
        CHECK(dt < limit_s);
#elif defined(__has_feature)
#if !__has_feature(address_sanitizer)
        CHECK(dt < limit_s);
#endif
#endif
        char *back = decode(t, ids, n, 0);
        /* Llama's decoder strips the space its normalizer prepended. */
        CHECK(back && strlen(back) == len && !memcmp(back, text, len));
        free(back);
        free(ids);
        kiln_tokenizer_free(t);
    }
    free(text);
}

static void test_reference(void)
{
    const char *dir = getenv("KILN_TOKREF_DIR");
    if (!dir) {
        printf("  (no KILN_TOKREF_DIR: reference comparison not run; tests/e2e/tokenizer_reference.sh runs it)\n");
        return;
    }
    char sd[4096], path[4200];
    snprintf(path, sizeof path, "%s/llama2-sp/tokenizer.bin", vocab_dir(sd, sizeof sd));
    kiln_tokenizer *l2c = NULL;
    CHECK_OK(kiln_tokenizer_load_llama2c(path, 32000, &l2c));
    static const char *families[] = {"gpt2",   "llama3-style", "gpt2-exotic",   "qwen2-style",
                                     "llama2", "llama2-first", "llama2-legacy", "llama2-metaspace-decoder"};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        run_family(dir, families[i], l2c);
    kiln_tokenizer_free(l2c);
    run_speed(dir, "gpt2", 1.0);
    run_speed(dir, "llama2-legacy", 60.0);
}

static const test_case_ tests[] = {
    TEST(test_byte_level_mapping), TEST(test_merge_order), TEST(test_utf8_streaming), TEST(test_llama2c_bin),
    TEST(test_split_behaviors),    TEST(test_errors),      TEST(test_reference),
};
TEST_MAIN(tests)
