/* Llama-family models: from a model description (shape + a source of
 * weights by Hugging Face name) to kiln's LLM step network and engine.
 *
 * Every importer (import_hf.c, import_gguf.c, import_llama2c.c) produces a
 * kiln_llm_checkpoint; kiln_llm_build_network turns it into the step network
 * of docs/llm.md and kiln_llm_build_engine adds the LLMC and TOKN sections
 * and builds it. */
#ifndef KILN_LLM_MODEL_H
#define KILN_LLM_MODEL_H

#include <kiln/builder.h>
#include <kiln/llm.h>
#include <kiln/network.h>

#include "llm/llm_config.h"
#include "llm/tokenizer.h"
#include "llm/woq.h"

/* Reads one weight by its Hugging Face name ("model.layers.3.self_attn.q_proj.weight",
 * "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight").
 * With dst == NULL: fills *dims (HF layout, [out, in] for matrices) and
 * returns KILN_ERROR_NOT_FOUND when the checkpoint has no such tensor.
 * With dst != NULL: writes the tensor converted to dst_type (F32, F16 or
 * BF16) into dst, which holds dst_size bytes (exactly the element count
 * times the dtype size). Errors name the file and the tensor. */
typedef kiln_status (*kiln_llm_weight_fn)(void *user, const char *name, kiln_dims *dims, kiln_dtype dst_type, void *dst,
                                          size_t dst_size);

/* A model ready to build: its shape (config: architecture through rope,
 * qkv_bias, tied_embeddings, vocab, special tokens, chat template,
 * generation defaults; the build limits are set by the build options), its
 * weights and its tokenizer. */
typedef struct kiln_llm_checkpoint {
    kiln_llm_config config;
    kiln_llm_weight_fn read_weight;
    void *weight_user;
    kiln_tokenizer *tokenizer; /* owned */
    void (*free_user)(void *user);
    /* Optional (GGUF): a weight's bytes as stored, borrowed from the
     * checkpoint: its ggml type (kiln_ggml_type), rows of blocks in the HF
     * [out, in] layout. KILN_ERROR_NOT_FOUND when absent. NULL when the
     * format has no quantized weights. */
    kiln_status (*read_quantized)(void *user, const char *name, uint32_t *ggml_type, const void **data, size_t *size);
    /* Optional (AWQ, GPTQ): weight `name` ("….q_proj.weight") as stored,
     * unpacked into *out (allocated; the caller frees it with
     * kiln_woq_free). KILN_ERROR_NOT_FOUND when it is not stored
     * quantized. NULL when the format has no such weights. */
    kiln_status (*read_woq)(void *user, const char *name, kiln_woq_weight *out);
    /* The checkpoint's own chat template (Jinja source) and the BOS / EOS
     * token texts it is rendered with; owned, NULL when absent. */
    char *chat_template;
    char *bos_token;
    char *eos_token;
    /* Static activation scales of an FP8 build (calibration, calibrate.c):
     * the max |x| of each FP8 matmul input, KILN_LLM_CALIB_SITES a layer
     * in the order of kiln_llm_calib_site; NULL: per-token scales. Owned. */
    float *act_amax;
    /* A calibration build (calibrate.c): weights in the dtype, layers
     * unfused, and each site's max |x| a row as the f32 output
     * "calib.<layer * KILN_LLM_CALIB_SITES + site>" ([tokens, 1]). */
    int probe;
} kiln_llm_checkpoint;

/* The inputs of a decoder layer's FP8 matmuls, whose activation scales a
 * calibration fixes. */
enum kiln_llm_calib_site {
    KILN_LLM_CALIB_QKV = 0, /* the input norm's output */
    KILN_LLM_CALIB_O,       /* the attention's output */
    KILN_LLM_CALIB_GATE_UP, /* the post-attention norm's output */
    KILN_LLM_CALIB_DOWN,    /* SwiGLU's output */
    KILN_LLM_CALIB_SITES
};

/* Static activation maxima for an FP8 build of `ck` (o->weights FP8,
 * o->calibrate a text file): a calibration engine (ck->probe) is built
 * beside `output` (output + ".calib", removed after), the first
 * o->calibrate_tokens tokens of the text are run through it teacher-forced,
 * and ck->act_amax receives each site's max |x| over them.
 * *n_tokens: the tokens used. */
kiln_status kiln_llm_calibrate(kiln_llm_checkpoint *ck, const kiln_llm_build_options *o, const char *output,
                               int32_t *n_tokens);

/* Copies the chat template (len bytes) and the token texts (NUL-terminated;
 * each may be NULL: absent) into ck, replacing what it had. */
kiln_status kiln_llm_checkpoint_set_chat(kiln_llm_checkpoint *ck, const char *tmpl, size_t len, const char *bos,
                                         const char *eos);

/* Frees the tokenizer, the weight source and the struct. NULL is a no-op. */
void kiln_llm_checkpoint_free(kiln_llm_checkpoint *ck);

/* The build options are the public kiln_llm_build_options (kiln/llm.h),
 * taken here at the library's own size. Its `native` -1 ("on for a GGUF")
 * is resolved by kiln_llm_build; below, only 1 keeps weights quantized,
 * and the tokenizer member is not read (the checkpoint has one). */

/* Checks the model shape (positive dims, heads * head_dim consistency,
 * n_heads % n_kv_heads, even rotary_dim). Errors name the field. */
kiln_status kiln_llm_config_validate(const kiln_llm_config *cfg);

/* The step network of docs/llm.md, weights as constants in opt->dtype.
 * Fills the build limits (dtype, max_*, block_size) into ck->config, which
 * is then what the LLMC section records. `reg` must hold the built-in
 * plugins and outlive the network. */
kiln_status kiln_llm_build_network(kiln_llm_checkpoint *ck, const kiln_llm_build_options *opt, kiln_registry *reg,
                                   kiln_network **out);

/* Appends the sampling layer to a step network (docs/llm.md): kiln/Sample
 * over the network's "logits" output and step inputs, with the inputs
 * "sample_params" (f32 [S, 7]), "sample_seq" (i32 [S, 4]), S in
 * [1, max_batch], and "sample_state" (i32 [max_batch, vocab], the
 * penalties' history, updated in place), and the output "next_token"
 * (i32 [S]). plugins/sample/sample.c describes each column. */
kiln_status kiln_llm_add_sampling(kiln_network *net, int32_t max_batch, int32_t vocab);

/* Appends an extra engine section (data copied) to a network, which
 * kiln_build copies into the engine verbatim (graph.sections). */
kiln_status kiln_llm_network_add_section(kiln_network *net, uint32_t id, const void *data, size_t size);

#define KILN_LLM_SECTION_CONFIG KILN_FOURCC('L', 'L', 'M', 'C')
#define KILN_LLM_SECTION_TOKENIZER KILN_FOURCC('T', 'O', 'K', 'N')
#define KILN_LLM_SECTION_CHAT KILN_FOURCC('C', 'H', 'A', 'T')

/* kiln_llm_build_network, the sampling layer (kiln_llm_add_sampling), the
 * LLMC and TOKN sections (and CHAT when the checkpoint has a chat template,
 * which must parse: the error names the construct and line), then
 * kiln_build for opt->backend into *engine.
 * `bcfg` may be NULL (defaults; its backend is opt->backend, its progress
 * is replaced by opt->progress). */
kiln_status kiln_llm_build_engine(kiln_llm_checkpoint *ck, const kiln_llm_build_options *opt, kiln_registry *reg,
                                  const kiln_build_config *bcfg, kiln_buffer *engine);
/* The same, written to the file `path` (kiln_build_to_file): the weights
 * go from the network's constants to the file, held in memory once. */
kiln_status kiln_llm_build_engine_file(kiln_llm_checkpoint *ck, const kiln_llm_build_options *opt, kiln_registry *reg,
                                       const kiln_build_config *bcfg, const char *path);

/* ---- importers (import_*.c) -------------------------------------------- */

/* A Hugging Face model directory: config.json, model.safetensors or
 * model.safetensors.index.json + shards, tokenizer.json,
 * tokenizer_config.json and generation_config.json (both optional). */
kiln_status kiln_llm_import_hf(const char *dir, kiln_llm_checkpoint **out);

/* A GGUF file (architecture llama or qwen2); tensors are dequantized when
 * read. */
kiln_status kiln_llm_import_gguf(const char *path, kiln_llm_checkpoint **out);

/* A llama2.c checkpoint and its tokenizer.bin. */
kiln_status kiln_llm_import_llama2c(const char *path, const char *tokenizer_path, kiln_llm_checkpoint **out);

/* The llama2.c header (7 int32) as the importer validates it against a file
 * of file_size bytes: shape into *cfg, *shared (classifier tied),
 * *weights_bytes (bytes of weights after the header). Exposed for the fuzz
 * target. */
kiln_status kiln_llm_llama2c_parse_header(const void *data, size_t file_size, const char *what, kiln_llm_config *cfg,
                                          int *shared, size_t *weights_bytes);

/* config.json's quantization_config: how a checkpoint's linear layers
 * are stored (AWQ's GEMM layout or GPTQ's, 4 bits). */
typedef struct kiln_llm_quant_config {
    int32_t method;      /* KILN_LLM_QUANT_* */
    int32_t group;       /* group_size; -1: a whole row */
    int32_t zero_offset; /* GPTQ's original format stores zero points minus 1 */
} kiln_llm_quant_config;

enum { KILN_LLM_QUANT_NONE, KILN_LLM_QUANT_AWQ, KILN_LLM_QUANT_GPTQ };

/* Parses config.json's quantization_config (method NONE when absent);
 * what kiln cannot read as stored (other methods or bit widths, AWQ's GEMV
 * layout) is refused naming the key. Exposed for the fuzz target. */
kiln_status kiln_llm_hf_parse_quant_config(const char *text, size_t len, const char *what, kiln_llm_quant_config *out);

/* Parses a Hugging Face config.json text into the shape part of *cfg.
 * Errors name `what` (the file) and the key. Exposed for the fuzz target. */
kiln_status kiln_llm_hf_parse_config(const char *text, size_t len, const char *what, kiln_llm_config *cfg);

#endif
