/* Reading JSON that kiln did not write (config.json, generation_config.json,
 * tokenizer_config.json, tokenizer.json, safetensors headers). */
#ifndef KILN_CORE_JSON_FILE_H
#define KILN_CORE_JSON_FILE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* json_loadb(text, len, flags, err) that reads every number as a real:
 * Python's json writes integers of any size (transformers stores
 * model_max_length = int(1e30) when a tokenizer has no limit), and jansson
 * refuses an integer beyond int64 unless it reads integers as reals. Read
 * integer fields back with kiln_json_int. Returns a new reference or NULL
 * with err filled. */
json_t *kiln_json_load_file_text(const char *text, size_t len, size_t flags, json_error_t *err);

/* True, with *out set, when v is a number with an integral value that a
 * double holds exactly (|x| <= 2^53, enough for any count, id or offset
 * kiln reads); false (and *out untouched) otherwise. */
bool kiln_json_int(const json_t *v, int64_t *out);

#endif
