/* The AMX instructions of amx_emu.h in software (the header says what each does and what faults).
 * TDPBF16PS follows the Intel SDM's pseudo-code step for step: per row m of the destination, two
 * fp32 partial sums per dword column n (even and odd bf16 lanes), each a chain of fused
 * multiply-adds over the pairs k in order, then c + (even + odd). A fused multiply-add of fp32
 * values with a bf16 x bf16 product is computed in double: the product is exact (8-bit
 * significands), the sum of it and an fp32 accumulator rounds once to double, and rounding that to
 * fp32 gives the correctly rounded fp32 result (double has more than 2 x 24 + 1 bits, so the double
 * rounding is innocuous); the same holds for the sums of two fp32 values. */
#include "cpu/amx_emu.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tile_state {
    int palette; /* 0: initial state, nothing configured */
    uint8_t rows[CTRL_AMX_TILES];
    uint16_t colsb[CTRL_AMX_TILES];
    uint8_t data[CTRL_AMX_TILES][CTRL_AMX_MAX_ROWS][CTRL_AMX_MAX_COLSB];
} tile_state;

static _Thread_local tile_state st;
static _Thread_local ctrl_amx_emu_fault_fn on_fault;

static void default_fault(const char *what) {
    fprintf(stderr, "amx emulator: %s (the hardware would fault here)\n", what);
    abort();
}

ctrl_amx_emu_fault_fn ctrl_amx_emu_set_fault_handler(ctrl_amx_emu_fault_fn fn) {
    ctrl_amx_emu_fault_fn old = on_fault;
    on_fault = fn;
    return old;
}

__attribute__((format(printf, 1, 2))) static int fault(const char *fmt, ...) {
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    (on_fault ? on_fault : default_fault)(msg);
    return 1;
}

void ctrl_amx_emu_release(void) { memset(&st, 0, sizeof st); }

void ctrl_amx_emu_loadconfig(const void *cfg) {
    ctrl_amx_tilecfg c;
    memcpy(&c, cfg, sizeof c);
    if (c.palette_id > 1) {
        fault("ldtilecfg: palette %d (palette 1 is the only one)", c.palette_id);
        return;
    }
    if (c.palette_id == 0) { /* the initial state */
        ctrl_amx_emu_release();
        return;
    }
    for (int i = 0; i < 14; i++)
        if (c.reserved0[i] && fault("ldtilecfg: reserved byte %d is %d", 2 + i, c.reserved0[i])) return;
    for (int t = 0; t < 16; t++) {
        if (t >= CTRL_AMX_TILES) {
            if ((c.rows[t] || c.colsb[t]) && fault("ldtilecfg: tile %d is past palette 1's 8", t)) return;
            continue;
        }
        if (c.rows[t] > CTRL_AMX_MAX_ROWS &&
            fault("ldtilecfg: tile %d has %d rows (16 at most)", t, c.rows[t]))
            return;
        if (c.colsb[t] > CTRL_AMX_MAX_COLSB &&
            fault("ldtilecfg: tile %d has %d bytes a row (64 at most)", t, c.colsb[t]))
            return;
    }
    memset(&st, 0, sizeof st);
    st.palette = 1;
    for (int t = 0; t < CTRL_AMX_TILES; t++) st.rows[t] = c.rows[t], st.colsb[t] = c.colsb[t];
}

/* tile t configured (a valid tile of the current palette), else a fault */
static int usable(const char *insn, int t, int need_shape) {
    if (!st.palette) return !fault("%s: tiles are not configured (ldtilecfg first)", insn);
    if (t < 0 || t >= CTRL_AMX_TILES) return !fault("%s: tile register %d does not exist", insn, t);
    if (need_shape && (!st.rows[t] || !st.colsb[t]))
        return !fault("%s: tile %d is not configured (%d rows of %d bytes)", insn, t, st.rows[t],
                      st.colsb[t]);
    return 1;
}

void ctrl_amx_emu_loadd(int t, const void *base, ptrdiff_t stride) {
    if (!usable("tileloadd", t, 1)) return;
    memset(st.data[t], 0, sizeof st.data[t]);
    for (int r = 0; r < st.rows[t]; r++) memcpy(st.data[t][r], (const char *)base + r * stride, st.colsb[t]);
}

void ctrl_amx_emu_stored(int t, void *base, ptrdiff_t stride) {
    if (!usable("tilestored", t, 1)) return;
    for (int r = 0; r < st.rows[t]; r++) memcpy((char *)base + r * stride, st.data[t][r], st.colsb[t]);
}

void ctrl_amx_emu_zero(int t) {
    if (!usable("tilezero", t, 0)) return;
    memset(st.data[t], 0, sizeof st.data[t]);
}

/* bf16 as fp32 (make_fp32), a denormal read as a zero of its sign (DAZ) */
static double bf16_daz(uint16_t h) {
    if (!(h & 0x7F80u)) h &= 0x8000u;
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float f32_daz(float f) { return fpclassify(f) == FP_SUBNORMAL ? copysignf(0.0f, f) : f; }

/* x (exact, or rounded to double, which is innocuous here) rounded to fp32, nearest even; a result
 * that rounds below FLT_MIN with an unbounded exponent is a zero of its sign (FTZ). */
static float round_ftz(double x) {
    if (!(fabs(x) < 0x1p-126)) return (float)x; /* normal, infinite, NaN */
    if (x == 0) return (float)x;
    const float up = (float)(x * 0x1p100); /* exact scaling: rounds at 24 bits, exponent unbounded */
    return fabsf(up) < 0x1p-26f ? copysignf(0.0f, (float)x) : copysignf(FLT_MIN, (float)x);
}

void ctrl_amx_emu_dpbf16ps(int c, int a, int b) {
    if (!usable("tdpbf16ps", c, 1) || !usable("tdpbf16ps", a, 1) || !usable("tdpbf16ps", b, 1)) return;
    if ((c == a || c == b || a == b) && fault("tdpbf16ps: tiles %d, %d, %d are not distinct", c, a, b))
        return;
    if ((st.colsb[c] % 4 || st.colsb[a] % 4 || st.colsb[b] % 4) &&
        fault("tdpbf16ps: bytes a row %d, %d, %d not all multiples of 4", st.colsb[c], st.colsb[a],
              st.colsb[b]))
        return;
    if (st.colsb[c] != st.colsb[b] &&
        fault("tdpbf16ps: dest colsb %d != src2 colsb %d", st.colsb[c], st.colsb[b]))
        return;
    if (st.colsb[a] / 4 != st.rows[b] &&
        fault("tdpbf16ps: src1 colsb / 4 = %d != src2 rows %d", st.colsb[a] / 4, st.rows[b]))
        return;
    if (st.rows[c] != st.rows[a] && fault("tdpbf16ps: dest rows %d != src1 rows %d", st.rows[c], st.rows[a]))
        return;
    const int npairs = st.colsb[a] / 4, ncols = st.colsb[c] / 4;
    double bv[CTRL_AMX_MAX_ROWS][CTRL_AMX_MAX_COLSB / 2]; /* b's values, widened once */
    for (int k = 0; k < npairs; k++)
        for (int j = 0; j < 2 * ncols; j++)
            bv[k][j] = bf16_daz(((const uint16_t *)(const void *)st.data[b][k])[j]);
    for (int m = 0; m < st.rows[c]; m++) {
        float even[CTRL_AMX_MAX_COLSB / 4] = {0}, odd[CTRL_AMX_MAX_COLSB / 4] = {0};
        const uint16_t *ar = (const uint16_t *)(const void *)st.data[a][m];
        for (int k = 0; k < npairs; k++) {
            const double a0 = bf16_daz(ar[2 * k]), a1 = bf16_daz(ar[2 * k + 1]);
            for (int n = 0; n < ncols; n++) {
                even[n] = round_ftz((double)even[n] + a0 * bv[k][2 * n]);
                odd[n] = round_ftz((double)odd[n] + a1 * bv[k][2 * n + 1]);
            }
        }
        float *cr = (float *)(void *)st.data[c][m];
        for (int n = 0; n < ncols; n++) {
            const float pair = round_ftz((double)even[n] + odd[n]);
            cr[n] = round_ftz((double)f32_daz(cr[n]) + pair);
        }
        /* write_row_and_zero: the bytes past colsb are 0 */
        memset(st.data[c][m] + st.colsb[c], 0, CTRL_AMX_MAX_COLSB - st.colsb[c]);
    }
    for (int m = st.rows[c]; m < CTRL_AMX_MAX_ROWS; m++) memset(st.data[c][m], 0, CTRL_AMX_MAX_COLSB);
}
