/* KV-cache block allocator and prefix cache (kv_cache.h). */
#include "llm/kv_cache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/error.h"

kiln_status kiln_kv_pool_init(kiln_kv_pool *pool, int32_t n_blocks, int32_t block_size)
{
    if (n_blocks < 1 || block_size < 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "KV cache of %d blocks of %d tokens: both must be >= 1",
                         (int)n_blocks, (int)block_size);
    memset(pool, 0, sizeof *pool);
    int32_t *list = malloc(sizeof *list * (size_t)n_blocks);
    int32_t *ref = calloc((size_t)n_blocks, sizeof *ref);
    if (!list || !ref) {
        free(list);
        free(ref);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a KV cache of %d blocks", (int)n_blocks);
    }
    /* Highest index at the bottom, so blocks are handed out in order 0, 1, ... */
    for (int32_t i = 0; i < n_blocks; i++)
        list[i] = n_blocks - 1 - i;
    pool->free_list = list;
    pool->ref = ref;
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    pool->n_free = n_blocks;
    pool->lru_head = pool->lru_tail = -1;
    return KILN_OK;
}

static void free_tables(kiln_kv_pool *pool)
{
    free(pool->hash);
    free(pool->parent);
    free(pool->tokens);
    free(pool->in_table);
    free(pool->chain);
    free(pool->buckets);
    free(pool->lru_prev);
    free(pool->lru_next);
    pool->hash = NULL;
    pool->parent = pool->tokens = pool->chain = pool->buckets = pool->lru_prev = pool->lru_next = NULL;
    pool->in_table = NULL;
}

void kiln_kv_pool_free(kiln_kv_pool *pool)
{
    if (!pool)
        return;
    free(pool->free_list);
    free(pool->ref);
    free_tables(pool);
    memset(pool, 0, sizeof *pool);
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

/* ---- the hash table and the evictable list ---------------------------------------------- */

static uint32_t bucket_of(const kiln_kv_pool *pool, uint64_t hash)
{
    return (uint32_t)(hash ^ hash >> 32) & pool->bucket_mask;
}

static void table_remove(kiln_kv_pool *pool, int32_t b)
{
    int32_t *at = &pool->buckets[bucket_of(pool, pool->hash[b])];
    while (*at != b)
        at = &pool->chain[*at];
    *at = pool->chain[b];
    pool->in_table[b] = 0;
}

static void lru_unlink(kiln_kv_pool *pool, int32_t b)
{
    int32_t p = pool->lru_prev[b], n = pool->lru_next[b];
    if (p >= 0)
        pool->lru_next[p] = n;
    else
        pool->lru_head = n;
    if (n >= 0)
        pool->lru_prev[n] = p;
    else
        pool->lru_tail = p;
    pool->n_lru--;
}

static void lru_push(kiln_kv_pool *pool, int32_t b)
{
    pool->lru_prev[b] = pool->lru_tail;
    pool->lru_next[b] = -1;
    if (pool->lru_tail >= 0)
        pool->lru_next[pool->lru_tail] = b;
    else
        pool->lru_head = b;
    pool->lru_tail = b;
    pool->n_lru++;
}

kiln_status kiln_kv_pool_set_caching(kiln_kv_pool *pool, int32_t on)
{
    if (!on) {
        while (pool->lru_head >= 0) {
            int32_t b = pool->lru_head;
            lru_unlink(pool, b);
            table_remove(pool, b);
            pool->free_list[pool->n_free++] = b;
        }
        /* Blocks still held stay registered only while caching is on. */
        for (int32_t b = 0; pool->in_table && b < pool->n_blocks; b++)
            if (pool->in_table[b])
                table_remove(pool, b);
        pool->caching = 0;
        return KILN_OK;
    }
    if (!pool->hash) {
        size_t n = (size_t)pool->n_blocks, buckets = 1;
        while (buckets < n)
            buckets <<= 1;
        pool->hash = calloc(n, sizeof *pool->hash);
        pool->parent = malloc(n * sizeof *pool->parent);
        pool->tokens = malloc(n * (size_t)pool->block_size * sizeof *pool->tokens);
        pool->in_table = calloc(n, 1);
        pool->chain = malloc(n * sizeof *pool->chain);
        pool->buckets = malloc(buckets * sizeof *pool->buckets);
        pool->lru_prev = malloc(n * sizeof *pool->lru_prev);
        pool->lru_next = malloc(n * sizeof *pool->lru_next);
        if (!pool->parent || !pool->tokens || !pool->in_table || !pool->chain || !pool->buckets || !pool->lru_prev ||
            !pool->lru_next || !pool->hash) {
            free_tables(pool);
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for the prefix cache of %d KV blocks",
                             (int)pool->n_blocks);
        }
        for (size_t i = 0; i < buckets; i++)
            pool->buckets[i] = -1;
        pool->bucket_mask = (uint32_t)(buckets - 1);
    }
    pool->caching = 1;
    return KILN_OK;
}

/* ---- growing and releasing ---------------------------------------------------------------- */

static int32_t take_block(kiln_kv_pool *pool)
{
    int32_t b;
    if (pool->n_free > 0) {
        b = pool->free_list[--pool->n_free];
    } else {
        b = pool->lru_head;
        lru_unlink(pool, b);
        table_remove(pool, b);
    }
    pool->ref[b] = 1;
    return b;
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
    if (need - seq->n_blocks > kiln_kv_pool_available(pool))
        return kiln_fail(
            KILN_ERROR_LIMIT, "KV cache full: a sequence of %lld tokens needs %d more blocks, %d of %d are free",
            (long long)n_tokens, (int)(need - seq->n_blocks), (int)kiln_kv_pool_available(pool), (int)pool->n_blocks);
    while (seq->n_blocks < need)
        seq->blocks[seq->n_blocks++] = take_block(pool);
    return KILN_OK;
}

void kiln_kv_seq_release(kiln_kv_pool *pool, kiln_kv_seq *seq)
{
    /* Last block first, so a chain's tail is evicted before its head. */
    while (seq->n_blocks > 0) {
        int32_t b = seq->blocks[--seq->n_blocks];
        if (--pool->ref[b] > 0)
            continue;
        if (pool->caching && pool->in_table[b])
            lru_push(pool, b);
        else
            pool->free_list[pool->n_free++] = b;
    }
}

/* ---- prefix cache ------------------------------------------------------------------------- */

uint64_t kiln_kv_block_hash(uint64_t parent, const int32_t *ids, int32_t n)
{
    return XXH64(ids, sizeof *ids * (size_t)n, parent);
}

/* The registered block with this hash, parent and ids, or -1. */
static int32_t table_find(const kiln_kv_pool *pool, uint64_t hash, int32_t parent, const int32_t *ids)
{
    size_t bytes = sizeof *ids * (size_t)pool->block_size;
    for (int32_t b = pool->buckets[bucket_of(pool, hash)]; b >= 0; b = pool->chain[b])
        if (pool->hash[b] == hash && pool->parent[b] == parent &&
            memcmp(pool->tokens + (size_t)b * (size_t)pool->block_size, ids, bytes) == 0)
            return b;
    return -1;
}

int32_t kiln_kv_seq_match(kiln_kv_pool *pool, kiln_kv_seq *seq, const int32_t *ids, int32_t max_blocks,
                          uint64_t *hashes)
{
    if (!pool->caching || seq->n_blocks != 0)
        return 0;
    uint64_t h = 0;
    int32_t parent = -1;
    while (seq->n_blocks < max_blocks && seq->n_blocks < seq->cap) {
        const int32_t *blk = ids + (size_t)seq->n_blocks * (size_t)pool->block_size;
        h = kiln_kv_block_hash(h, blk, pool->block_size);
        int32_t b = table_find(pool, h, parent, blk);
        if (b < 0)
            break;
        if (pool->ref[b]++ == 0)
            lru_unlink(pool, b);
        hashes[seq->n_blocks] = h;
        seq->blocks[seq->n_blocks++] = b;
        parent = b;
    }
    return seq->n_blocks;
}

void kiln_kv_seq_register(kiln_kv_pool *pool, const kiln_kv_seq *seq, int32_t j, uint64_t hash, const int32_t *ids)
{
    int32_t b = seq->blocks[j], parent = j > 0 ? seq->blocks[j - 1] : -1;
    if (!pool->caching || pool->in_table[b] || table_find(pool, hash, parent, ids) >= 0)
        return;
    pool->hash[b] = hash;
    pool->parent[b] = parent;
    memcpy(pool->tokens + (size_t)b * (size_t)pool->block_size, ids, sizeof *ids * (size_t)pool->block_size);
    uint32_t k = bucket_of(pool, hash);
    pool->chain[b] = pool->buckets[k];
    pool->buckets[k] = b;
    pool->in_table[b] = 1;
}
