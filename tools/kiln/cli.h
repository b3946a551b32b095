/* Shared pieces of the `kiln` subcommands: exit codes, error output, and
 * option parsing. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <jansson.h>
#include <kiln/kiln.h>

enum { CLI_OK = 0, CLI_FAILURE = 1, CLI_USAGE = 2 };

/* Prints "kiln: error: <message>" as one line on stderr; returns CLI_FAILURE. */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Same for a usage error, pointing at `kiln <cmd> --help`; returns CLI_USAGE. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* cli_error with kiln_last_error(). */
int cli_kiln_error(void);

/* Walks argv[1..argc) of a subcommand. Each call returns the next option
 * name ("--plugins") with *value set when it takes one (from "--x=v" or
 * the next argument), or NULL at the end. Positionals are collected in
 * order. On a usage error it prints it and sets *status to CLI_USAGE. */
typedef struct cli_args {
    const char *cmd;
    int argc, i;
    char **argv;
    const char **positional;
    int n_positional;
    int status;
} cli_args;

void cli_args_init(cli_args *a, const char *cmd, int argc, char **argv);
void cli_args_free(cli_args *a);
/* `valued`: names of the options that take a value, NULL-terminated. */
const char *cli_args_next(cli_args *a, const char *const *valued, const char **value);

/* Parses an integer option in lo..hi. On failure prints a usage error that
 * names the limits when the number is out of range (or past 64 bits), and
 * returns CLI_USAGE. */
int cli_parse_range(const char *cmd, const char *opt, const char *text, long long lo, long long hi, long long *out);

/* cli_parse_range for counts: 0..CLI_COUNT_MAX. */
#define CLI_COUNT_MAX 100000000LL
int cli_parse_count(const char *cmd, const char *opt, const char *text, long *out);

/* ---- cli_io.c: files and standard output --------------------------------------- */

/* Once, at start: writes past the file-size limit fail instead of killing
 * the process. */
void cli_io_init(void);

/* The path -o names is not empty (a usage error otherwise). Whether it can
 * be written (new or a regular file, never a FIFO, device or directory) is
 * checked by the library before it builds. */
int cli_check_output(const char *cmd, const char *path);

/* Flushes and closes stdout; a write error there turns `status` into a
 * failure with one line naming the reason. main's last call. */
int cli_finish_stdout(int status);

/* Creates a registry and loads each library into it. Returns CLI_OK or
 * prints the error and returns CLI_FAILURE. */
int cli_registry(const char *const *libs, int n_libs, kiln_registry **out);

/* A string or integer member of a JSON object ("" or 0 when absent), for
 * printing the library's JSON descriptions. */
const char *cli_json_str(json_t *o, const char *key);
long long cli_json_int(json_t *o, const char *key);

int cli_build(int argc, char **argv);
int cli_exec(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_plugins(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_chat(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_bench(int argc, char **argv);
/* kiln bench --throughput (bench_throughput.c). */
int cli_bench_throughput(int argc, char **argv);
/* bench.c's clock and statistics, shared by both bench modes: a monotonic
 * clock in ms, and the q-quantile (0..1) of v[0..n), sorting v, nearest
 * rank (0 for n = 0). */
double bench_now_ms(void);
double bench_quantile(double *v, size_t n, double q);
int cli_perplexity(int argc, char **argv);
int cli_serve(int argc, char **argv);

#endif
