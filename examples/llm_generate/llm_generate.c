/* llm_generate: the LLM API from a program's point of view. It builds an
 * engine from a checkpoint, opens it and generates text, streaming it to
 * stdout, using only <kiln/kiln.h> and linking only libkiln.
 *
 *     llm_generate CHECKPOINT OUT.engine PROMPT [MAX_TOKENS]
 *
 * CHECKPOINT is a Hugging Face model folder, a .gguf or (not here: it needs
 * a tokenizer.bin) a llama2.c .bin. Decoding is greedy. After the text, one
 * line on stderr gives the prompt and generated token ids and why
 * generation ended, so tests can compare them with a reference. */
#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void progress(void *user, double fraction, const char *what)
{
    (void)user;
    (void)what;
    /* The build reports often; one mark per quarter is enough here. */
    static int last = -1;
    int quarter = (int)(fraction * 4);
    if (quarter != last)
        fprintf(stderr, "building: %d%%\n", quarter * 25);
    last = quarter;
}

static int print_token(void *user, int32_t request, int32_t token, const char *text, size_t len)
{
    (void)user;
    (void)request;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static int fail(const char *what)
{
    fprintf(stderr, "llm_generate: %s: %s\n", what, kiln_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s CHECKPOINT OUT.engine PROMPT [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    const char *checkpoint = argv[1], *engine = argv[2], *prompt = argv[3];
    int32_t max_tokens = argc == 5 ? (int32_t)atoi(argv[4]) : 32;

    /* 1. Build: the checkpoint's weights, tokenizer and chat template go
     * into one engine file. */
    kiln_llm_build_options build;
    kiln_llm_build_options_init(&build);
    build.max_batch = 1;
    build.max_seq_len = 128;
    build.progress = progress;
    if (kiln_llm_build(checkpoint, &build, engine) != KILN_OK)
        return fail("build");

    /* 2. Open: the engine carries everything; the registry holds kiln's
     * built-in plugins (the LLM layers). */
    kiln_registry *registry = NULL;
    kiln_llm *llm = NULL;
    if (kiln_registry_create(&registry) != KILN_OK)
        return fail("registry");
    if (kiln_llm_open(registry, engine, NULL, &llm) != KILN_OK) {
        kiln_registry_destroy(registry);
        return fail("open");
    }
    const kiln_llm_info *info = kiln_llm_info_get(llm);
    fprintf(stderr, "engine: %s, %d layers, vocab %d, %d tokens per sequence\n", info->architecture,
            (int)info->n_layers, (int)info->vocab_size, (int)info->max_seq_len);

    /* 3. Generate: one greedy request, streamed. */
    kiln_llm_sampling greedy;
    kiln_llm_sampling_init(&greedy);
    greedy.temperature = 0;
    kiln_llm_request request;
    kiln_llm_request_init(&request);
    request.prompt = prompt;
    request.prompt_len = strlen(prompt);
    request.max_tokens = max_tokens;
    request.sampling = &greedy;
    const kiln_llm_request *requests[1] = {&request};
    kiln_llm_result *result = NULL;
    int rc = 0;
    if (kiln_llm_generate(llm, requests, 1, print_token, NULL, &result) != KILN_OK) {
        rc = fail("generate");
    } else {
        putchar('\n');
        fprintf(stderr, "prompt_ids:");
        for (size_t i = 0; i < result->n_prompt_ids; i++)
            fprintf(stderr, " %d", (int)result->prompt_ids[i]);
        fprintf(stderr, "\ngenerated_ids:");
        for (size_t i = 0; i < result->n_ids; i++)
            fprintf(stderr, " %d", (int)result->ids[i]);
        fprintf(stderr, "\nfinish: %s\n", kiln_llm_finish_name(result->finish));
        kiln_llm_result_free(result);
    }
    kiln_llm_close(llm);
    kiln_registry_destroy(registry);
    return rc;
}
