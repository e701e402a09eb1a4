/* ctrl's CUDA emulator: the warp-level matrix instructions that kernels reach through inline PTX
 * (on a GPU: plugins/attention/flash/flash_cuda_ptx.cuh), as device functions of the same names
 * and the same per-lane register layouts as the PTX ISA ("Matrix Fragments for mma.m16n8k16",
 * "Warp-level matrix load instruction: ldmatrix"). Each is a warp collective (ctrl_emu::warp_apply):
 * all 32 lanes must execute it; the result is computed from every lane's operands at once.
 *
 * Notation of the PTX ISA: groupID = lane >> 2, threadID_in_group = lane % 4; a .b32 register
 * holding two bf16 keeps the lower-indexed element in its low 16 bits.
 *
 *  mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32  D = A (16x16) * B (16x8) + C (16x8)
 *    A: a[0] = (row g, cols 2t, 2t+1)      a[1] = (row g+8, cols 2t, 2t+1)
 *       a[2] = (row g, cols 2t+8, 2t+9)    a[3] = (row g+8, cols 2t+8, 2t+9)
 *    B: b[0] = (rows 2t, 2t+1; col g)      b[1] = (rows 2t+8, 2t+9; col g)
 *    C, D: c[0], c[1] = (row g, cols 2t, 2t+1)   c[2], c[3] = (row g+8, cols 2t, 2t+1)
 *  ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: four 8x8 matrices of 16-bit elements; lanes
 *    8i..8i+7 give the addresses of rows 0..7 of matrix i (16-byte aligned); register i of lane l
 *    receives matrix i's (row l/4, cols 2(l%4), 2(l%4)+1), or with .trans its (rows 2(l%4),
 *    2(l%4)+1; col l/4).
 *  cp.async.cg.shared.global (16 bytes), commit_group, wait_group N: each thread's copies land in
 *    shared memory only when that thread waits for their group (ctrl_emu::cp_async).
 *
 * Arithmetic: bf16 products are exact in fp32; the emulated mma adds them to C in fp32 in k order
 * (a tensor core's internal order and rounding differ in the last bits). */
#ifndef CTRL_EMU_PTX_H
#define CTRL_EMU_PTX_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

namespace ctrl_emu {

inline float bf16_lo(uint32_t r) {
    const uint32_t u = r << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float bf16_hi(uint32_t r) {
    const uint32_t u = r & 0xffff0000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float bf16_half(uint32_t r, int hi) { return hi ? bf16_hi(r) : bf16_lo(r); }

struct MmaLane {
    uint32_t a[4], b[2];
    float c[4], d[4];
};

inline void mma_m16n8k16_apply(void *const *lanes) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const MmaLane *x = static_cast<const MmaLane *>(lanes[l]);
        const int g = l >> 2, t = l & 3;
        for (int e = 0; e < 2; e++) {
            A[g][2 * t + e] = bf16_half(x->a[0], e);
            A[g + 8][2 * t + e] = bf16_half(x->a[1], e);
            A[g][2 * t + 8 + e] = bf16_half(x->a[2], e);
            A[g + 8][2 * t + 8 + e] = bf16_half(x->a[3], e);
            B[2 * t + e][g] = bf16_half(x->b[0], e);
            B[2 * t + 8 + e][g] = bf16_half(x->b[1], e);
            C[g][2 * t + e] = x->c[e];
            C[g + 8][2 * t + e] = x->c[2 + e];
        }
    }
    for (int l = 0; l < 32; l++) {
        MmaLane *x = static_cast<MmaLane *>(lanes[l]);
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) {
            const int r = g + (i >> 1) * 8, c = 2 * t + (i & 1);
            float acc = C[r][c];
            for (int k = 0; k < 16; k++) acc += A[r][k] * B[k][c];
            x->d[i] = acc;
        }
    }
}

struct LdmatrixLane {
    const uint16_t *row;
    uint32_t r[4];
};

template <bool Trans> void ldmatrix_x4_apply(void *const *lanes) {
    const LdmatrixLane *in[32];
    for (int l = 0; l < 32; l++) {
        in[l] = static_cast<const LdmatrixLane *>(lanes[l]);
        if (reinterpret_cast<uintptr_t>(in[l]->row) % 16 != 0) {
            emu_fail("ldmatrix: a row address is not 16-byte aligned (misaligned address on a GPU)");
            return;
        }
    }
    uint32_t out[32][4];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        for (int m = 0; m < 4; m++) {
            // the rows of matrix m are the addresses of lanes 8m .. 8m + 7
            uint16_t lo, hi;
            if (Trans) {
                lo = in[8 * m + 2 * t]->row[g], hi = in[8 * m + 2 * t + 1]->row[g];
            } else {
                lo = in[8 * m + g]->row[2 * t], hi = in[8 * m + g]->row[2 * t + 1];
            }
            out[l][m] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
    for (int l = 0; l < 32; l++) memcpy(static_cast<LdmatrixLane *>(lanes[l])->r, out[l], sizeof out[l]);
}

} // namespace ctrl_emu

/* d = a * b + c (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32); d may alias c. */
inline void ptx_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    ctrl_emu::MmaLane x;
    memcpy(x.a, a, sizeof x.a), memcpy(x.b, b, sizeof x.b), memcpy(x.c, c, sizeof x.c);
    ctrl_emu::warp_apply(&x, ctrl_emu::mma_m16n8k16_apply);
    memcpy(d, x.d, sizeof x.d);
}

/* ldmatrix.sync.aligned.m8n8.x4.shared.b16: `row` is this lane's row address (see above). */
inline void ptx_ldmatrix_x4(uint32_t r[4], const void *row) {
    ctrl_emu::LdmatrixLane x{static_cast<const uint16_t *>(row), {0, 0, 0, 0}};
    ctrl_emu::warp_apply(&x, ctrl_emu::ldmatrix_x4_apply<false>);
    memcpy(r, x.r, sizeof x.r);
}

/* ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16. */
inline void ptx_ldmatrix_x4_trans(uint32_t r[4], const void *row) {
    ctrl_emu::LdmatrixLane x{static_cast<const uint16_t *>(row), {0, 0, 0, 0}};
    ctrl_emu::warp_apply(&x, ctrl_emu::ldmatrix_x4_apply<true>);
    memcpy(r, x.r, sizeof x.r);
}

/* cp.async.cg.shared.global [smem], [gmem], 16: issued now, landed by the wait below. */
inline void ptx_cp_async_16(void *smem, const void *gmem) { ctrl_emu::cp_async(smem, gmem, 16); }
/* cp.async.commit_group: the copies issued since the last commit form a group. */
inline void ptx_cp_async_commit() { ctrl_emu::cp_async_commit(); }
/* cp.async.wait_group N: every committed group but the newest N has landed. */
template <int N> inline void ptx_cp_async_wait() { ctrl_emu::cp_async_wait(N); }

/* ex2.approx.ftz.f32: 2^x (the device's is within about 2 ulp of this). */
inline float ptx_exp2(float x) { return exp2f(x); }

/* Two floats as a bf16x2 register (round to nearest even): lo in the low half (cvt.rn.bf16x2.f32). */
inline uint32_t ptx_pack_bf16x2(float lo, float hi) {
    return (uint32_t)__float2bfloat16_rn(lo).bits | (uint32_t)__float2bfloat16_rn(hi).bits << 16;
}

#endif
