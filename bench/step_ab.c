/* step_ab: two variants of a CPU (or GPU) decode step compared inside one
 * process, their steps alternated in blocks, so that a host whose speed
 * swings by a factor of two within a minute (bench/README-llm.md) still
 * shows differences of a few percent. Each block's mean step is divided by
 * the neighbouring block's of the other variant; the median of those ratios
 * (and its quartiles) is the result.
 *
 *   step_ab ENGINE --env NAME=A,B [--instances] [--prompt-len N] [--gen-len M]
 *           [--requests R] [--block K] [--json]
 *
 * Without --instances one engine runs and the environment variable NAME is
 * set to A or B before every step: for settings the code reads at run time.
 * With --instances the engine is opened twice, under NAME=A and NAME=B
 * (settings read when an engine opens), and their steps alternate. Each
 * request is greedy, ignores EOS and has a fixed pseudo-random prompt; the
 * prefill steps are not counted. Uses the public API (<kiln/kiln.h>) and
 * bench_util.h's clock. */
#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

static void on_finish(void *user, kiln_llm_result *result)
{
    (void)user;
    kiln_llm_result_free(result);
}

static int usage(FILE *f)
{
    fprintf(f, "usage: step_ab ENGINE --env NAME=A,B [--instances] [--prompt-len N] [--gen-len M]\n"
               "               [--requests R] [--block K] [--json]\n"
               "Alternates decode steps of two variants in blocks of K steps (default 4) and prints the\n"
               "median ratio of a B block's mean step to the neighbouring A block's (below 1: B is faster).\n"
               "  --env NAME=A,B  the variable and its two values\n"
               "  --instances     open the engine twice, under NAME=A and NAME=B, for settings read at\n"
               "                  open; without it NAME is set before each step\n"
               "  --prompt-len N  prompt tokens of each request (default 512)\n"
               "  --gen-len M     tokens each request generates (default 128)\n"
               "  --requests R    requests, one after the other (default 8)\n"
               "  --block K       steps of one variant before the other's (default 4)\n"
               "  --json          one JSON object instead of the line\n");
    return f == stderr ? 2 : 0;
}

static int fail(const char *what)
{
    fprintf(stderr, "step_ab: error: %s: %s\n", what, kiln_last_error());
    return 1;
}

static int positive(const char *s, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 1 || v > 1000000)
        return 0;
    *out = (int)v;
    return 1;
}

int main(int argc, char **argv)
{
    const char *engine = NULL, *env = NULL;
    int instances = 0, json = 0, prompt_len = 512, gen_len = 128, requests = 8, block = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int ok = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return usage(stdout);
        else if (!strcmp(a, "--instances"))
            instances = 1;
        else if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--env") && i + 1 < argc)
            env = argv[++i];
        else if (!strcmp(a, "--prompt-len") && i + 1 < argc)
            ok = positive(argv[++i], &prompt_len);
        else if (!strcmp(a, "--gen-len") && i + 1 < argc)
            ok = positive(argv[++i], &gen_len);
        else if (!strcmp(a, "--requests") && i + 1 < argc)
            ok = positive(argv[++i], &requests);
        else if (!strcmp(a, "--block") && i + 1 < argc)
            ok = positive(argv[++i], &block);
        else if (a[0] != '-' && !engine)
            engine = a;
        else {
            fprintf(stderr, "step_ab: error: unknown or incomplete option \"%s\"\n", a);
            return usage(stderr);
        }
        if (!ok) {
            fprintf(stderr, "step_ab: error: %s takes a whole number from 1 to 1000000, got \"%s\"\n", a, argv[i]);
            return 2;
        }
    }
    const char *eq = env ? strchr(env, '=') : NULL, *comma = eq ? strchr(eq, ',') : NULL;
    if (!engine || !eq || !comma || eq == env) {
        fprintf(stderr, "step_ab: error: %s\n", engine ? "--env NAME=A,B is required" : "no ENGINE given");
        return usage(stderr);
    }
    char name[128], value[2][128];
    snprintf(name, sizeof name, "%.*s", (int)(eq - env), env);
    snprintf(value[0], sizeof value[0], "%.*s", (int)(comma - eq - 1), eq + 1);
    snprintf(value[1], sizeof value[1], "%s", comma + 1);

    kiln_registry *registry = NULL;
    kiln_llm *llm[2] = {NULL, NULL};
    kiln_llm_scheduler *sched[2] = {NULL, NULL};
    int32_t vocab = 0;
    if (kiln_registry_create(&registry) != KILN_OK)
        return fail("registry");
    kiln_llm_scheduler_options so;
    kiln_llm_scheduler_options_init(&so);
    so.thread = 0; /* this program steps */
    for (int v = 0; v < 1 + instances; v++) {
        setenv(name, value[v], 1);
        if (kiln_llm_open(registry, engine, NULL, &llm[v]) != KILN_OK)
            return fail(engine);
        if (v == 0) /* read before the scheduler owns the llm */
            vocab = kiln_llm_info_get(llm[0])->vocab_size;
        if (kiln_llm_scheduler_start(llm[v], &so, &sched[v]) != KILN_OK)
            return fail("scheduler");
    }

    int32_t *ids = malloc(sizeof *ids * (size_t)prompt_len);
    size_t cap = (size_t)requests * (size_t)gen_len + 16;
    double *steps[2] = {malloc(sizeof(double) * cap), malloc(sizeof(double) * cap)};
    double *ratios = malloc(sizeof(double) * cap);
    if (!ids || !steps[0] || !steps[1] || !ratios) {
        fprintf(stderr, "step_ab: error: out of memory\n");
        return 1;
    }
    /* ids past the first few (special tokens in most vocabularies) */
    const int32_t skip = vocab > 200 ? 100 : 0;
    uint32_t x = 1234;
    for (int i = 0; i < prompt_len; i++) {
        x = x * 1103515245u + 12345u;
        ids[i] = skip + (int32_t)((x >> 8) % (uint32_t)(vocab - skip));
    }
    kiln_llm_sampling greedy;
    kiln_llm_sampling_init(&greedy);
    greedy.temperature = 0;
    size_t n[2] = {0, 0}, n_ratios = 0;
    for (int r = 0; r < requests; r++) {
        int busy[2] = {1, 1}, step[2] = {0, 0};
        for (int v = 0; v < 1 + instances; v++) {
            kiln_llm_request q;
            kiln_llm_request_init(&q);
            q.prompt_ids = ids;
            q.n_prompt_ids = (size_t)prompt_len;
            q.max_tokens = gen_len;
            q.ignore_eos = 1;
            q.sampling = &greedy;
            kiln_llm_callbacks cb;
            kiln_llm_callbacks_init(&cb);
            cb.on_finish = on_finish;
            if (kiln_llm_submit(sched[v], &q, &cb, NULL) != KILN_OK)
                return fail("submit");
        }
        if (!instances)
            busy[1] = 0;
        /* blocks of A then B (B then A on odd requests), one block ratio each pair */
        while (busy[0] || (instances && busy[1])) {
            double sum[2] = {0, 0};
            int count[2] = {0, 0};
            for (int o = 0; o < 2; o++) {
                int v = (o + r) % 2, s = instances ? v : 0;
                for (int i = 0; i < block && busy[s]; i++) {
                    if (!instances)
                        setenv(name, value[v], 1);
                    double t0 = now_s();
                    if (kiln_llm_scheduler_step(sched[s], &busy[s]) != KILN_OK)
                        return fail("step");
                    double d = now_s() - t0;
                    /* the prefill (a step of the prompt) and the first decode are not counted */
                    if (step[s]++ >= 2 && n[v] < cap) {
                        sum[v] += d;
                        count[v]++;
                        steps[v][n[v]++] = d;
                    }
                }
            }
            if (count[0] && count[1] && n_ratios < cap)
                ratios[n_ratios++] = (sum[1] / count[1]) / (sum[0] / count[0]);
        }
    }
    if (!n[0] || !n[1] || !n_ratios) {
        fprintf(stderr, "step_ab: error: no decode steps were timed (raise --gen-len or lower --block)\n");
        return 1;
    }
    qsort(steps[0], n[0], sizeof(double), cmp_double);
    qsort(steps[1], n[1], sizeof(double), cmp_double);
    qsort(ratios, n_ratios, sizeof(double), cmp_double);
    double med[2] = {steps[0][n[0] / 2] * 1e3, steps[1][n[1] / 2] * 1e3};
    double q1 = ratios[n_ratios / 4], q2 = ratios[n_ratios / 2], q3 = ratios[3 * n_ratios / 4];
    if (json)
        printf("{\"variable\": \"%s\", \"a\": \"%s\", \"b\": \"%s\", \"instances\": %d, \"step_ms_a\": %.4f, "
               "\"step_ms_b\": %.4f, \"steps\": %zu, \"block_ratio_median\": %.4f, \"block_ratio_p25\": %.4f, "
               "\"block_ratio_p75\": %.4f, \"blocks\": %zu}\n",
               name, value[0], value[1], instances, med[0], med[1], n[0] + n[1], q2, q1, q3, n_ratios);
    else
        printf("%s=%s: median step %.3f ms; %s=%s: %.3f ms; B/A block ratio %.4f (p25 %.4f, p75 %.4f, %zu blocks)\n",
               name, value[0], med[0], name, value[1], med[1], q2, q1, q3, n_ratios);
    for (int v = 0; v < 1 + instances; v++) {
        kiln_llm_scheduler_stop(sched[v], 0);
        kiln_llm_close(llm[v]);
    }
    kiln_registry_destroy(registry);
    free(ids);
    free(steps[0]);
    free(steps[1]);
    free(ratios);
    return 0;
}
