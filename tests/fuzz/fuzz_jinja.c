/* libFuzzer target: the Jinja chat-template interpreter. Every input is a
 * template; one that parses is rendered for a small conversation (with and
 * without a system turn), so both the parser and the evaluator see hostile
 * text. Failing is fine; crashing, hanging or unbounded memory is not. */
#include <stdlib.h>

#include "llm/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_jinja *t = NULL;
    if (kiln_jinja_parse((const char *)data, size, &t) != KILN_OK)
        return 0;
    json_t *vars =
        json_pack("{s:[{s:s,s:s},{s:s,s:s},{s:s,s:[i,f]}],s:b,s:s,s:s,s:n}", "messages", "role", "system", "content",
                  "  Be brief.\n", "role", "user", "content", "Ça va? 日本", "role", "tool", "content", 7, 2.5,
                  "add_generation_prompt", 1, "bos_token", "<s>", "eos_token", "</s>", "tools");
    char *out = NULL;
    size_t len = 0;
    if (kiln_jinja_render(t, vars, &out, &len) == KILN_OK)
        free(out);
    json_decref(vars);
    kiln_jinja_free(t);
    return 0;
}
