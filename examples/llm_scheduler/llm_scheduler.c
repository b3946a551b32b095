/* llm_scheduler: requests that come and go, from a program's point of
 * view. It builds an engine from a checkpoint, starts the request-level
 * scheduler on it (its steps run on a thread of the library's), submits
 * one greedy request per prompt, each with its own callbacks, plus one
 * more that it cancels at once, and waits until every request has ended.
 * Only <kiln/kiln.h>, libc and libkiln.
 *
 *     llm_scheduler CHECKPOINT OUT.engine MAX_TOKENS PROMPT...
 *
 * Each request's text goes to stdout when it ends; on stderr, one line per
 * request gives its prompt and generated ids, the logprob of its first
 * token and why it ended, so tests can compare them with a reference. */
#include <kiln/kiln.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What one request's callbacks see. */
typedef struct job {
    int index;
    int tokens;
    float first_logprob;
    kiln_llm_result *result;
    struct board *board;
} job;

/* The requests' common end: on_finish runs on the scheduler's thread. */
typedef struct board {
    pthread_mutex_t mu;
    pthread_cond_t ended;
    int n_ended;
} board;

static int on_token(void *user, const kiln_llm_token *token)
{
    job *j = user;
    if (token->id >= 0 && j->tokens++ == 0)
        j->first_logprob = token->logprob;
    return 0; /* nonzero would cancel the request */
}

static void on_finish(void *user, kiln_llm_result *result)
{
    job *j = user;
    pthread_mutex_lock(&j->board->mu);
    j->result = result; /* ours now: freed below with kiln_llm_result_free */
    j->board->n_ended++;
    pthread_cond_signal(&j->board->ended);
    pthread_mutex_unlock(&j->board->mu);
}

static int fail(const char *what)
{
    fprintf(stderr, "llm_scheduler: %s: %s\n", what, kiln_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s CHECKPOINT OUT.engine MAX_TOKENS PROMPT...\n", argv[0]);
        return 2;
    }
    const char *checkpoint = argv[1], *engine = argv[2];
    int32_t max_tokens = (int32_t)atoi(argv[3]);
    int n = argc - 4;

    kiln_llm_build_options build;
    kiln_llm_build_options_init(&build);
    build.max_batch = 4;
    build.max_seq_len = 128;
    if (kiln_llm_build(checkpoint, &build, engine) != KILN_OK)
        return fail("build");
    kiln_registry *registry = NULL;
    kiln_llm *llm = NULL;
    if (kiln_registry_create(&registry) != KILN_OK)
        return fail("registry");
    if (kiln_llm_open(registry, engine, NULL, &llm) != KILN_OK) {
        kiln_registry_destroy(registry);
        return fail("open");
    }

    /* The scheduler owns the llm until it stops; its steps run on its own
     * thread (options.thread = 1, the default). */
    kiln_llm_scheduler *scheduler = NULL;
    if (kiln_llm_scheduler_start(llm, NULL, &scheduler) != KILN_OK) {
        kiln_llm_close(llm);
        kiln_registry_destroy(registry);
        return fail("start");
    }
    board b;
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.ended, NULL);
    b.n_ended = 0;
    job *jobs = calloc((size_t)n + 1, sizeof *jobs);
    kiln_llm_sampling greedy;
    kiln_llm_sampling_init(&greedy);
    greedy.temperature = 0;
    int accepted = 0, rc = jobs ? 0 : 1;
    for (int i = 0; rc == 0 && i <= n; i++) {
        /* Request n repeats the first prompt and is cancelled at once. */
        const char *prompt = argv[4 + (i < n ? i : 0)];
        kiln_llm_request request;
        kiln_llm_request_init(&request);
        request.prompt = prompt;
        request.prompt_len = strlen(prompt);
        request.max_tokens = max_tokens;
        request.sampling = &greedy;
        request.logprobs = 0; /* the sampled token's logprob, no alternatives */
        kiln_llm_callbacks callbacks;
        kiln_llm_callbacks_init(&callbacks);
        callbacks.on_token = on_token;
        callbacks.on_finish = on_finish;
        callbacks.user = &jobs[i];
        jobs[i].index = i;
        jobs[i].board = &b;
        uint64_t id = 0;
        /* Everything the request points at is copied: it may go now. */
        if (kiln_llm_submit(scheduler, &request, &callbacks, &id) != KILN_OK) {
            rc = fail("submit");
            break;
        }
        accepted++;
        if (i == n)
            kiln_llm_request_cancel(scheduler, id);
    }
    pthread_mutex_lock(&b.mu);
    while (b.n_ended < accepted)
        pthread_cond_wait(&b.ended, &b.mu);
    pthread_mutex_unlock(&b.mu);

    kiln_llm_scheduler_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    kiln_llm_scheduler_stats_get(scheduler, &stats);
    kiln_llm_scheduler_stop(scheduler, 0);
    for (int i = 0; i < accepted; i++) {
        const kiln_llm_result *r = jobs[i].result;
        if (!r)
            continue;
        printf("[%d] %s\n", i, r->text ? r->text : "");
        fprintf(stderr, "request %d: prompt_ids:", i);
        for (size_t k = 0; k < r->n_prompt_ids; k++)
            fprintf(stderr, " %d", (int)r->prompt_ids[k]);
        fprintf(stderr, "; generated_ids:");
        for (size_t k = 0; k < r->n_ids; k++)
            fprintf(stderr, " %d", (int)r->ids[k]);
        fprintf(stderr, "; first_logprob: %.6f; finish: %s\n", r->n_ids ? (double)jobs[i].first_logprob : 0.0,
                kiln_llm_finish_name(r->finish));
        kiln_llm_result_free(jobs[i].result);
    }
    fprintf(stderr, "steps: %llu; finished: %llu; cancelled: %llu\n", (unsigned long long)stats.steps,
            (unsigned long long)stats.finished, (unsigned long long)stats.cancelled);
    free(jobs);
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.ended);
    kiln_llm_close(llm);
    kiln_registry_destroy(registry);
    return rc;
}
