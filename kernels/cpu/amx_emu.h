/* Software emulation of the AMX instructions the bf16 GEMM uses (kernels/cpu/amx_emu.c), so that
 * the AMX kernel (gemm_amx.c) runs and is tested on CPUs without AMX: gemm_amx_emu.c compiles the
 * same kernel source against these functions instead of the tile intrinsics (kernels/cpu/
 * amx_tile.h maps one name to either). Each is the instruction as the Intel SDM defines it:
 *
 *   ctrl_amx_emu_loadconfig   LDTILECFG: palette 0 (release every tile) or 1 (8 tiles of at most
 *                             16 rows of 64 bytes); rows and colsb of each tile from the 64-byte
 *                             configuration below. A palette over 1, a nonzero reserved byte, a
 *                             tile past the palette's rows or bytes per row is a fault (#GP).
 *   ctrl_amx_emu_loadd        TILELOADD t, [base + stride]: row r of tile t <- colsb bytes at
 *                             base + r * stride; the bytes past colsb and the rows past rows are 0.
 *   ctrl_amx_emu_stored       TILESTORED: rows x colsb bytes back, row r at base + r * stride.
 *   ctrl_amx_emu_zero         TILEZERO: the whole tile 0.
 *   ctrl_amx_emu_dpbf16ps     TDPBF16PS c, a, b: for each row m of c and each dword column n, two
 *                             fp32 sums start at 0 and run over the pairs k of a's row m: the even
 *                             one adds a[m].bf16[2k] * b[k].bf16[2n], the odd one a[m].bf16[2k+1] *
 *                             b[k].bf16[2n+1], each step a fused multiply-add rounded to nearest
 *                             even; then c[m][n] = c[m][n] + (even + odd). Every step treats
 *                             denormal inputs as zero (DAZ) and flushes results below FLT_MIN to
 *                             zero (FTZ, tininess after rounding as x86 detects it); MXCSR is not
 *                             read. NaNs stay NaN (their payload is not modelled). Faults (#UD):
 *                             tiles not configured, c, a, b not distinct, a colsb not a multiple
 *                             of 4, c.colsb != b.colsb, a.colsb / 4 != b.rows, c.rows != a.rows.
 *   ctrl_amx_emu_release      TILERELEASE: back to the initial state (palette 0).
 *
 * The tile registers and configuration are per thread (thread-local), as the hardware's are per
 * logical CPU. A fault calls the fault handler (default: a message on stderr, then abort(), as the
 * hardware's #UD / #GP would end the process); a handler that returns makes the instruction do
 * nothing. Not modelled: start_row (restart after a page fault), TILELOADDT1's cache hint, the
 * other AMX instructions. */
#ifndef CTRL_KERNELS_CPU_AMX_EMU_H
#define CTRL_KERNELS_CPU_AMX_EMU_H

#include <stddef.h>
#include <stdint.h>

/* The 64-byte operand of LDTILECFG (palette 1: tiles 0-7 used, the rest reserved, must be 0). */
typedef struct ctrl_amx_tilecfg {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved0[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ctrl_amx_tilecfg;

enum { CTRL_AMX_TILES = 8, CTRL_AMX_MAX_ROWS = 16, CTRL_AMX_MAX_COLSB = 64 };

void ctrl_amx_emu_loadconfig(const void *cfg);
void ctrl_amx_emu_loadd(int t, const void *base, ptrdiff_t stride);
void ctrl_amx_emu_stored(int t, void *base, ptrdiff_t stride);
void ctrl_amx_emu_zero(int t);
void ctrl_amx_emu_dpbf16ps(int c, int a, int b);
void ctrl_amx_emu_release(void);

/* Sets this thread's fault handler (NULL: the default), returns the previous one. */
typedef void (*ctrl_amx_emu_fault_fn)(const char *what);
ctrl_amx_emu_fault_fn ctrl_amx_emu_set_fault_handler(ctrl_amx_emu_fault_fn fn);

#endif
