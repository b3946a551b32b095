/* A Jinja-subset interpreter for Hugging Face chat templates.
 *
 * Covers what published chat templates use, in the environment
 * transformers' apply_chat_template renders them in (trim_blocks and
 * lstrip_blocks on, the loop controls extension, a json.dumps tojson,
 * raise_exception and strftime_now): {{ }}, {% %}, {# #}, whitespace
 * control, if/elif/else, for (with loop.*, an inline if, else), set (also
 * ns.attr and set blocks), namespace(), break/continue, slicing, string and
 * dict methods, the filters and tests such templates call. Not: macros,
 * call blocks, includes, inheritance, autoescaping.
 *
 * Parsing checks every tag, filter and test name, so a template kiln
 * cannot render fails when an engine is built, naming the construct and
 * the line. Rendering is bounded (output size, memory, loop iterations,
 * nesting depth): a hostile template fails, it does not hang. */
#ifndef KILN_LLM_JINJA_H
#define KILN_LLM_JINJA_H

#include <jansson.h>
#include <kiln/status.h>
#include <stddef.h>

typedef struct kiln_jinja kiln_jinja;

/* Parses len bytes of template source. Errors (KILN_ERROR_FORMAT) read
 * "chat template line N: ..." and name the construct. *out owned by the
 * caller (kiln_jinja_free). */
kiln_status kiln_jinja_parse(const char *src, size_t len, kiln_jinja **out);

/* NULL is a no-op. */
void kiln_jinja_free(kiln_jinja *t);

/* Renders with the variables of `vars` (a JSON object, borrowed: messages,
 * add_generation_prompt, bos_token, ...; JSON null is Python's None, a
 * name not given is undefined). *out malloc'd and NUL-terminated, *len
 * without the NUL. KILN_ERROR_INVALID_ARGUMENT when the template fails
 * (raise_exception, a type error, a limit reached), naming the line. */
kiln_status kiln_jinja_render(const kiln_jinja *t, const json_t *vars, char **out, size_t *len);

#endif
