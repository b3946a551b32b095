/* libFuzzer target: the safetensors parser on arbitrary bytes. Every tensor
 * it accepts must lie inside the buffer, which the reads below check under
 * AddressSanitizer. */
#include <stdint.h>
#include <string.h>

#include "core/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_safetensors *st = NULL;
    if (kiln_safetensors_parse(data, size, "fuzz", &st) != KILN_OK) {
        if (!kiln_last_error()[0] || strchr(kiln_last_error(), '\n'))
            __builtin_trap();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (int32_t i = 0; i < kiln_safetensors_count(st); i++) {
        const kiln_safetensors_tensor *t = kiln_safetensors_tensor_at(st, i);
        if (t->size) {
            sink ^= ((const uint8_t *)t->data)[0];
            sink ^= ((const uint8_t *)t->data)[t->size - 1];
        }
        const kiln_safetensors_tensor *found = NULL;
        if (kiln_safetensors_find(st, t->name, &found) == KILN_OK && found != t)
            __builtin_trap();
    }
    for (int32_t i = 0; i < kiln_safetensors_metadata_count(st); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(st, i, &k, &v);
        if (kiln_safetensors_metadata(st, k) == NULL)
            __builtin_trap();
    }
    (void)sink;
    kiln_safetensors_destroy(st);
    return 0;
}
