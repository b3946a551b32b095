/* A minimal unit-test harness: CHECK macros and a main that runs TESTs. */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures_;
static int test_checks_;

#define CHECK(cond) \
    do { \
        test_checks_++; \
        if (!(cond)) { \
            test_failures_++; \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        } \
    } while (0)

/* Checks a kiln call returns KILN_OK, printing the last error otherwise. */
#define CHECK_OK(expr) \
    do { \
        test_checks_++; \
        kiln_status check_s_ = (expr); \
        if (check_s_ != KILN_OK) { \
            test_failures_++; \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr, kiln_status_name(check_s_), \
                    kiln_last_error()); \
        } \
    } while (0)

/* Checks a call fails with `status` and its message contains `needle`. */
#define CHECK_FAILS(expr, status, needle) \
    do { \
        test_checks_++; \
        kiln_status check_s_ = (expr); \
        if (check_s_ != (status) || !strstr(kiln_last_error(), (needle))) { \
            test_failures_++; \
            fprintf(stderr, "%s:%d: %s: expected %s containing \"%s\", got %s: \"%s\"\n", __FILE__, __LINE__, #expr, \
                    kiln_status_name(status), (needle), kiln_status_name(check_s_), kiln_last_error()); \
        } \
    } while (0)

#define CHECK_NEAR(a, b, tol) \
    do { \
        test_checks_++; \
        double check_a_ = (a), check_b_ = (b); \
        if (!(fabs(check_a_ - check_b_) <= (tol))) { \
            test_failures_++; \
            fprintf(stderr, "%s:%d: %s = %.9g, expected %.9g (tol %g)\n", __FILE__, __LINE__, #a, check_a_, check_b_, \
                    (double)(tol)); \
        } \
    } while (0)

typedef void (*test_fn_)(void);
typedef struct {
    const char *name;
    test_fn_ fn;
} test_case_;

/* In the test file: static const test_case_ tests[] = {TEST(a), TEST(b)};
 * then TEST_MAIN(tests). */
#define TEST(fn) \
    { \
#fn, fn \
    }
/* Runs the cases, one "ok"/"FAIL" line each, then the count of checks
 * (also from the GPU tests' own main, which set up a device first).
 * KILN_TEST_ONLY=NAME runs only the cases whose name contains NAME (a
 * quick rerun of one case under other settings). */
static inline void test_run_cases(const test_case_ *cases, size_t n)
{
    const char *only = getenv("KILN_TEST_ONLY");
    for (size_t i = 0; i < n; i++) {
        if (only && *only && !strstr(cases[i].name, only))
            continue;
        int before = test_failures_;
        cases[i].fn();
        printf("%s %s\n", test_failures_ == before ? "ok  " : "FAIL", cases[i].name);
    }
    printf("%d checks, %d failed\n", test_checks_, test_failures_);
}

#define TEST_MAIN(cases) \
    int main(void) \
    { \
        test_run_cases(cases, sizeof(cases) / sizeof(cases[0])); \
        return test_failures_ ? 1 : 0; \
    }

#endif
