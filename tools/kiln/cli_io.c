/* What every `kiln` command shares about files and standard output: the
 * -o path, and the final flush of stdout, whose errors (a full disk,
 * `> /dev/full`) fail the command. The file-type checks themselves are the
 * library's (every reader and writer runs them), so they hold for every
 * program that uses libkiln, not only this one. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

void cli_io_init(void)
{
    /* Past the file-size limit a write must fail with EFBIG and a message,
     * not kill the process with SIGXFSZ. */
    signal(SIGXFSZ, SIG_IGN);
}

int cli_check_output(const char *cmd, const char *path)
{
    if (!path || !*path)
        return cli_usage(cmd, "-o needs a file name (got an empty one)");
    return CLI_OK;
}

int cli_finish_stdout(int status)
{
    /* fflush, then fclose: both report a write that failed, and only a
     * close reports the last of it on some systems. */
    int failed = fflush(stdout) != 0 || ferror(stdout);
    int err = errno;
    if (fclose(stdout) != 0 && !failed) {
        failed = 1;
        err = errno;
    }
    if (!failed)
        return status;
    cli_error("writing standard output: %s", err ? strerror(err) : "write error");
    return status == CLI_OK ? CLI_FAILURE : status;
}
