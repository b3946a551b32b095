/* libFuzzer target: the GGUF reader and dequantization of every tensor. */
#include <stdlib.h>

#include "llm/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_gguf *g = NULL;
    if (kiln_gguf_parse(data, size, "fuzz.gguf", &g) != KILN_OK)
        return 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        if (t->n_elements > (1 << 20) || !kiln_ggml_can_dequantize(t->type))
            continue;
        float *out = malloc((size_t)t->n_elements * sizeof(float) + 1);
        if (out)
            kiln_ggml_dequantize(t->type, t->data, t->n_elements, out);
        free(out);
    }
    for (int64_t i = 0; i < g->n_kvs; i++) {
        const kiln_gguf_kv *kv = &g->kvs[i];
        if (kv->type == KILN_GGUF_ARRAY && kv->array_type == KILN_GGUF_STRING && kv->count) {
            const char *s;
            size_t len;
            kiln_gguf_array_string(kv, kv->count - 1, &s, &len);
        }
    }
    kiln_gguf_close(g);
    return 0;
}
