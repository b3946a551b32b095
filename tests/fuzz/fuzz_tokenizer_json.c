/* libFuzzer: a tokenizer.json (and, from the same bytes, a llama2.c
 * tokenizer.bin) loaded from memory must load or fail cleanly; whatever
 * loads must encode, decode, stream and round-trip through serialize. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm/tokenizer.h"

static const char TEXT[] =
    "Hello, world! <s> <|endoftext|> caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC 123  \n\t\xF0\x9F\x98\x80 -a-";

static void exercise(kiln_tokenizer *t)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (kiln_tokenizer_encode(t, TEXT, sizeof TEXT - 1, KILN_TOKENIZE_DEFAULT, &ids, &n) == KILN_OK) {
        char *text = NULL;
        size_t len;
        if (kiln_tokenizer_decode(t, ids, n, 0, &text, &len) == KILN_OK)
            free(text);
        kiln_tokenizer_stream *s;
        if (kiln_tokenizer_stream_create(t, KILN_DETOKENIZE_SKIP_SPECIAL, &s) == KILN_OK) {
            const char *piece;
            for (size_t i = 0; i < n; i++)
                kiln_tokenizer_stream_push(s, ids[i], &piece, &len);
            kiln_tokenizer_stream_finish(s, &piece, &len);
            kiln_tokenizer_stream_free(s);
        }
        free(ids);
    }
    /* Every id decodes alone, including ones the text did not produce. */
    int32_t vs = kiln_tokenizer_vocab_size(t);
    for (int32_t id = 0; id < vs && id < 512; id++) {
        char *text = NULL;
        size_t len;
        if (kiln_tokenizer_decode(t, &id, 1, 0, &text, &len) == KILN_OK)
            free(text);
    }
    void *blob;
    size_t blob_len;
    if (kiln_tokenizer_serialize(t, &blob, &blob_len) == KILN_OK) {
        kiln_tokenizer *u;
        if (kiln_tokenizer_deserialize(blob, blob_len, &u) == KILN_OK)
            kiln_tokenizer_free(u);
        free(blob);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_tokenizer *t;
    if (kiln_tokenizer_load_json_memory(data, size, &t) == KILN_OK) {
        exercise(t);
        kiln_tokenizer_free(t);
    }
    if (kiln_tokenizer_load_llama2c_memory(data, size, 0, &t) == KILN_OK) {
        exercise(t);
        kiln_tokenizer_free(t);
    }
    if (kiln_tokenizer_deserialize(data, size, &t) == KILN_OK) {
        exercise(t);
        kiln_tokenizer_free(t);
    }
    return 0;
}
