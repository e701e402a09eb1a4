// The warp-level tensor-core instructions (and the asynchronous copies feeding them) of the flash plugin's
// mma path (flash_cuda_mma.cu), as small device functions over inline PTX (sm_80+). Under the CUDA emulator
// the same names come from kernels/cuda/emu/include/ctrl_emu_ptx.h, which documents the per-lane fragment
// layouts (the PTX ISA's) that both follow.
#ifndef CTRL_FLASH_CUDA_PTX_CUH
#define CTRL_FLASH_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#ifdef CTRL_CUDA_EMU
#include <ctrl_emu_ptx.h>
#else

// d = a * b + c: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (d may alias c).
__device__ __forceinline__ void ptx_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                      const float c[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: `row` is this lane's row address in shared memory.
__device__ __forceinline__ void ptx_ldmatrix_x4(uint32_t r[4], const void *row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16.
__device__ __forceinline__ void ptx_ldmatrix_x4_trans(uint32_t r[4], const void *row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// cp.async.cg.shared.global [smem], [gmem], 16 (both 16-byte aligned), then commit_group and
// wait_group N (every committed group but the newest N has landed in shared memory).
__device__ __forceinline__ void ptx_cp_async_16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void ptx_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void ptx_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 2^x (ex2.approx.ftz.f32: about 2 ulp; -inf gives 0).
__device__ __forceinline__ float ptx_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Two floats as a bf16x2 register, round to nearest even, lo in the low half.
__device__ __forceinline__ uint32_t ptx_pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

#endif
#endif
