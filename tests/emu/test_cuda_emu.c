/* The CUDA emulator's own test (kernels/cuda/emu): barriers, warp collectives and atomics behave
 * as on a GPU, and the bugs the emulator exists to catch are caught -- a block reduction with a
 * missing __syncthreads gives a wrong sum under every seed tried, a warp sum read from the wrong
 * lane is wrong, a barrier in divergent code is reported instead of hanging; the tensor-core
 * instructions (mma.sync m16n8k16 bf16, ldmatrix .x4 and .trans) follow the PTX ISA's per-lane
 * fragment layouts, and a fragment built with a lane layout bug gives a wrong product. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

int emu_block_sum(const float *x, int n, float *out, int missing_sync);
int emu_warp_sum_down(const float *x, int warps, float *out, int reader);
int emu_warp_ops(const float *x, float *sum, float *bcast, unsigned *ballot, int *any_all);
int emu_count_atomically(int blocks, int threads, int *count);
int emu_divergent_barrier(void);
int emu_mma_tile(const uint16_t *A, const uint16_t *B, const float *C, float *D, int swap, int half);
int emu_ldmatrix_tile(const uint16_t *M, uint32_t *out, int misalign);
int emu_cp_async_tile(const unsigned *src, unsigned *dst, int wait);
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

/* bf16 bits of a small integer (exact). */
static uint16_t bf16_int(int v) {
    const float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

TEST(mma_m16n8k16_follows_the_ptx_fragment_layout) {
    uint16_t A[256], B[128];
    float C[128], want[128], got[128];
    int a[256], b[128];
    for (int i = 0; i < 256; i++) a[i] = (i * 5 + 3) % 9 - 4, A[i] = bf16_int(a[i]);
    for (int i = 0; i < 128; i++) b[i] = (i * 7 + 1) % 11 - 5, B[i] = bf16_int(b[i]), C[i] = (float)(i % 5);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) {
            int acc = (int)C[r * 8 + c];
            for (int k = 0; k < 16; k++) acc += a[r * 16 + k] * b[k * 8 + c];
            want[r * 8 + c] = (float)acc; /* small integers: exact in any order */
        }
    CHECK_EQ_INT(emu_mma_tile(A, B, C, got, 0, 0), 0);
    for (int i = 0; i < 128; i++)
        CHECK_MSG(got[i] == want[i], "D[%d][%d] = %g, want %g", i / 8, i % 8, got[i], want[i]);
    CHECK_EQ_INT(emu_mma_tile(A, B, C, got, 1, 0), 0);
    int wrong = 0;
    for (int i = 0; i < 128; i++) wrong += got[i] != want[i];
    CHECK_MSG(wrong > 0, "an A fragment with rows and columns exchanged went unnoticed");
    CHECK_MSG(emu_mma_tile(A, B, C, got, 0, 1) != 0, "an mma.sync executed by half a warp was not reported");
}

TEST(ldmatrix_follows_the_ptx_fragment_layout) {
    uint16_t M[256];
    uint32_t out[256];
    for (int i = 0; i < 256; i++) M[i] = (uint16_t)(i * 37 + 11);
#define PAIR(r0, c0, r1, c1) ((uint32_t)M[(r0)*16 + (c0)] | (uint32_t)M[(r1)*16 + (c1)] << 16)
    CHECK_EQ_INT(emu_ldmatrix_tile(M, out, 0), 0);
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        /* plain: the A fragment of the 16x16 tile (rows g / g+8, columns 2t / 2t+8) */
        const uint32_t a[4] = {PAIR(g, 2 * t, g, 2 * t + 1), PAIR(g + 8, 2 * t, g + 8, 2 * t + 1),
                               PAIR(g, 2 * t + 8, g, 2 * t + 9), PAIR(g + 8, 2 * t + 8, g + 8, 2 * t + 9)};
        /* trans: B fragments (k = row, n = column) of the n-tiles at columns 0 and 8 */
        const uint32_t bt[4] = {PAIR(2 * t, g, 2 * t + 1, g), PAIR(2 * t + 8, g, 2 * t + 9, g),
                                PAIR(2 * t, g + 8, 2 * t + 1, g + 8),
                                PAIR(2 * t + 8, g + 8, 2 * t + 9, g + 8)};
        for (int i = 0; i < 4; i++) {
            CHECK_MSG(out[l * 8 + i] == a[i], "lane %d register %d: %08x, want %08x", l, i, out[l * 8 + i],
                      a[i]);
            CHECK_MSG(out[l * 8 + 4 + i] == bt[i], "lane %d .trans register %d: %08x, want %08x", l, i,
                      out[l * 8 + 4 + i], bt[i]);
        }
    }
#undef PAIR
    CHECK_MSG(emu_ldmatrix_tile(M, out, 1) != 0, "a misaligned ldmatrix row address was not reported");
}

TEST(cp_async_lands_at_its_wait) {
    unsigned src[128], dst[128];
    for (int i = 0; i < 128; i++) src[i] = 1000u + (unsigned)i;
    CHECK_EQ_INT(emu_cp_async_tile(src, dst, 1), 0);
    for (int l = 0; l < 32; l++)
        for (int w = 0; w < 4; w++) CHECK_EQ_INT((int)dst[l * 4 + w], (int)src[(l + 1) % 32 * 4 + w]);
    CHECK_EQ_INT(emu_cp_async_tile(src, dst, 0), 0);
    int stale = 0;
    for (int i = 0; i < 128; i++) stale += dst[i] == 0;
    /* a copy lands at its thread's wait or exit: a neighbour that has exited already shows its own */
    CHECK_MSG(stale > 0, "a read before cp.async.wait_group went unnoticed (every copy had landed)");
}
