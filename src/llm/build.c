/* The public LLM build (kiln_llm_build: checkpoint file or folder to
 * engine file) and the LLM description of an engine file
 * (kiln_llm_describe_json), both in include/kiln/llm.h. */
#include <kiln/kiln.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/api_struct.h"
#include "core/error.h"
#include "core/file.h"
#include "runtime/engine_image.h"
#include "llm/llm_config.h"
#include "llm/model.h"
#include "llm/tokenizer.h"

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The importer the checkpoint's form calls for. */
static kiln_status import_checkpoint(const char *path, const kiln_llm_build_options *o, int *is_gguf,
                                     kiln_llm_checkpoint **ck)
{
    struct stat sb;
    *is_gguf = 0;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return kiln_llm_import_hf(path, ck);
    if (ends_with(path, ".gguf")) {
        *is_gguf = 1;
        return kiln_llm_import_gguf(path, ck);
    }
    if (ends_with(path, ".bin")) {
        if (!o->tokenizer)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "%s: a llama2.c checkpoint needs its tokenizer.bin (the tokenizer option)", path);
        return kiln_llm_import_llama2c(path, o->tokenizer, ck);
    }
    return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                     "%s is not a checkpoint: expected a Hugging Face model folder, a .gguf or a llama2.c .bin", path);
}

kiln_status kiln_llm_build(const char *checkpoint, const kiln_llm_build_options *options, const char *output)
{
    if (!checkpoint || !output || !*output)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_build: checkpoint and output are required");
    /* Refused before the build, which may take long. */
    KILN_TRY(kiln_file_check_output(output));
    kiln_llm_build_options o;
    kiln_llm_build_options_init(&o);
    if (options)
        KILN_TRY(kiln_api_struct_read(&o, sizeof o, options, "LLM build options"));
    int is_gguf;
    kiln_llm_checkpoint *ck = NULL;
    KILN_TRY(import_checkpoint(checkpoint, &o, &is_gguf, &ck));
    if (o.native < 0)
        o.native = is_gguf;
    kiln_registry *reg = NULL;
    kiln_status s = KILN_OK;
    if (o.calibrate) {
        int32_t n = 0;
        s = kiln_llm_calibrate(ck, &o, output, &n);
        ck->config.calibration_tokens = n;
    }
    if (s == KILN_OK)
        s = kiln_registry_create(&reg);
    if (s == KILN_OK)
        s = kiln_llm_build_engine_file(ck, &o, reg, NULL, output);
    kiln_registry_destroy(reg);
    kiln_llm_checkpoint_free(ck);
    return s;
}

/* ---- describing ---------------------------------------------------------------------- */

/* The tokenizer section's kind (from its serialized form: a vocab list or
 * a tokenizer.json), vocabulary size, BOS and EOS. */
static json_t *tokenizer_summary(const void *data, size_t size)
{
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_deserialize(data, size, &tok) != KILN_OK)
        return json_pack("{s:s}", "error", kiln_last_error());
    const char *kind = "unknown";
    const char *body = memchr(data, '\n', size);
    if (size > 22 && memcmp((const char *)data + 17, "vocab", 5) == 0 && body) {
        json_t *v = json_loadb(body + 1, size - (size_t)(body + 1 - (const char *)data), 0, NULL);
        const char *k = json_string_value(json_object_get(v, "kind"));
        kind = k && !strcmp(k, "spm") ? "spm" : k ? "byte_bpe" : kind;
        json_decref(v);
    } else if (body) {
        /* tokenizer.json: byte fallback marks the SentencePiece style */
        size_t rest = size - (size_t)(body - (const char *)data);
        kind = memmem(body, rest, "\"byte_fallback\": true", 21) || memmem(body, rest, "\"byte_fallback\":true", 20)
                   ? "spm (tokenizer.json)"
                   : "byte_bpe (tokenizer.json)";
    }
    json_t *o = json_pack("{s:s,s:I,s:I,s:I}", "kind", kind, "vocab_size", (json_int_t)kiln_tokenizer_vocab_size(tok),
                          "bos", (json_int_t)kiln_tokenizer_bos_id(tok), "eos", (json_int_t)kiln_tokenizer_eos_id(tok));
    kiln_tokenizer_free(tok);
    return o;
}

kiln_status kiln_llm_describe_json(const char *path, char **json)
{
    if (!path || !json)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_describe_json: path and json are required");
    kiln_engine_image img;
    KILN_TRY(kiln_engine_image_open(path, &img));
    const kiln_section_rec *cfg = kiln_graph_find_section(&img.graph, KILN_LLM_SECTION_CONFIG);
    const kiln_section_rec *tok = kiln_graph_find_section(&img.graph, KILN_LLM_SECTION_TOKENIZER);
    if (!cfg) {
        kiln_engine_image_close(&img);
        return kiln_fail(KILN_ERROR_NOT_FOUND, "%s is not an LLM engine: it has no LLMC section", path);
    }
    json_t *root = json_loadb(cfg->data, cfg->size, 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        root = json_pack("{s:s}", "error", "LLMC section is not a JSON object");
    } else {
        kiln_llm_config c;
        if (kiln_llm_config_from_json(cfg->data, cfg->size, &c) != KILN_OK)
            json_object_set_new(root, "error", json_string(kiln_last_error()));
    }
    if (root && tok)
        json_object_set_new(root, "tokenizer", tokenizer_summary(tok->data, tok->size));
    else if (root)
        json_object_set_new(root, "tokenizer", json_pack("{s:s}", "error", "no TOKN section"));
    kiln_engine_image_close(&img);
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory describing %s", path);
    *json = text;
    return KILN_OK;
}
