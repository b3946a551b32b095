/* The KV-cache block allocator: sequences take blocks as they grow, give
 * them back when done, and a request the pool cannot serve is refused with
 * the numbers, leaving everything as it was. */
#include "test.h"

#include "llm/kv_cache.h"

static void test_blocks_for(void)
{
    kiln_kv_pool p;
    CHECK_OK(kiln_kv_pool_init(&p, 10, 16));
    CHECK(kiln_kv_blocks_for(&p, 0) == 0);
    CHECK(kiln_kv_blocks_for(&p, 1) == 1);
    CHECK(kiln_kv_blocks_for(&p, 16) == 1);
    CHECK(kiln_kv_blocks_for(&p, 17) == 2);
    CHECK(kiln_kv_blocks_for(&p, 160) == 10);
    kiln_kv_pool_free(&p);
    CHECK_FAILS(kiln_kv_pool_init(&p, 0, 16), KILN_ERROR_INVALID_ARGUMENT, "0 blocks");
    CHECK_FAILS(kiln_kv_pool_init(&p, 4, 0), KILN_ERROR_INVALID_ARGUMENT, "0 tokens");
}

static void test_grow_release(void)
{
    kiln_kv_pool p;
    CHECK_OK(kiln_kv_pool_init(&p, 6, 4));
    int32_t ta[8], tb[8];
    kiln_kv_seq a, b;
    kiln_kv_seq_init(&a, ta, 8);
    kiln_kv_seq_init(&b, tb, 8);
    CHECK_OK(kiln_kv_seq_grow(&p, &a, 5)); /* 2 blocks */
    CHECK(a.n_blocks == 2 && p.n_free == 4);
    CHECK_OK(kiln_kv_seq_grow(&p, &a, 8)); /* still 2 */
    CHECK(a.n_blocks == 2 && p.n_free == 4);
    CHECK_OK(kiln_kv_seq_grow(&p, &b, 12)); /* 3 blocks */
    CHECK(b.n_blocks == 3 && p.n_free == 1);
    /* Every block is owned once. */
    int used[6] = {0};
    for (int i = 0; i < a.n_blocks; i++)
        used[ta[i]]++;
    for (int i = 0; i < b.n_blocks; i++)
        used[tb[i]]++;
    int once = 1;
    for (int i = 0; i < 6; i++)
        once &= used[i] <= 1;
    CHECK(once);
    /* a needs 2 more blocks for 16 tokens; 1 is free: refused, a unchanged. */
    CHECK_FAILS(kiln_kv_seq_grow(&p, &a, 16), KILN_ERROR_LIMIT, "needs 2 more blocks, 1 of 6 are free");
    CHECK(a.n_blocks == 2 && p.n_free == 1);
    kiln_kv_seq_release(&p, &b);
    CHECK(b.n_blocks == 0 && p.n_free == 4);
    CHECK_OK(kiln_kv_seq_grow(&p, &a, 16));
    CHECK(a.n_blocks == 4 && p.n_free == 2);
    kiln_kv_seq_release(&p, &a);
    CHECK(p.n_free == 6);
    kiln_kv_pool_free(&p);
}

static void test_table_full(void)
{
    kiln_kv_pool p;
    CHECK_OK(kiln_kv_pool_init(&p, 100, 4));
    int32_t t[3];
    kiln_kv_seq s;
    kiln_kv_seq_init(&s, t, 3);
    CHECK_OK(kiln_kv_seq_grow(&p, &s, 12));
    CHECK_FAILS(kiln_kv_seq_grow(&p, &s, 13), KILN_ERROR_LIMIT, "needs 4 KV blocks of 4 tokens; a sequence may hold 3");
    CHECK(s.n_blocks == 3 && p.n_free == 97);
    kiln_kv_seq_release(&p, &s);
    kiln_kv_pool_free(&p);
}

/* Many sequences growing and finishing in an interleaved order never lose
 * or duplicate a block. */
static void test_churn(void)
{
    enum { BLOCKS = 64, SEQS = 8, CAP = 64 };
    kiln_kv_pool p;
    CHECK_OK(kiln_kv_pool_init(&p, BLOCKS, 2));
    int32_t tables[SEQS][CAP];
    kiln_kv_seq s[SEQS];
    int64_t len[SEQS] = {0};
    for (int i = 0; i < SEQS; i++)
        kiln_kv_seq_init(&s[i], tables[i], CAP);
    uint32_t x = 12345;
    int refused = 0;
    for (int step = 0; step < 5000; step++) {
        x = x * 1103515245u + 12345u;
        int i = (int)((x >> 16) % SEQS);
        if ((x >> 8) % 7 == 0) {
            kiln_kv_seq_release(&p, &s[i]);
            len[i] = 0;
        } else if (kiln_kv_seq_grow(&p, &s[i], len[i] + 3) == KILN_OK) {
            len[i] += 3;
        } else {
            refused++;
        }
        int held = 0;
        for (int k = 0; k < SEQS; k++)
            held += s[k].n_blocks;
        if (held + p.n_free != BLOCKS) {
            CHECK(held + p.n_free == BLOCKS);
            break;
        }
    }
    int seen[BLOCKS] = {0}, dup = 0;
    for (int k = 0; k < SEQS; k++)
        for (int j = 0; j < s[k].n_blocks; j++)
            dup |= seen[s[k].blocks[j]]++ > 0;
    for (int j = 0; j < p.n_free; j++)
        dup |= seen[p.free_list[j]]++ > 0;
    CHECK(!dup);
    CHECK(refused > 0); /* the pool did run full */
    for (int k = 0; k < SEQS; k++)
        kiln_kv_seq_release(&p, &s[k]);
    CHECK(p.n_free == BLOCKS);
    kiln_kv_pool_free(&p);
}

/* Prefix caching: full blocks registered by one sequence are taken by the
 * next one with the same leading ids (and only those: ids are compared,
 * not just hashes), kept evictable when released, evicted oldest first
 * (a chain's tail before its head), and dropped when caching is off. */
static void test_prefix_cache(void)
{
    kiln_kv_pool p;
    CHECK_OK(kiln_kv_pool_init(&p, 6, 2));
    CHECK_OK(kiln_kv_pool_set_caching(&p, 1));
    int32_t ta[8], tb[8], tc[8];
    uint64_t ha[8], hb[8];
    kiln_kv_seq a, b, c;
    kiln_kv_seq_init(&a, ta, 8);
    kiln_kv_seq_init(&b, tb, 8);
    kiln_kv_seq_init(&c, tc, 8);
    const int32_t ids[6] = {5, 6, 7, 8, 9, 10}, other[6] = {5, 6, 7, 9, 9, 10};
    CHECK_OK(kiln_kv_seq_grow(&p, &a, 6));
    for (int32_t j = 0; j < 2; j++) {
        ha[j] = kiln_kv_block_hash(j ? ha[j - 1] : 0, ids + 2 * j, 2);
        kiln_kv_seq_register(&p, &a, j, ha[j], ids + 2 * j);
    }
    /* Held by a: nothing evictable yet; a second sequence shares them. */
    CHECK(p.n_free == 3 && p.n_lru == 0);
    CHECK(kiln_kv_seq_match(&p, &b, ids, 3, hb) == 2 && tb[0] == ta[0] && tb[1] == ta[1] && p.ref[ta[0]] == 2);
    CHECK(hb[0] == ha[0] && hb[1] == ha[1]);
    kiln_kv_seq_release(&p, &a);
    CHECK(p.n_free == 4 && p.n_lru == 0 && kiln_kv_pool_available(&p) == 4);
    kiln_kv_seq_release(&p, &b);
    CHECK(p.n_free == 4 && p.n_lru == 2 && kiln_kv_pool_available(&p) == 6);
    /* Other ids in the second block: only the first is taken. */
    CHECK(kiln_kv_seq_match(&p, &c, other, 3, hb) == 1 && tc[0] == ta[0] && p.n_lru == 1);
    kiln_kv_seq_release(&p, &c);
    /* A block registered under a's first hash with other ids (a forged
     * collision) is never taken for a's ids. */
    kiln_kv_seq_init(&c, tc, 8);
    CHECK_OK(kiln_kv_seq_grow(&p, &c, 2));
    int32_t forged = tc[0];
    const int32_t forged_ids[2] = {5, 7};
    kiln_kv_seq_register(&p, &c, 0, ha[0], forged_ids);
    kiln_kv_seq_release(&p, &c);
    CHECK(p.n_lru == 3 && p.n_free == 3);
    kiln_kv_seq_init(&c, tc, 8);
    CHECK(kiln_kv_seq_match(&p, &c, ids, 3, hb) == 2 && tc[0] == ta[0] && tc[0] != forged);
    kiln_kv_seq_release(&p, &c);
    /* Least recently released first: forged, then a's second block (a
     * chain's tail is released before its head), then its first. Growing
     * past the free blocks evicts in that order. */
    kiln_kv_seq_init(&c, tc, 8);
    CHECK_OK(kiln_kv_seq_grow(&p, &c, 2 * 4));
    CHECK(p.n_free == 0 && p.n_lru == 2 && tc[3] == forged);
    CHECK_OK(kiln_kv_seq_grow(&p, &c, 2 * 5));
    CHECK(tc[4] == ta[1] && p.n_lru == 1);
    CHECK(kiln_kv_seq_match(&p, &b, ids, 3, hb) == 1 && tb[0] == ta[0]);
    kiln_kv_seq_release(&p, &b);
    CHECK_FAILS(kiln_kv_seq_grow(&p, &c, 2 * 7), KILN_ERROR_LIMIT, "needs 2 more blocks, 1 of 6 are free");
    kiln_kv_seq_release(&p, &c);
    CHECK(kiln_kv_pool_available(&p) == 6 && p.n_lru >= 1);
    /* Off: every cached block is free again, and nothing matches. */
    CHECK_OK(kiln_kv_pool_set_caching(&p, 0));
    CHECK(p.n_free == 6 && p.n_lru == 0);
    CHECK(kiln_kv_seq_match(&p, &b, ids, 3, hb) == 0);
    kiln_kv_pool_free(&p);
}

static const test_case_ tests[] = {TEST(test_prefix_cache), TEST(test_blocks_for), TEST(test_grow_release),
                                   TEST(test_table_full), TEST(test_churn)};

TEST_MAIN(tests)
