/* libFuzzer target: the llama2.c checkpoint importer (header checks against
 * the file size, then every weight read through the weight source). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "llm/model.h"

/* A three-token llama2.c tokenizer.bin, written once to a memory file. */
static char tok_path[64];

static void write_tokenizer(void)
{
    int fd = memfd_create("tokenizer.bin", 0);
    if (fd < 0)
        return;
    static const unsigned char tok[] = {8, 0, 0, 0,                                        /* max_token_length */
                                        0, 0, 0, 0, 5, 0, 0, 0, '<',  'u', 'n', 'k', '>',  /* score 0, "<unk>" */
                                        0, 0, 0, 0, 5, 0, 0, 0, '\n', '<', 's', '>', '\n', /* "\n<s>\n" */
                                        0, 0, 0, 0, 1, 0, 0, 0, 'a'};
    if (write(fd, tok, sizeof tok) == (ssize_t)sizeof tok)
        snprintf(tok_path, sizeof tok_path, "/proc/self/fd/%d", fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_llm_config cfg;
    int shared;
    size_t wbytes;
    if (kiln_llm_llama2c_parse_header(data, size, "fuzz.bin", &cfg, &shared, &wbytes) != KILN_OK)
        return 0;
    if (!tok_path[0])
        write_tokenizer();
    int fd = memfd_create("model.bin", 0);
    if (fd < 0)
        return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    kiln_llm_checkpoint *ck = NULL;
    if (write(fd, data, size) == (ssize_t)size && kiln_llm_import_llama2c(path, tok_path, &ck) == KILN_OK) {
        const char *names[] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                               "model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.down_proj.weight"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            kiln_dims d;
            if (ck->read_weight(ck->weight_user, names[i], &d, KILN_DTYPE_F16, NULL, 0) != KILN_OK)
                continue;
            size_t n = (size_t)d.d[0] * (size_t)(d.rank == 2 ? d.d[1] : 1);
            if (n > (1u << 22))
                continue;
            void *buf = malloc(n * 2 + 1);
            if (buf)
                ck->read_weight(ck->weight_user, names[i], &d, KILN_DTYPE_F16, buf, n * 2);
            free(buf);
        }
        kiln_llm_checkpoint_free(ck);
    }
    close(fd);
    return 0;
}
