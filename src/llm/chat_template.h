/* Chat templates: a conversation rendered to the text the model was tuned
 * on, by the checkpoint's own Jinja template when the engine carries one
 * (jinja.h), else by one of three built-in formats written out by hand from
 * each family's template (Hugging Face tokenizer_config.json). The text is
 * then tokenized with special-token parsing and nothing added. */
#ifndef KILN_LLM_CHAT_TEMPLATE_H
#define KILN_LLM_CHAT_TEMPLATE_H

#include <kiln/llm.h>

#include "llm/jinja.h"
#include "llm/llm_config.h"

/* One turn, as kiln_llm_chat_tokenize reads it from the caller's
 * kiln_llm_message. */
typedef struct kiln_chat_message {
    const char *role;
    const char *content;
} kiln_chat_message;

typedef struct kiln_chat_tokens {
    const char *bos; /* llama2: the BOS token's text ("<s>") */
    const char *eos; /* llama2: the EOS token's text ("</s>") */
} kiln_chat_tokens;

/* Renders messages (roles "system", "user", "assistant"), then the
 * assistant's header when add_generation_prompt (ChatML, Llama 3; the
 * [INST] format ends its user turns with " [/INST]" anyway).
 * default_system (may be NULL) is inserted as the system message when the
 * conversation has none, as SmolLM2's template does. *out malloc'd,
 * NUL-terminated. KILN_ERROR_UNSUPPORTED for KILN_LLM_CHAT_NONE,
 * KILN_ERROR_INVALID_ARGUMENT for an unknown role (or, for llama2, a system
 * message that is not first, or turns that do not alternate user/assistant). */
kiln_status kiln_chat_render(kiln_llm_chat_template tmpl, const kiln_chat_message *msgs, size_t n,
                             int add_generation_prompt, const char *default_system, const kiln_chat_tokens *tokens,
                             char **out, size_t *len);

/* The checkpoint's own template (the engine's CHAT section): renders
 * messages (any roles; the template decides) as transformers'
 * apply_chat_template does, with add_generation_prompt, bos_token and
 * eos_token (NULL: left undefined, as a tokenizer without that token
 * leaves it) and tools / documents None. *out malloc'd.
 * KILN_ERROR_INVALID_ARGUMENT when the template raises or fails, with its
 * message and line. */
kiln_status kiln_chat_render_jinja(const kiln_jinja *tmpl, const kiln_chat_message *msgs, size_t n,
                                   int add_generation_prompt, const kiln_chat_tokens *tokens, char **out, size_t *len);

#endif
