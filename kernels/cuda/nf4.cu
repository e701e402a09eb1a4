// QLoRA's NF4 weights on the device (core/model/nf4.h: bitsandbytes' nf4, blocks of 64,
// double-quantized absmax). The products the model runs with them (nf4_gemm: out = x W^T and
// dx = dout W, W [OUT, IN] held in NF4) dequantize W a tile at a time into shared memory inside the
// GEMM, never the whole weight, as the CPU's gemm_nf4.c does; nf4_dequant writes whole values (tests,
// and a layer dequantized for comparison). The dequantization is ctrl_nf4_absmax +
// ctrl_nf4_dequantize's arithmetic, each operation rounded on its own (no fused multiply-add:
// __fmul_rn / __fadd_rn), so the values are the CPU's bit for bit; the products accumulate in fp32
// in k order (the CPU's GEMM sums in its own order: equal within fp32 rounding).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "cuda/launch.h"
#include "device/cuda_check.h"

namespace {

#ifdef CTRL_EMU_CUDA_RUNTIME_H /* the emulator (host C++): a volatile keeps the product rounded */
__device__ inline float mul_rn(float a, float b) {
    volatile float p = a * b;
    return p;
}
__device__ inline float add_rn(float a, float b) {
    volatile float s = a + b;
    return s;
}
#else
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
#endif

// One thread per byte: its two values (the first in the high nibble), of the same block of 64.
__global__ void nf4_dequant(float *out, const uint8_t *packed, const uint8_t *qabsmax, const float *absmax2,
                            float offset, const float *code, const float *dynamic, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; 2 * i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t v = 2 * i, b = v / 64;
        const float s = add_rn(mul_rn(dynamic[qabsmax[b]], absmax2[b / 256]), offset);
        const uint8_t byte = packed[i];
        out[v] = mul_rn(code[byte >> 4], s);
        if (v + 1 < n) out[v + 1] = mul_rn(code[byte & 0xF], s);
    }
}

// W's value at flat index f
__device__ inline float nf4_value(const uint8_t *packed, const uint8_t *qabsmax, const float *absmax2,
                                  float offset, const float *code, const float *dynamic, int64_t f) {
    const int64_t b = f / 64;
    const float s = add_rn(mul_rn(dynamic[qabsmax[b]], absmax2[b / 256]), offset);
    const uint8_t byte = packed[f / 2];
    return mul_rn(code[f % 2 ? byte & 0xF : byte >> 4], s);
}

__device__ inline float as_bf16(float v, int bf16) {
    return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

constexpr int TM = 64, TN = 64,
              TK = 16; // a block's tile of C and the depth of a step; 16 x 16 threads, 4 x 4 each

// C[M, N] = A[M, K] B (+ bias[N]), B's element (k, n) = W at flat index f0 + n * sn + k * sk (f0: where W
// starts in the quantized tensor, a row block of a fused one; the forward:
// B = W^T, sn = IN, sk = 1; the backward's dX: B = W, sn = 1, sk = IN). Each step dequantizes a TK x TN
// tile of B into shared memory beside A's TM x TK tile (both rounded to bf16 where bf16 says).
__global__ void nf4_gemm(float *C, const float *A, const uint8_t *packed, const uint8_t *qabsmax,
                         const float *absmax2, float offset, const float *code, const float *dynamic,
                         const float *bias, int M, int N, int K, int64_t f0, int64_t sn, int64_t sk,
                         int bf16) {
    __shared__ float as[TK][TM + 1], bs[TK][TN + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int e = threadIdx.x; e < TM * TK; e += 256) { // A's tile: row m, depth k
            const int m = e / TK, k = e % TK;
            as[k][m] = m0 + m < M && k0 + k < K ? as_bf16(A[(int64_t)(m0 + m) * K + k0 + k], bf16) : 0.0f;
        }
        for (int e = threadIdx.x; e < TK * TN; e += 256) { // B's tile, dequantized; neighbouring threads
            const int k = sk == 1 ? e % TK : e / TN, n = sk == 1 ? e / TK : e % TN; // read neighbouring bytes
            bs[k][n] = n0 + n < N && k0 + k < K
                           ? as_bf16(nf4_value(packed, qabsmax, absmax2, offset, code, dynamic,
                                               f0 + (int64_t)(n0 + n) * sn + (int64_t)(k0 + k) * sk),
                                     bf16)
                           : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < TK; k++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(as[k][ty + 16 * i], bs[k][tx + 16 * j], acc[i][j]);
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            const int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (m < M && n < N) C[(int64_t)m * N + n] = acc[i][j] + (bias ? bias[n] : 0.0f);
        }
}

} // namespace

extern "C" ctrl_status ctrl_cuda_nf4_linear(float *out, const float *in, const uint8_t *packed,
                                            const uint8_t *qabsmax, const float *absmax2, float offset,
                                            const float *code, const float *dynamic, int64_t first,
                                            const float *bias, int T, int IN, int OUT, int backward,
                                            int bf16) {
    if (T <= 0 || IN <= 0 || OUT <= 0) return CTRL_OK;
    const int N = backward ? IN : OUT, K = backward ? OUT : IN;
    const dim3 grid((unsigned)((N + TN - 1) / TN), (unsigned)((T + TM - 1) / TM));
    nf4_gemm<<<grid, 256>>>(out, in, packed, qabsmax, absmax2, offset, code, dynamic, backward ? NULL : bias,
                            T, N, K, first, backward ? 1 : IN, backward ? IN : 1, bf16);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_nf4_dequantize(float *out, const uint8_t *packed, const uint8_t *qabsmax,
                                                const float *absmax2, float offset, const float *code,
                                                const float *dynamic, int64_t n) {
    if (n <= 0) return CTRL_OK;
    const int64_t bytes = (n + 1) / 2;
    nf4_dequant<<<ctrl_grid_for(bytes, 256), 256>>>(out, packed, qabsmax, absmax2, offset, code, dynamic, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}
