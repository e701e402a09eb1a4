/* What the blocked bf16 GEMM's driver (gemm_bf16.c: blocking, packing, threads) needs of a
 * micro-kernel: the AVX-512 BF16 register tile (gemm_bf16.c) or the AMX tiles (gemm_amx.c, and its
 * emulated build gemm_amx_emu.c).
 *
 * Packed layouts, per depth block of kc values (kc2 = (kc + 1) / 2 pairs, padded with zero pairs
 * to kp, a multiple of kpad): a pair is one uint32_t, bf16 of depth k in the low half and of k + 1
 * in the high half (the VNNI pairing).
 *   B: panels of nr columns, kp x nr: pair k2 of column j of panel p at b[p * kp * nr + k2 * nr + j].
 *   A (a_rows = 0): panels of mr rows, pair k2 of row i at a[(i / mr) * kp * mr + k2 * mr + i % mr].
 *   A (a_rows = 1): groups of 16 rows, each kp / 16 tiles of 16 rows x 16 pairs: pair k2 of row i at
 *                   a[(i / 16) * 16 * kp + (k2 / 16) * 256 + (i % 16) * 16 + k2 % 16] (AMX's A tile).
 * tile(kp, a, b, c, ldc, mr, nr, acc): c[mr, nr] (+)= the product of the rows at a and the panel at
 * b (a = the kernel's mr rows, b = one panel; mr, nr at most the kernel's; rows and columns past
 * them are computed on padding and not stored). */
#ifndef CTRL_KERNELS_CPU_GEMM_BF16_KERNEL_H
#define CTRL_KERNELS_CPU_GEMM_BF16_KERNEL_H

#include <stddef.h>
#include <stdint.h>

typedef void (*ctrl_bf16_tile_fn)(int kp, const uint32_t *a, const uint32_t *b, float *c, size_t ldc, int mr,
                                  int nr, int accumulate);

typedef struct ctrl_bf16_kernel {
    int mr, nr;          /* rows and columns per tile call (multiples of 8 and 16; a_rows: of 16) */
    int kc, mc, nc;      /* depth, rows of A, columns of B per block (kc even; mc a multiple of mr and
                          * 16; nc of nr and 16; nc <= CTRL_BF16_NC_MAX) */
    int kpad;            /* pairs per panel rounded up to a multiple of this */
    int a_rows;          /* A's layout (above) */
    void (*begin)(void); /* each thread before its first tile call (NULL: nothing) */
    void (*end)(void);   /* each thread after its last */
    void (*tile)(int kp, const uint32_t *a, const uint32_t *b, float *c, size_t ldc, int mr, int nr,
                 int accumulate); /* NULL: not compiled in */
} ctrl_bf16_kernel;

#define CTRL_BF16_NC_MAX 8192

extern const ctrl_bf16_kernel ctrl_bf16_amx_kernel;     /* gemm_amx.c: AMX tiles */
extern const ctrl_bf16_kernel ctrl_bf16_amx_emu_kernel; /* gemm_amx_emu.c: the same, emulated */

/* The AMX tile's variants (gemm_amx.c; a tuning switch, CTRL_AMX_TILE in gemm_bf16.c): index = flags */
#define CTRL_AMX_TILE_INTERLEAVE 1 /* loads interleaved with the products */
#define CTRL_AMX_TILE_PREFETCH_C 2 /* the next block's rows of C prefetched for writing */
#define CTRL_AMX_TILE_PREFETCH_A 4 /* the A tiles two steps ahead prefetched into L1 */
#define CTRL_AMX_TILE_VARIANTS 8
extern const ctrl_bf16_tile_fn ctrl_bf16_amx_tiles[CTRL_AMX_TILE_VARIANTS];     /* [0]: the kernel's own */
extern const ctrl_bf16_tile_fn ctrl_bf16_amx_emu_tiles[CTRL_AMX_TILE_VARIANTS]; /* the same, emulated */

/* For sweeps in one process (bench/scale/amx_sweep.py, through ctypes; not for the library's users):
 * every rule's blocking replaced by kc, mc, nc (kc <= 0: the rules' own) and its tile variant by tile
 * (< 0: the rules' own), as CTRL_AMX_BLOCKS and CTRL_AMX_TILE do (gemm_bf16.c); only while no bf16
 * GEMM runs. 0, or -1 (out of range: nothing changed). */
int ctrl_cpu_gemm_bf16_amx_tune(int kc, int mc, int nc, int tile);

#endif
