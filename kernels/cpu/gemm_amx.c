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
#else
#define KERNEL ctrl_bf16_amx_kernel
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

AMX_TARGET static void amx_tile(int kp, const uint32_t *a, const uint32_t *b, float *c, size_t ldc, int mr,
                                int nr, int accumulate) {
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
    for (int s = 0; s < kp / 16; s++, a += 256, a1 += 256, b += 16 * 32) {
        AMX_LOADD(TA0, a, 64);
        AMX_LOADD(TA1, a1, 64);
        AMX_LOADD(TB0, b, 128);
        AMX_LOADD(TB1, b + 16, 128);
        AMX_DPBF16PS(TC00, TA0, TB0);
        AMX_DPBF16PS(TC01, TA0, TB1);
        AMX_DPBF16PS(TC10, TA1, TB0);
        AMX_DPBF16PS(TC11, TA1, TB1);
    }
    AMX_STORED(TC00, t, stride);
    AMX_STORED(TC01, t + 16, stride);
    AMX_STORED(TC10, t + 16 * ldt, stride);
    AMX_STORED(TC11, t + 16 * ldt + 16, stride);
    if (!whole)
        for (int i = 0; i < mr; i++) memcpy(c + (size_t)i * ldc, edge + 32 * i, sizeof(float) * (size_t)nr);
}

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
#endif
