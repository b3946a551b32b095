/* libFuzzer target: OpenAI request bodies (src/server/openai.c), as both
 * endpoints read them. A body either parses into a request whose every
 * pointer is usable, or fails with a 400 that names what is wrong. */
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_llm_sampling defaults; /* kiln serve's: llama.cpp's */
    kiln_llm_sampling_init(&defaults);
    defaults.temperature = 0.8f;
    defaults.top_k = 40;
    defaults.top_p = 0.95f;
    defaults.min_p = 0.05f;
    for (int ep = KILN_OPENAI_COMPLETIONS; ep <= KILN_OPENAI_CHAT; ep++) {
        kiln_openai_request r;
        kiln_openai_error e;
        int st = kiln_openai_parse((kiln_openai_endpoint)ep, (const char *)data, size, &defaults, &r, &e);
        if (st != 0) {
            if ((st != 400 && st != 500) || !e.message[0] || r.root)
                abort(); /* a refusal is a 400 with a message, and leaves nothing behind */
            char *json = kiln_openai_error_json(&e);
            if (!json)
                abort();
            free(json);
            continue;
        }
        size_t total = r.prompt_len;
        for (size_t i = 0; i < r.n_messages; i++)
            total += strlen(r.messages[i]->role) + strlen(r.messages[i]->content);
        for (int32_t i = 0; i < r.n_stop; i++)
            total += strlen(r.stop[i]);
        for (size_t i = 0; i < r.n_prompt_ids; i++)
            if (r.prompt_ids[i] < 0)
                abort();
        if (r.logprobs > 20 || r.max_tokens == 0 || (ep == KILN_OPENAI_COMPLETIONS && !r.prompt && !r.n_prompt_ids))
            abort();
        json_t *o = kiln_openai_response_json((kiln_openai_endpoint)ep, "id", 0, r.model ? r.model : "m",
                                              r.prompt ? r.prompt : "", r.prompt_len, "stop", NULL, total, 0);
        if (!o)
            abort();
        json_decref(o);
        kiln_openai_request_free(&r);
    }
    return 0;
}
