/* libFuzzer target: Hugging Face config.json parsing (the shape and the
 * quantization_config), and the LLMC section parser (a config that parses
 * must also survive a round trip). */
#include <stdlib.h>
#include <string.h>

#include "llm/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_llm_config cfg;
    kiln_llm_hf_parse_config((const char *)data, size, "fuzz/config.json", &cfg);
    kiln_llm_quant_config qc;
    kiln_llm_hf_parse_quant_config((const char *)data, size, "fuzz/config.json", &qc);
    if (kiln_llm_config_from_json(data, size, &cfg) == KILN_OK) {
        char *json = NULL;
        size_t len = 0;
        kiln_llm_config back;
        if (kiln_llm_config_to_json(&cfg, &json, &len) == KILN_OK &&
            (kiln_llm_config_from_json(json, len, &back) != KILN_OK || memcmp(&back, &cfg, sizeof cfg) != 0))
            abort(); /* what kiln writes, kiln must read back identically */
        free(json);
    }
    return 0;
}
