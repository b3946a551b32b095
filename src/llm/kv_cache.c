/* KV-cache block allocator (kv_cache.h). */
#include "llm/kv_cache.h"

#include <stdlib.h>

#include "core/error.h"

kiln_status kiln_kv_pool_init(kiln_kv_pool *pool, int32_t n_blocks, int32_t block_size)
{
    if (n_blocks < 1 || block_size < 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "KV cache of %d blocks of %d tokens: both must be >= 1",
                         (int)n_blocks, (int)block_size);
    int32_t *list = malloc(sizeof *list * (size_t)n_blocks);
    if (!list)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a KV cache of %d blocks", (int)n_blocks);
    /* Highest index at the bottom, so blocks are handed out in order 0, 1, ... */
    for (int32_t i = 0; i < n_blocks; i++)
        list[i] = n_blocks - 1 - i;
    pool->free_list = list;
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    pool->n_free = n_blocks;
    return KILN_OK;
}

void kiln_kv_pool_free(kiln_kv_pool *pool)
{
    if (!pool)
        return;
    free(pool->free_list);
    pool->free_list = NULL;
    pool->n_free = pool->n_blocks = 0;
}

int32_t kiln_kv_blocks_for(const kiln_kv_pool *pool, int64_t n_tokens)
{
    if (n_tokens <= 0)
        return 0;
    int64_t n = (n_tokens - 1) / pool->block_size + 1;
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

void kiln_kv_seq_init(kiln_kv_seq *seq, int32_t *storage, int32_t cap)
{
    seq->blocks = storage;
    seq->n_blocks = 0;
    seq->cap = cap;
}

kiln_status kiln_kv_seq_grow(kiln_kv_pool *pool, kiln_kv_seq *seq, int64_t n_tokens)
{
    int32_t need = kiln_kv_blocks_for(pool, n_tokens);
    if (need <= seq->n_blocks)
        return KILN_OK;
    if (need > seq->cap)
        return kiln_fail(KILN_ERROR_LIMIT,
                         "a sequence of %lld tokens needs %d KV blocks of %d tokens; a sequence may hold %d",
                         (long long)n_tokens, (int)need, (int)pool->block_size, (int)seq->cap);
    if (need - seq->n_blocks > pool->n_free)
        return kiln_fail(KILN_ERROR_LIMIT,
                         "KV cache full: a sequence of %lld tokens needs %d more blocks, %d of %d are free",
                         (long long)n_tokens, (int)(need - seq->n_blocks), (int)pool->n_free, (int)pool->n_blocks);
    while (seq->n_blocks < need)
        seq->blocks[seq->n_blocks++] = pool->free_list[--pool->n_free];
    return KILN_OK;
}

void kiln_kv_seq_release(kiln_kv_pool *pool, kiln_kv_seq *seq)
{
    while (seq->n_blocks > 0)
        pool->free_list[pool->n_free++] = seq->blocks[--seq->n_blocks];
}
