/* The AMX micro-kernel of the blocked bf16 GEMM (the driver, packing and dispatch: gemm_bf16.c):
 * a 32 x 32 block of C in four 16 x 16 fp32 tiles (tmm0-3), fed per step of 32 in depth by two A
 * tiles (tmm4-5: 16 rows x 16 bf16 pairs) and two B tiles (tmm6-7: 16 pairs x 16 columns, VNNI
 * pairs), four TDPBF16PS a step. All eight tiles are 16 rows of 64 bytes: one configuration
 * (loaded by each thread before its first tile, released after its last). The A block is packed as
 * whole tiles (contiguous 1 KiB, stride 64 bytes), the B panel as 32 columns of pairs (each tile
 * at stride 128 bytes); the panel's depth is padded with zero pairs to a multiple of 16. Blocking:
 * depth 512 (a B panel of 32 KiB stays in L1 while a 256-row A block, 256 KiB, streams from L2),
 * columns 8192 (the model's widest projection, 4864, in one block, so A is packed once per depth
 * block). A whole 32 x 32 block of C is loaded and stored as tiles in place (stride ldc); at an
 * edge, through a 32 x 32 buffer holding C's part and zeros.
 *
 * Written against amx_tile.h: compiled here for the real instructions, and again by
 * gemm_amx_emu.c (CTRL_AMX_EMULATED) against their software emulation, which the tests run. */
#include <string.h>

#include "cpu/amx_tile.h"
#include "cpu/gemm_bf16_kernel.h"

#ifdef CTRL_AMX_EMULATED
#define KERNEL ctrl_bf16_amx_emu_kernel
#define TILES ctrl_bf16_amx_emu_tiles
#else
#define KERNEL ctrl_bf16_amx_kernel
#define TILES ctrl_bf16_amx_tiles
#endif

#if AMX_COMPILED
/* tile registers: numbers, not enumerators (GCC's intrinsics paste them into the instruction's text) */
#define TC00 0
#define TC01 1
#define TC10 2
#define TC11 3
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7

static const ctrl_amx_tilecfg config = {
    .palette_id = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

AMX_TARGET static void amx_begin(void) { AMX_LOADCONFIG(&config); }

AMX_TARGET static void amx_end(void) { AMX_RELEASE(); }

/* One 32 x 32 block of C over the depth (kp pairs), as the variant asks (flags, constants in each
 * instance below, so that the compiler drops what is not asked): CTRL_AMX_TILE_INTERLEAVE issues the
 * loads between the products (A0 B0 C00, B1 C01, A1 C10 C11: a tile register is reloaded as soon as
 * its last reader has issued, since the tile registers are not renamed) instead of four loads then
 * four products; CTRL_AMX_TILE_PREFETCH_C prefetches, for writing, the next block's rows of C
 * (32 rows down: the driver's next call on the same panel) while this block's products run, so that
 * its load or store does not wait on memory (prefetches never fault, past C's end included);
 * CTRL_AMX_TILE_PREFETCH_A prefetches into L1 the A tiles two steps ahead (the A block streams from
 * L2 while the B panel stays in L1). */
AMX_TARGET static inline void amx_tile_with(int kp, const uint32_t *a, const uint32_t *b, float *c,
                                            size_t ldc, int mr, int nr, int accumulate, const int flags) {
    float edge[32 * 32];
    const int whole = mr == 32 && nr == 32;
    float *t = whole ? c : edge;
    const size_t ldt = whole ? ldc : 32, stride = ldt * sizeof(float);
    if (!whole && accumulate) { /* C's part, zeros around it */
        memset(edge, 0, sizeof edge);
        for (int i = 0; i < mr; i++) memcpy(edge + 32 * i, c + (size_t)i * ldc, sizeof(float) * (size_t)nr);
    }
    if (accumulate) {
        AMX_LOADD(TC00, t, stride);
        AMX_LOADD(TC01, t + 16, stride);
        AMX_LOADD(TC10, t + 16 * ldt, stride);
        AMX_LOADD(TC11, t + 16 * ldt + 16, stride);
    } else {
        AMX_ZERO(TC00);
        AMX_ZERO(TC01);
        AMX_ZERO(TC10);
        AMX_ZERO(TC11);
    }
    const uint32_t *a1 = a + (size_t)16 * kp; /* rows 16-31 */
    /* addresses only prefetched, possibly past the buffers' ends: computed as integers */
    const uintptr_t next = (uintptr_t)c + 32 * ldc * sizeof(float);
    const int steps = kp / 16;
    for (int s = 0; s < steps; s++, a += 256, a1 += 256, b += 16 * 32) {
        if (flags & CTRL_AMX_TILE_PREFETCH_C) /* 64 lines over the steps: a few each */
            for (int l = 64 * s / steps; l < 64 * (s + 1) / steps; l++)
                __builtin_prefetch(
                    (const void *)(next + (size_t)(l >> 1) * ldc * sizeof(float) + 64 * (l & 1)), 1, 3);
        if (flags & CTRL_AMX_TILE_PREFETCH_A)
            for (int l = 0; l < 16; l++) {
                __builtin_prefetch((const void *)((uintptr_t)a + 2048 + 64 * l), 0, 3);
                __builtin_prefetch((const void *)((uintptr_t)a1 + 2048 + 64 * l), 0, 3);
            }
        if (flags & CTRL_AMX_TILE_INTERLEAVE) {
            AMX_LOADD(TA0, a, 64);
            AMX_LOADD(TB0, b, 128);
            AMX_DPBF16PS(TC00, TA0, TB0);
            AMX_LOADD(TB1, b + 16, 128);
            AMX_DPBF16PS(TC01, TA0, TB1);
            AMX_LOADD(TA1, a1, 64);
            AMX_DPBF16PS(TC10, TA1, TB0);
            AMX_DPBF16PS(TC11, TA1, TB1);
        } else {
            AMX_LOADD(TA0, a, 64);
            AMX_LOADD(TA1, a1, 64);
            AMX_LOADD(TB0, b, 128);
            AMX_LOADD(TB1, b + 16, 128);
            AMX_DPBF16PS(TC00, TA0, TB0);
            AMX_DPBF16PS(TC01, TA0, TB1);
            AMX_DPBF16PS(TC10, TA1, TB0);
            AMX_DPBF16PS(TC11, TA1, TB1);
        }
    }
    AMX_STORED(TC00, t, stride);
    AMX_STORED(TC01, t + 16, stride);
    AMX_STORED(TC10, t + 16 * ldt, stride);
    AMX_STORED(TC11, t + 16 * ldt + 16, stride);
    if (!whole)
        for (int i = 0; i < mr; i++) memcpy(c + (size_t)i * ldc, edge + 32 * i, sizeof(float) * (size_t)nr);
}

#define TILE_VARIANT(name, flags)                                                                            \
    AMX_TARGET static void name(int kp, const uint32_t *a, const uint32_t *b, float *c, size_t ldc, int mr,  \
                                int nr, int accumulate) {                                                    \
        amx_tile_with(kp, a, b, c, ldc, mr, nr, accumulate, flags);                                          \
    }
TILE_VARIANT(amx_tile, 0)
TILE_VARIANT(amx_tile_i, CTRL_AMX_TILE_INTERLEAVE)
TILE_VARIANT(amx_tile_p, CTRL_AMX_TILE_PREFETCH_C)
TILE_VARIANT(amx_tile_ip, CTRL_AMX_TILE_INTERLEAVE | CTRL_AMX_TILE_PREFETCH_C)
TILE_VARIANT(amx_tile_a, CTRL_AMX_TILE_PREFETCH_A)
TILE_VARIANT(amx_tile_ia, CTRL_AMX_TILE_INTERLEAVE | CTRL_AMX_TILE_PREFETCH_A)
TILE_VARIANT(amx_tile_pa, CTRL_AMX_TILE_PREFETCH_C | CTRL_AMX_TILE_PREFETCH_A)
TILE_VARIANT(amx_tile_ipa, CTRL_AMX_TILE_INTERLEAVE | CTRL_AMX_TILE_PREFETCH_C | CTRL_AMX_TILE_PREFETCH_A)

const ctrl_bf16_tile_fn TILES[CTRL_AMX_TILE_VARIANTS] = {amx_tile,   amx_tile_i,  amx_tile_p,  amx_tile_ip,
                                                         amx_tile_a, amx_tile_ia, amx_tile_pa, amx_tile_ipa};

const ctrl_bf16_kernel KERNEL = {.mr = 32,
                                 .nr = 32,
                                 .kc = 512,
                                 .mc = 256,
                                 .nc = 8192,
                                 .kpad = 16,
                                 .a_rows = 1,
                                 .begin = amx_begin,
                                 .end = amx_end,
                                 .tile = amx_tile};
#else
const ctrl_bf16_kernel KERNEL = {.tile = NULL};
const ctrl_bf16_tile_fn TILES[CTRL_AMX_TILE_VARIANTS] = {NULL};
#endif
