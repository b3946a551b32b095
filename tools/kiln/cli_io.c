/* What every `kiln` command shares about files and standard output: one
 * file-type check for the paths a command writes, and the final flush of
 * stdout, whose errors (a full disk, `> /dev/full`) fail the command. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/file.h"

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
    if (kiln_file_check_output(path) != KILN_OK)
        return cli_kiln_error();
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
