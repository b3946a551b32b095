/* Checkpoint importers and the LLMC config: what they read from each
 * format, and the one-line errors for broken or unsupported input. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm/import_util.h"
#include "llm/model.h"
#include "test.h"

#define DATA "tests/data/llm/"

static char tmpdir[256];

/* A scratch copy of a family directory with one file replaced. */
static void copy_file(const char *from, const char *to)
{
    char *data = NULL;
    size_t len = 0;
    if (kiln_llm_read_file(from, &data, &len) != KILN_OK)
        return;
    FILE *f = fopen(to, "wb");
    if (f) {
        fwrite(data, 1, len, f);
        fclose(f);
    }
    free(data);
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, len, f);
        fclose(f);
    }
}

static const char *scratch(const char *family)
{
    static char dir[320];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, family);
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "generation_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a[384], b[384];
        snprintf(a, sizeof a, DATA "%s/%s", family, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        copy_file(a, b);
    }
    return dir;
}

static void put(const char *dir, const char *name, const char *text)
{
    char p[384];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_file(p, text, strlen(text));
}

/* ---- HF ------------------------------------------------------------------ */

static void test_hf_reads_families(void)
{
    kiln_llm_checkpoint *ck = NULL;
    CHECK_OK(kiln_llm_import_hf(DATA "qwen2", &ck));
    if (ck) {
        const kiln_llm_config *c = &ck->config;
        CHECK(strcmp(c->architecture, "qwen2") == 0 && c->qkv_bias == 1 && c->tied_embeddings == 0);
        CHECK(c->hidden_size == 64 && c->n_layers == 2 && c->n_heads == 4 && c->n_kv_heads == 2 && c->head_dim == 16);
        CHECK(c->intermediate_size == 96 && c->vocab_size == 320 && c->rope.theta == 1000000.0);
        /* Qwen2.5's files: bos_token_id is <|endoftext|>, which its
         * tokenizer never adds; generation_config.json stops at <|im_end|>
         * or <|endoftext|> and samples with temperature 0.7, top_p 0.8,
         * top_k 20, repetition_penalty 1.05 */
        int32_t endoftext = kiln_tokenizer_token_id(ck->tokenizer, "<|endoftext|>", 13);
        CHECK(c->chat_template == KILN_LLM_CHAT_CHATML && c->bos_id == endoftext && c->add_bos == 0);
        CHECK(c->generation.has_temperature && fabs(c->generation.temperature - 0.7) < 1e-12);
        CHECK(c->generation.has_top_p && fabs(c->generation.top_p - 0.8) < 1e-12);
        CHECK(c->generation.has_top_k && c->generation.top_k == 20);
        CHECK(c->generation.has_repetition_penalty && fabs(c->generation.repetition_penalty - 1.05) < 1e-12);
        CHECK(c->generation.has_do_sample && c->generation.do_sample == 1);
        CHECK(c->n_eos == 2 && c->eos_ids[0] == kiln_tokenizer_token_id(ck->tokenizer, "<|im_end|>", 10) &&
              c->eos_ids[1] == endoftext);
        /* bf16 tensors: 1.0 + 0.2 randn norm weights read back as floats near 1 */
        kiln_dims d;
        float w[64];
        CHECK_OK(ck->read_weight(ck->weight_user, "model.norm.weight", &d, KILN_DTYPE_F32, NULL, 0));
        CHECK(d.rank == 1 && d.d[0] == 64);
        CHECK_OK(ck->read_weight(ck->weight_user, "model.norm.weight", &d, KILN_DTYPE_F32, w, sizeof w));
        CHECK(w[0] > 0.2f && w[0] < 1.8f);
        CHECK(ck->read_weight(ck->weight_user, "model.nope", &d, KILN_DTYPE_F32, NULL, 0) == KILN_ERROR_NOT_FOUND);
    }
    kiln_llm_checkpoint_free(ck);
    ck = NULL;
    /* sharded (mistral), tied (smollm), sentencepiece-style tokenizer with BOS (tinyllama) */
    CHECK_OK(kiln_llm_import_hf(DATA "mistral", &ck));
    if (ck) {
        kiln_dims d;
        CHECK(strcmp(ck->config.architecture, "mistral") == 0);
        CHECK(ck->config.chat_template == KILN_LLM_CHAT_LLAMA2);
        CHECK_OK(ck->read_weight(ck->weight_user, "lm_head.weight", &d, KILN_DTYPE_F32, NULL, 0));
        CHECK_OK(ck->read_weight(ck->weight_user, "model.embed_tokens.weight", &d, KILN_DTYPE_F32, NULL, 0));
    }
    kiln_llm_checkpoint_free(ck);
    ck = NULL;
    CHECK_OK(kiln_llm_import_hf(DATA "smollm", &ck));
    CHECK(ck && ck->config.tied_embeddings == 1 && ck->config.rope.theta == 100000.0);
    kiln_llm_checkpoint_free(ck);
    ck = NULL;
    CHECK_OK(kiln_llm_import_hf(DATA "tinyllama", &ck));
    CHECK(ck && ck->config.bos_id == 1 && ck->config.add_bos == 1 && ck->config.eos_ids[0] == 2);
    kiln_llm_checkpoint_free(ck);
    ck = NULL;
    /* saved by transformers: tokenizer_config.json has model_max_length
     * int(1e30) and names BOS/EOS, config.json has no chat template */
    CHECK_OK(kiln_llm_import_hf(DATA "llama", &ck));
    CHECK(ck && ck->config.bos_id == 0 && ck->config.add_bos == 1 && ck->config.n_eos == 1 &&
          ck->config.eos_ids[0] == 1);
    kiln_llm_checkpoint_free(ck);
}

static void test_hf_config_forms(void)
{
    kiln_llm_config c;
    /* transformers 4: rope_theta + rope_scaling {type: linear}; head_dim
     * from hidden / heads; no kv heads = MHA; untied by default */
    const char *v4 =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64,"
        "\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":8,"
        "\"rms_norm_eps\":1e-5,\"rope_theta\":5000.0,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}";
    CHECK_OK(kiln_llm_hf_parse_config(v4, strlen(v4), "v4.json", &c));
    CHECK(c.head_dim == 8 && c.n_kv_heads == 8 && c.rope.theta == 5000.0 && c.rope.scaling == KILN_LLM_ROPE_LINEAR &&
          c.rope.factor == 2.0 && c.tied_embeddings == 0 && c.qkv_bias == 0 && c.rms_norm_eps == 1e-5);
    /* transformers 5: rope_parameters with llama3 scaling */
    const char *v5 = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64,"
                     "\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                     "\"num_key_value_heads\":1,\"tie_word_embeddings\":true,\"rope_parameters\":{\"rope_theta\":"
                     "500000.0,\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":"
                     "4.0,\"original_max_position_embeddings\":8192}}";
    CHECK_OK(kiln_llm_hf_parse_config(v5, strlen(v5), "v5.json", &c));
    CHECK(c.rope.theta == 500000.0 && c.rope.scaling == KILN_LLM_ROPE_LLAMA3 && c.rope.factor == 32.0 &&
          c.rope.original_max_pos == 8192 && c.n_kv_heads == 1 && c.tied_embeddings == 1 && c.head_dim == 16);
    /* Mistral's sliding window limits the context (kiln attends without one) */
    const char *mi = "{\"architectures\":[\"MistralForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64,"
                     "\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                     "\"max_position_embeddings\":32768,\"sliding_window\":4096}";
    CHECK_OK(kiln_llm_hf_parse_config(mi, strlen(mi), "m.json", &c));
    CHECK(c.max_position_embeddings == 4096);
    /* Qwen2 always has q/k/v biases */
    const char *qw = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64,"
                     "\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":4}";
    CHECK_OK(kiln_llm_hf_parse_config(qw, strlen(qw), "q.json", &c));
    CHECK(c.qkv_bias == 1);
    /* Python writes integers of any size; kiln reads past those it does not use */
    const char *big = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64,"
                      "\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                      "\"model_max_length\":1000000000000000019884624838656,\"x\":[-123456789012345678901234567890]}";
    CHECK_OK(kiln_llm_hf_parse_config(big, strlen(big), "big.json", &c));
    CHECK(c.hidden_size == 64 && c.n_layers == 1);
}

static void test_hf_config_errors(void)
{
    kiln_llm_config c;
    const char *bad_json = "{\"architectures\": [";
    CHECK_FAILS(kiln_llm_hf_parse_config(bad_json, strlen(bad_json), "x/config.json", &c), KILN_ERROR_FORMAT,
                "x/config.json: invalid JSON");
    const char *missing = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,\"intermediate_size\":128,"
                          "\"num_hidden_layers\":1,\"num_attention_heads\":4}";
    CHECK_FAILS(kiln_llm_hf_parse_config(missing, strlen(missing), "x/config.json", &c), KILN_ERROR_FORMAT,
                "missing key \"hidden_size\"");
    const char *arch = "{\"architectures\":[\"GPT2LMHeadModel\"]}";
    CHECK_FAILS(kiln_llm_hf_parse_config(arch, strlen(arch), "x/config.json", &c), KILN_ERROR_UNSUPPORTED,
                "GPT2LMHeadModel");
    const char *gqa = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64,"
                      "\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                      "\"num_key_value_heads\":3}";
    CHECK_FAILS(kiln_llm_hf_parse_config(gqa, strlen(gqa), "x/config.json", &c), KILN_ERROR_FORMAT,
                "not a multiple of \"num_key_value_heads\"");
    const char *yarn = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64,"
                       "\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                       "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}}";
    CHECK_FAILS(kiln_llm_hf_parse_config(yarn, strlen(yarn), "x/config.json", &c), KILN_ERROR_UNSUPPORTED, "yarn");
    const char *neg = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":-5,\"hidden_size\":64,"
                      "\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":4}";
    CHECK_FAILS(kiln_llm_hf_parse_config(neg, strlen(neg), "x/config.json", &c), KILN_ERROR_FORMAT,
                "\"vocab_size\" = -5");
    const char *huge = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,"
                       "\"hidden_size\":1000000000000000019884624838656}";
    CHECK_FAILS(kiln_llm_hf_parse_config(huge, strlen(huge), "x/config.json", &c), KILN_ERROR_FORMAT,
                "\"hidden_size\": expected an integer");
    const char *frac = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64.5}";
    CHECK_FAILS(kiln_llm_hf_parse_config(frac, strlen(frac), "x/config.json", &c), KILN_ERROR_FORMAT,
                "\"hidden_size\": expected an integer");
    const char *str = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,\"hidden_size\":\"64\"}";
    CHECK_FAILS(kiln_llm_hf_parse_config(str, strlen(str), "x/config.json", &c), KILN_ERROR_FORMAT,
                "\"hidden_size\": expected an integer");
}

static void test_hf_directory_errors(void)
{
    kiln_llm_checkpoint *ck = NULL;
    CHECK_FAILS(kiln_llm_import_hf(DATA "does-not-exist", &ck), KILN_ERROR_NOT_FOUND, "config.json");
    /* truncated safetensors */
    const char *dir = scratch("llama");
    char p[384];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    char *data = NULL;
    size_t len = 0;
    CHECK_OK(kiln_llm_read_file(DATA "llama/model.safetensors", &data, &len));
    if (data) {
        write_file(p, data, len / 2);
        CHECK(kiln_llm_import_hf(dir, &ck) != KILN_OK && strstr(kiln_last_error(), "model.safetensors"));
        write_file(p, "garbage!", 8);
        CHECK(kiln_llm_import_hf(dir, &ck) != KILN_OK && strstr(kiln_last_error(), "model.safetensors"));
        write_file(p, data, len);
    }
    free(data);
    /* the config disagrees with the tensors: the build names the tensor */
    char *cfg = NULL;
    size_t cl = 0;
    CHECK_OK(kiln_llm_read_file(DATA "llama/config.json", &cfg, &cl));
    char *at = cfg ? strstr(cfg, "\"intermediate_size\": 96") : NULL;
    CHECK(at != NULL);
    if (at) {
        memcpy(at, "\"intermediate_size\": 97", 23);
        put(dir, "config.json", cfg);
        kiln_registry *reg = NULL;
        kiln_network *net = NULL;
        CHECK_OK(kiln_registry_create(&reg));
        CHECK_OK(kiln_llm_import_hf(dir, &ck));
        kiln_llm_build_options opt;
        kiln_llm_build_options_init(&opt);
        opt.max_seq_len = 16;
        if (ck)
            CHECK_FAILS(kiln_llm_build_network(ck, &opt, reg, &net), KILN_ERROR_SHAPE,
                        "tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [96, 64], the config says [97, 64]");
        kiln_llm_checkpoint_free(ck);
        ck = NULL;
        memcpy(at, "\"intermediate_size\": 96", 23);
        /* more layers than tensors */
        char *nl = strstr(cfg, "\"num_hidden_layers\": 2");
        CHECK(nl != NULL);
        if (nl) {
            nl[21] = '3';
            put(dir, "config.json", cfg);
            CHECK_OK(kiln_llm_import_hf(dir, &ck));
            if (ck)
                CHECK_FAILS(kiln_llm_build_network(ck, &opt, reg, &net), KILN_ERROR_NOT_FOUND,
                            "no tensor \"model.layers.2.input_layernorm.weight\"");
            kiln_llm_checkpoint_free(ck);
            ck = NULL;
            nl[21] = '2';
        }
        /* the engine's context cannot exceed the model's (256 here) */
        put(dir, "config.json", cfg);
        CHECK_OK(kiln_llm_import_hf(dir, &ck));
        opt.max_seq_len = 257;
        if (ck)
            CHECK_FAILS(kiln_llm_build_network(ck, &opt, reg, &net), KILN_ERROR_INVALID_ARGUMENT,
                        "max_seq_len 257 exceeds the model's context of 256 tokens");
        kiln_llm_checkpoint_free(ck);
        ck = NULL;
        kiln_registry_destroy(reg);
        put(dir, "config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 1}");
        CHECK_FAILS(kiln_llm_import_hf(dir, &ck), KILN_ERROR_FORMAT, "config.json: missing key \"hidden_size\"");
        cfg[cl > 0 ? cl - 1 : 0] = '\0';
        put(dir, "config.json", cfg);
    }
    free(cfg);
    /* garbled tokenizer.json and generation_config.json */
    put(dir, "tokenizer.json", "{\"model\": 17}");
    CHECK(kiln_llm_import_hf(dir, &ck) != KILN_OK && strstr(kiln_last_error(), "tokenizer"));
    snprintf(p, sizeof p, DATA "llama/tokenizer.json");
    char q[384];
    snprintf(q, sizeof q, "%s/tokenizer.json", dir);
    copy_file(p, q);
    put(dir, "generation_config.json", "{\"eos_token_id\": \"x\"}");
    CHECK_FAILS(kiln_llm_import_hf(dir, &ck), KILN_ERROR_FORMAT, "generation_config.json: key \"eos_token_id\"");
    put(dir, "generation_config.json", "{\"eos_token_id\": [3, 9999]}");
    CHECK_FAILS(kiln_llm_import_hf(dir, &ck), KILN_ERROR_FORMAT, "not a token id below vocab_size 320");
    CHECK(ck == NULL);
    /* the two optional JSON files: not an object, not JSON, absent */
    const char *optional[2] = {"generation_config.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        char want[96];
        put(dir, optional[i], "[1, 2]");
        snprintf(want, sizeof want, "%s: expected a JSON object", optional[i]);
        CHECK_FAILS(kiln_llm_import_hf(dir, &ck), KILN_ERROR_FORMAT, want);
        put(dir, optional[i], "{\"bos_token\": ");
        snprintf(want, sizeof want, "%s: invalid JSON at line 1", optional[i]);
        CHECK_FAILS(kiln_llm_import_hf(dir, &ck), KILN_ERROR_FORMAT, want);
        CHECK(ck == NULL);
        snprintf(p, sizeof p, "%s/%s", dir, optional[i]);
        unlink(p);
    }
    /* without them: EOS from config.json, no chat template */
    CHECK_OK(kiln_llm_import_hf(dir, &ck));
    CHECK(ck && ck->config.n_eos >= 1 && ck->config.chat_template == KILN_LLM_CHAT_NONE);
    kiln_llm_checkpoint_free(ck);
    ck = NULL;
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, DATA "llama/%s", optional[i]);
        snprintf(q, sizeof q, "%s/%s", dir, optional[i]);
        copy_file(p, q);
    }
}

/* ---- GGUF ---------------------------------------------------------------- */

static void test_gguf_reads(void)
{
    kiln_llm_checkpoint *ck = NULL;
    CHECK_OK(kiln_llm_import_gguf(DATA "qwen2/model-q8_0.gguf", &ck));
    if (ck) {
        const kiln_llm_config *c = &ck->config;
        CHECK(strcmp(c->architecture, "qwen2") == 0 && c->qkv_bias && !c->rope.interleaved && !c->tied_embeddings);
        CHECK(c->n_kv_heads == 2 && c->head_dim == 16 && c->rope.theta == 1000000.0 && c->vocab_size == 320);
        CHECK(c->chat_template == KILN_LLM_CHAT_CHATML);
        /* GGUF dims reversed to HF's [out, in] */
        kiln_dims d;
        CHECK_OK(ck->read_weight(ck->weight_user, "model.layers.1.mlp.gate_proj.weight", &d, KILN_DTYPE_F32, NULL, 0));
        CHECK(d.rank == 2 && d.d[0] == 96 && d.d[1] == 64);
        CHECK_OK(ck->read_weight(ck->weight_user, "model.layers.1.self_attn.k_proj.bias", &d, KILN_DTYPE_F32, NULL, 0));
        CHECK(d.rank == 1 && d.d[0] == 32);
    }
    kiln_llm_checkpoint_free(ck);
    ck = NULL;
    CHECK_OK(kiln_llm_import_gguf(DATA "smollm/model-f16.gguf", &ck));
    CHECK(ck && ck->config.tied_embeddings && ck->config.rope.interleaved && ck->config.rope.theta == 100000.0);
    kiln_llm_checkpoint_free(ck);
    ck = NULL;
    /* rope_freqs.weight (Llama 3.1 scaling as factors) back to its parameters */
    CHECK_OK(kiln_llm_import_gguf(DATA "llama3/model-f16.gguf", &ck));
    CHECK(ck && ck->config.rope.scaling == KILN_LLM_ROPE_LLAMA3 && ck->config.rope.factor == 8.0 &&
          ck->config.rope.original_max_pos == 8192 && ck->config.rope.low_freq_factor == 1.0 &&
          ck->config.rope.high_freq_factor == 4.0);
    kiln_llm_checkpoint_free(ck);
}

/* Copies `from` to `to` with the first `n` bytes equal to `needle` replaced. */
static void patch_gguf(const char *from, const char *needle, const char *replacement, size_t n, const char *to)
{
    char *data = NULL;
    size_t len = 0;
    if (kiln_llm_read_file(from, &data, &len) != KILN_OK)
        return;
    char *at = memmem(data, len, needle, n);
    CHECK(at != NULL);
    if (at)
        memcpy(at, replacement, n);
    write_file(to, data, len);
    free(data);
}

static void test_gguf_errors(void)
{
    kiln_llm_checkpoint *ck = NULL;
    char p[320];
    snprintf(p, sizeof p, "%s/t.gguf", tmpdir);
    char *data = NULL;
    size_t len = 0;
    CHECK_OK(kiln_llm_read_file(DATA "smollm/model-q8_0.gguf", &data, &len));
    if (data) {
        write_file(p, data, len - 100);
        CHECK(kiln_llm_import_gguf(p, &ck) != KILN_OK && strstr(kiln_last_error(), "t.gguf"));
        write_file(p, data, 20);
        CHECK(kiln_llm_import_gguf(p, &ck) != KILN_OK && strstr(kiln_last_error(), "t.gguf"));
    }
    free(data);
    /* "llama" value of general.architecture → "lxama" */
    patch_gguf(DATA "smollm/model-q8_0.gguf", "\x05\0\0\0\0\0\0\0llama", "\x05\0\0\0\0\0\0\0lxama", 13, p);
    CHECK_FAILS(kiln_llm_import_gguf(p, &ck), KILN_ERROR_UNSUPPORTED, "general.architecture \"lxama\"");
    patch_gguf(DATA "smollm/model-q8_0.gguf", "llama.block_count", "llama.block_xount", 17, p);
    CHECK_FAILS(kiln_llm_import_gguf(p, &ck), KILN_ERROR_FORMAT, "missing key \"llama.block_count\"");
    patch_gguf(DATA "smollm/model-q8_0.gguf", "tokenizer.ggml.model", "tokenizer.ggml.mxdel", 20, p);
    CHECK_FAILS(kiln_llm_import_gguf(p, &ck), KILN_ERROR_FORMAT, "tokenizer.ggml.model");
    patch_gguf(DATA "smollm/model-q8_0.gguf", "token_embd.weight", "token_embx.weight", 17, p);
    CHECK_FAILS(kiln_llm_import_gguf(p, &ck), KILN_ERROR_FORMAT, "token_embd.weight");
    /* factor 8 (0x41000000) → 9 (0x41100000) in the low-frequency entries */
    patch_gguf(DATA "llama3/model-f16.gguf", "\0\0\0\x41\0\0\0\x41", "\0\0\x10\x41\0\0\x10\x41", 8, p);
    CHECK_FAILS(kiln_llm_import_gguf(p, &ck), KILN_ERROR_UNSUPPORTED, "rope_freqs.weight does not follow Llama 3");
    CHECK(ck == NULL);
}

/* ---- llama2.c ------------------------------------------------------------ */

static void test_llama2c_header(void)
{
    kiln_llm_config c;
    int shared;
    size_t wb;
    /* dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 10 (shared), seq 4 */
    int32_t h[7] = {8, 16, 1, 2, 1, 10, 4};
    /* emb 80 + rms 8 + wq 64 + wk 32 + wv 32 + wo 64 + rms 8 + w1/w2/w3 3*128 + final 8 + freqs 2*4*2 */
    size_t expect = (80 + 8 + 64 + 32 + 32 + 64 + 8 + 384 + 8 + 16) * 4;
    CHECK_OK(kiln_llm_llama2c_parse_header(h, 28 + expect, "m.bin", &c, &shared, &wb));
    CHECK(wb == expect && shared == 1 && c.head_dim == 4 && c.rope.interleaved == 1 && c.rms_norm_eps == 1e-5);
    CHECK_FAILS(kiln_llm_llama2c_parse_header(h, 28 + expect - 4, "m.bin", &c, &shared, &wb), KILN_ERROR_FORMAT,
                "m.bin: 2780 bytes of weights, the header");
    h[5] = -10; /* unshared classifier: 80 more floats */
    CHECK_OK(kiln_llm_llama2c_parse_header(h, 28 + expect + 320, "m.bin", &c, &shared, &wb));
    CHECK(shared == 0 && c.vocab_size == 10 && c.tied_embeddings == 0);
    h[3] = 3;
    CHECK_FAILS(kiln_llm_llama2c_parse_header(h, 28 + expect, "m.bin", &c, &shared, &wb), KILN_ERROR_FORMAT,
                "not a multiple of n_heads 3");
    h[3] = 2;
    h[4] = 0;
    CHECK_FAILS(kiln_llm_llama2c_parse_header(h, 28 + expect, "m.bin", &c, &shared, &wb), KILN_ERROR_FORMAT,
                "n_kv_heads = 0");
    CHECK_FAILS(kiln_llm_llama2c_parse_header(h, 10, "m.bin", &c, &shared, &wb), KILN_ERROR_FORMAT, "too short");
    int32_t huge[7] = {1 << 20, 1 << 30, 1 << 16, 1, 1, 1 << 30, 1 << 30};
    CHECK(kiln_llm_llama2c_parse_header(huge, 1 << 20, "m.bin", &c, &shared, &wb) == KILN_ERROR_FORMAT);
    memcpy(h, "24ka", 4);
    CHECK_FAILS(kiln_llm_llama2c_parse_header(h, 28 + expect, "m.bin", &c, &shared, &wb), KILN_ERROR_UNSUPPORTED,
                "ak42");
}

static void test_llama2c_import(void)
{
    kiln_llm_checkpoint *ck = NULL;
    CHECK_OK(kiln_llm_import_llama2c(DATA "tinyllama/model.bin", DATA "tinyllama/tokenizer.bin", &ck));
    if (ck) {
        CHECK(ck->config.vocab_size == 320 && ck->config.tied_embeddings == 0 && ck->config.n_layers == 2);
        CHECK(ck->config.bos_id == 1 && ck->config.eos_ids[0] == 2 && ck->config.max_position_embeddings == 256);
        kiln_dims d;
        CHECK_OK(ck->read_weight(ck->weight_user, "model.layers.1.mlp.down_proj.weight", &d, KILN_DTYPE_F32, NULL, 0));
        CHECK(d.d[0] == 64 && d.d[1] == 96);
    }
    kiln_llm_checkpoint_free(ck);
    ck = NULL;
    CHECK_FAILS(kiln_llm_import_llama2c(DATA "tinyllama/model.bin", NULL, &ck), KILN_ERROR_INVALID_ARGUMENT,
                "--tokenizer");
    char p[320];
    snprintf(p, sizeof p, "%s/t.bin", tmpdir);
    char *data = NULL;
    size_t len = 0;
    CHECK_OK(kiln_llm_read_file(DATA "tinyllama/model.bin", &data, &len));
    if (data) {
        write_file(p, data, len - 1);
        CHECK_FAILS(kiln_llm_import_llama2c(p, DATA "tinyllama/tokenizer.bin", &ck), KILN_ERROR_FORMAT,
                    "truncated or not a llama2.c checkpoint");
    }
    free(data);
    /* a tokenizer with more tokens than the model's vocabulary */
    CHECK(kiln_llm_import_llama2c(DATA "tinyllama/model.bin", DATA "llama/model-f32.gguf", &ck) != KILN_OK);
    CHECK(ck == NULL);
}

/* ---- LLMC ---------------------------------------------------------------- */

static void test_config_json(void)
{
    kiln_llm_config c, back;
    kiln_llm_config_init(&c);
    strcpy(c.architecture, "qwen2");
    c.vocab_size = 1000, c.hidden_size = 64, c.n_layers = 3, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
    c.intermediate_size = 100, c.rms_norm_eps = 1e-6, c.qkv_bias = 1, c.tied_embeddings = 1;
    c.rope.theta = 1e6, c.rope.scaling = KILN_LLM_ROPE_LLAMA3, c.rope.factor = 8, c.rope.rotary_dim = 16;
    c.dtype = KILN_DTYPE_BF16, c.max_seq_len = 512, c.max_batch = 4, c.max_tokens = 256, c.block_size = 16;
    c.bos_id = 7, c.n_eos = 2, c.eos_ids[0] = 8, c.eos_ids[1] = 9, c.add_bos = 1;
    c.chat_template = KILN_LLM_CHAT_CHATML;
    strcpy(c.source, "hf:/x");
    c.generation.has_top_k = 1, c.generation.top_k = 40;
    char *j = NULL;
    size_t n = 0;
    CHECK_OK(kiln_llm_config_to_json(&c, &j, &n));
    CHECK_OK(kiln_llm_config_from_json(j, n, &back));
    CHECK(memcmp(&c, &back, sizeof c) == 0);
    CHECK(j && strstr(j, "\"chat_template\":\"chatml\"") && strstr(j, "\"eos_ids\":[8,9]"));
    free(j);
    const char *bad = "{\"architecture\":\"llama\"}";
    CHECK_FAILS(kiln_llm_config_from_json(bad, strlen(bad), &back), KILN_ERROR_FORMAT, "missing field \"vocab_size\"");
    CHECK_FAILS(kiln_llm_config_from_json("[", 1, &back), KILN_ERROR_FORMAT, "LLMC: invalid JSON");
    CHECK(kiln_llm_chat_template_detect("{{ '<|im_start|>' }}") == KILN_LLM_CHAT_CHATML);
    CHECK(kiln_llm_chat_template_detect("<|start_header_id|>") == KILN_LLM_CHAT_LLAMA3);
    CHECK(kiln_llm_chat_template_detect("[INST] x [/INST]") == KILN_LLM_CHAT_LLAMA2);
    CHECK(kiln_llm_chat_template_detect("{{ messages }}") == KILN_LLM_CHAT_NONE);
    CHECK(kiln_llm_chat_template_detect(NULL) == KILN_LLM_CHAT_NONE);
}

static const test_case_ tests[] = {
    TEST(test_hf_reads_families),   TEST(test_hf_config_forms), TEST(test_hf_config_errors),
    TEST(test_hf_directory_errors), TEST(test_gguf_reads),      TEST(test_gguf_errors),
    TEST(test_llama2c_header),      TEST(test_llama2c_import),  TEST(test_config_json)};

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_llm_import_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int before = test_failures_;
        tests[i].fn();
        printf("%s %s\n", test_failures_ == before ? "ok  " : "FAIL", tests[i].name);
    }
    printf("%d checks, %d failed\n", test_checks_, test_failures_);
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_failures_ ? 1 : 0;
}
