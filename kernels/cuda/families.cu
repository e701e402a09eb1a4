// The model families' ops on the GPU (issue 22; cpu_ops.h's namesakes, which they match): GeGLU with
// torch's tanh-GELU (Gemma), partial rotary embeddings (Phi-3/4's partial_rotary_factor), and the
// mixture-of-experts row ops (gather the tokens routed to an expert into one block, scatter the expert
// outputs back weighted, the routing weights' gradient as one dot product a row). The (1 + w) RMSNorm
// is rmsnorm.cu's kernel with an offset.
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "cuda/launch.h"
#include "device/cuda_check.h"

namespace {

constexpr float kGeluK = 0.7978845608028654f; // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

__global__ void geglu_fwd(float *out, const float *g, const float *u, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float x = g[i], t = tanhf(kGeluK * (x + kGeluC * x * x * x));
        out[i] = 0.5f * x * (1.0f + t) * u[i];
    }
}

__global__ void geglu_bwd(float *dg, float *du, const float *dout, const float *g, const float *u,
                          int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float x = g[i], t = tanhf(kGeluK * (x + kGeluC * x * x * x));
        const float act = 0.5f * x * (1.0f + t),
                    dact = 0.5f * (1.0f + t) +
                           0.5f * x * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
        du[i] = dout[i] * act;
        dg[i] = dout[i] * u[i] * dact;
    }
}

// Partial rotary: the pairs (j, j + R/2) of the first R dimensions of each head rotate by sign x the
// angle (tables of R/2 columns); dimensions R..D pass through (copied when out is not x).
__global__ void rope_partial_kernel(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                    const float *sin_tab, int T, int H, int D, int R, float sign) {
    const int half = R / 2, pass = D - R, per = half + pass;
    const int64_t n = (int64_t)T * H * per;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t th = i / per, t = th / H;
        const int j = (int)(i % per);
        const float *xi = x + th * D;
        float *o = out + th * D;
        if (j >= half) { // a dimension that does not rotate
            if (o != xi) o[R + j - half] = xi[R + j - half];
            continue;
        }
        const float c = cos_tab[(int64_t)pos[t] * half + j], s = sign * sin_tab[(int64_t)pos[t] * half + j];
        const float a = xi[j], b = xi[j + half];
        o[j] = a * c - b * s;
        o[j + half] = b * c + a * s;
    }
}

__global__ void gather_rows_kernel(float *out, const float *x, const int32_t *rows, const float *scale, int n,
                                   int C) {
    const int64_t total = (int64_t)n * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / C, c = i % C;
        const float v = x[(int64_t)rows[r] * C + c];
        out[i] = scale ? scale[r] * v : v;
    }
}

// One thread per channel walks the rows in order: a row that repeats accumulates in the order of i, as
// the CPU's, without atomics and whatever the scheduling.
__global__ void scatter_add_rows_kernel(float *out, const float *y, const int32_t *rows, const float *scale,
                                        int n, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int i = 0; i < n; i++) {
        const float v = y[(int64_t)i * C + c];
        out[(int64_t)rows[i] * C + c] += scale ? v * scale[i] : v;
    }
}

// One warp a row, the dot product accumulated in double as the CPU's.
__global__ void rows_dot_kernel(float *out, const float *x, const int32_t *rows, const float *y, int n,
                                int C) {
    const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (r >= n) return;
    const float *xr = x + (int64_t)rows[r] * C, *yr = y + (int64_t)r * C;
    double s = 0;
    for (int c = lane; c < C; c += 32) s += (double)xr[c] * yr[c];
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) out[r] = (float)s;
}

ctrl_status rope_partial(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                         const float *sin_tab, int T, int n_head, int head_dim, int rot_dim, float sign) {
    const int64_t n = (int64_t)T * n_head * (head_dim - rot_dim / 2);
    if (n > 0)
        rope_partial_kernel<<<ctrl_grid_for(n, 256), 256>>>(out, x, pos, cos_tab, sin_tab, T, n_head,
                                                            head_dim, rot_dim, sign);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

} // namespace

extern "C" ctrl_status ctrl_cuda_geglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    if (n > 0) geglu_fwd<<<ctrl_grid_for(n, 256), 256>>>(out, gate, up, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_geglu_backward(float *dgate, float *dup, const float *dout,
                                                const float *gate, const float *up, int64_t n) {
    if (n > 0) geglu_bwd<<<ctrl_grid_for(n, 256), 256>>>(dgate, dup, dout, gate, up, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_rope_partial_forward(float *out, const float *x, const int32_t *pos,
                                                      const float *cos_tab, const float *sin_tab, int T,
                                                      int n_head, int head_dim, int rot_dim) {
    return rope_partial(out, x, pos, cos_tab, sin_tab, T, n_head, head_dim, rot_dim, 1.0f);
}

extern "C" ctrl_status ctrl_cuda_rope_partial_backward(float *dx, const float *dout, const int32_t *pos,
                                                       const float *cos_tab, const float *sin_tab, int T,
                                                       int n_head, int head_dim, int rot_dim) {
    return rope_partial(dx, dout, pos, cos_tab, sin_tab, T, n_head, head_dim, rot_dim, -1.0f);
}

extern "C" ctrl_status ctrl_cuda_gather_rows(float *out, const float *x, const int32_t *rows,
                                             const float *scale, int n, int C) {
    if ((int64_t)n * C > 0)
        gather_rows_kernel<<<ctrl_grid_for((int64_t)n * C, 256), 256>>>(out, x, rows, scale, n, C);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_scatter_add_rows(float *out, const float *y, const int32_t *rows,
                                                  const float *scale, int n, int C) {
    if (n > 0 && C > 0) scatter_add_rows_kernel<<<(C + 127) / 128, 128>>>(out, y, rows, scale, n, C);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_rows_dot(float *out, const float *x, const int32_t *rows, const float *y,
                                          int n, int C) {
    if (n > 0) rows_dot_kernel<<<(n + 7) / 8, 256>>>(out, x, rows, y, n, C);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}
