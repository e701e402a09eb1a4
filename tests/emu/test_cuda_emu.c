/* The CUDA emulator's own test (kernels/cuda/emu): barriers, warp collectives and atomics behave
 * as on a GPU, and the bugs the emulator exists to catch are caught -- a block reduction with a
 * missing __syncthreads gives a wrong sum under every seed tried, a warp sum read from the wrong
 * lane is wrong, a barrier in divergent code is reported instead of hanging. */
#include <stdint.h>
#include <stdlib.h>

#include "test.h"

int emu_block_sum(const float *x, int n, float *out, int missing_sync);
int emu_warp_sum_down(const float *x, int warps, float *out, int reader);
int emu_warp_ops(const float *x, float *sum, float *bcast, unsigned *ballot, int *any_all);
int emu_count_atomically(int blocks, int threads, int *count);
int emu_divergent_barrier(void);
void ctrl_emu_set_seed(uint64_t seed);

/* Small integers: every sum is exact in float whatever the order, so "right" means equal. */
static void fill(float *x, int n, int salt) {
    for (int i = 0; i < n; i++) x[i] = (float)((i * 7 + salt) % 13 + 1);
}

TEST(block_reduction_needs_its_barrier) {
    enum { N = 1000, BLOCKS = 4 };
    float x[N], want[BLOCKS] = {0}, got[BLOCKS];
    fill(x, N, 3);
    for (int i = 0; i < N; i++) want[i / 256] += x[i];
    for (uint64_t seed = 1; seed <= 5; seed++) {
        ctrl_emu_set_seed(seed);
        CHECK_EQ_INT(emu_block_sum(x, N, got, 0), 0);
        for (int b = 0; b < BLOCKS; b++)
            CHECK_MSG(got[b] == want[b], "seed %llu block %d: %g, want %g", (unsigned long long)seed, b,
                      got[b], want[b]);
        ctrl_emu_set_seed(seed);
        CHECK_EQ_INT(emu_block_sum(x, N, got, 1), 0);
        int wrong = 0;
        for (int b = 0; b < BLOCKS; b++) wrong += got[b] != want[b];
        CHECK_MSG(wrong > 0, "seed %llu: the missing __syncthreads went unnoticed", (unsigned long long)seed);
    }
}

TEST(warp_sum_read_from_the_wrong_lane) {
    enum { WARPS = 3 };
    float x[WARPS * 32], want[WARPS] = {0}, got[WARPS];
    fill(x, WARPS * 32, 5);
    for (int i = 0; i < WARPS * 32; i++) want[i / 32] += x[i];
    CHECK_EQ_INT(emu_warp_sum_down(x, WARPS, got, 0), 0);
    for (int w = 0; w < WARPS; w++) CHECK_MSG(got[w] == want[w], "warp %d: %g, want %g", w, got[w], want[w]);
    for (int reader = 1; reader < 32; reader += 10) {
        CHECK_EQ_INT(emu_warp_sum_down(x, WARPS, got, reader), 0);
        CHECK_MSG(got[0] != want[0], "lane %d's partial sum passed for the total", reader);
    }
}

TEST(warp_shuffles_and_votes) {
    float x[32], sum[32], bcast[32];
    unsigned ballot[32];
    int any_all[32];
    fill(x, 32, 1);
    x[7] = -1; /* not all positive */
    float total = 0;
    for (int i = 0; i < 32; i++) total += x[i];
    unsigned want_ballot = 0;
    for (int i = 0; i < 32; i += 3) want_ballot |= 1u << i;
    CHECK_EQ_INT(emu_warp_ops(x, sum, bcast, ballot, any_all), 0);
    for (int i = 0; i < 32; i++) {
        CHECK_MSG(sum[i] == total, "lane %d: xor sum %g, want %g", i, sum[i], total);
        CHECK_MSG(bcast[i] == x[i / 16 * 16 + 5], "lane %d: width-16 broadcast %g", i, bcast[i]);
        CHECK_MSG(ballot[i] == want_ballot, "lane %d: ballot %08x, want %08x", i, ballot[i], want_ballot);
        CHECK_EQ_INT(any_all[i], 2); /* any, not all */
    }
}

TEST(atomics_count_every_thread) {
    int count = -1;
    CHECK_EQ_INT(emu_count_atomically(7, 96, &count), 0);
    CHECK_EQ_INT(count, 7 * 96);
}

TEST(divergent_barrier_is_reported) {
    CHECK_MSG(emu_divergent_barrier() != 0, "a deadlocking barrier returned success");
    /* the error is consumed: the next launch is clean */
    int count = -1;
    CHECK_EQ_INT(emu_count_atomically(1, 32, &count), 0);
    CHECK_EQ_INT(count, 32);
}
