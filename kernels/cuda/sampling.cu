// Sampling on the device (core/device/sample_batch.h): one block per drawn token runs the logits
// processing and the draw of core/generate/sampling.c on its logits row, which never leaves the
// device; the row's token and log-probability (and its top log-probabilities) are what come back.
//
// The same arithmetic as the host sampler wherever it decides something: each probability is the
// host's ctrl_exp_approx written with single rounded operations (never contracted into an FMA), so
// it is the host's value bit for bit; temperature, penalties and min-p compare and round as the host
// does; top-k is the exact k-th largest value (a radix select over the values' ordered bits), so its
// ties stay as on the host. What differs is the order of summation: the normaliser and the inverse
// CDF are summed in double over a fixed partition (deterministic, not the host's order), and top-p's
// cumulative masses in 2^-60 fixed point (exact integer sums). So a seeded draw gives the host's
// token unless u falls within ~1e-13 of a boundary of the CDF, and top-p keeps or drops a whole tie
// group where the host's unstable sort may split it; log-probabilities agree within ~1e-6.
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>

#include "cuda/cuda_ops.h"
#include "device/cuda_check.h"
#include "device/sample_batch.h"

namespace {

constexpr int kThreads = 256;
constexpr double kFixed = 1152921504606846976.0; // 2^60: top-p's masses in fixed point

// include/ctrl/exp_approx.h's ctrl_exp_approx, one rounded operation at a time (the host builds
// with contraction off), so that each probability is the host's to the bit.
__device__ __forceinline__ float exp_approx(float x) {
    x = x < -87.33654f ? -87.33654f : x;
    x = x > 88.37626f ? 88.37626f : x;
    const float shifted = __fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f);
    const float n = __fsub_rn(shifted, 12582912.0f);
    float r = __fsub_rn(x, __fmul_rn(n, 0.693359375f));
    r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
    float p = 1.9875691500e-4f;
    p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
    p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
    p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
    p = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
    const unsigned bits = (__float_as_uint(shifted) - 0x4B400000u + 127u) << 23;
    return __fmul_rn(p, __uint_as_float(bits));
}

// exp(x) for a log-probability (sampling.c's prob): -inf gives 0
__device__ __forceinline__ float prob(float x) { return x == -INFINITY ? 0.0f : exp_approx(x); }

// a float's bits as an unsigned integer in the order of the values (-inf lowest)
__device__ __forceinline__ unsigned order_key(float x) {
    const unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float from_key(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

struct Scratch {
    double d[kThreads];
    float f[kThreads];
    int i[kThreads];
    unsigned long long mass[256];
    unsigned count[256];
    unsigned sel;
    unsigned long long below;
    int found;
};

// v reduced over the block by op over a fixed tree (the same result whatever order the threads run
// in), in the shared buf[kThreads]
template <typename T, typename Op> __device__ __forceinline__ T block_reduce(T *buf, T v, Op op) {
    const int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (int h = kThreads / 2; h > 0; h /= 2) {
        if (t < h) buf[t] = op(buf[t], buf[t + h]);
        __syncthreads();
    }
    const T r = buf[0];
    __syncthreads();
    return r;
}

struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
    __device__ double operator()(double a, double b) const { return a + b; }
};

__device__ __forceinline__ float block_max(Scratch &s, float v) { return block_reduce(s.f, v, MaxOp()); }
__device__ __forceinline__ double block_sum(Scratch &s, double v) { return block_reduce(s.d, v, SumOp()); }

// the index of the largest value (the lowest index among equal ones; -1 when every index is -1)
__device__ __forceinline__ int block_argmax(Scratch &s, float v, int i) {
    const int t = threadIdx.x;
    s.f[t] = v, s.i[t] = i;
    __syncthreads();
    for (int h = kThreads / 2; h > 0; h /= 2) {
        if (t < h) {
            const float w = s.f[t + h];
            const int j = s.i[t + h];
            if (j >= 0 && (s.i[t] < 0 || w > s.f[t] || (w == s.f[t] && j < s.i[t]))) s.f[t] = w, s.i[t] = j;
        }
        __syncthreads();
    }
    const int r = s.i[0];
    __syncthreads();
    return r;
}

// log-sum-exp of l[V] as sampling.c's logsumexp: the float maximum, probabilities of l - max
__device__ __forceinline__ double row_lse(Scratch &s, const float *l, int V) {
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += kThreads) mx = fmaxf(mx, l[i]);
    mx = block_max(s, mx);
    if (mx == -INFINITY) return -INFINITY;
    double sum = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) sum += prob(__fsub_rn(l[i], mx));
    return (double)mx + log(block_sum(s, sum));
}

// top-k: the k-th largest value by a radix select over the ordered bits, 8 bits a pass; below it goes
__device__ __forceinline__ void top_k_filter(Scratch &s, float *l, int V, int k) {
    const int t = threadIdx.x;
    unsigned prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        s.count[t] = 0;
        __syncthreads();
        for (int i = t; i < V; i += kThreads) {
            const unsigned key = order_key(l[i]);
            if ((key & mask) == prefix) atomicAdd(&s.count[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (t == 0) { // from the largest digit down to the one holding the k-th
            unsigned b = 255;
            while (b > 0 && (unsigned)k > s.count[b]) k -= (int)s.count[b--];
            s.sel = b, s.found = k;
        }
        __syncthreads();
        prefix |= s.sel << shift, mask |= 255u << shift, k = s.found;
        __syncthreads();
    }
    const float kth = from_key(prefix);
    for (int i = t; i < V; i += kThreads)
        if (l[i] < kth) l[i] = -INFINITY;
    __syncthreads();
}

// top-p as sampling.c's top_p_filter: in ascending order, the values whose cumulative probability
// stays <= 1 - top_p go; the radix select finds the first value past that mass
__device__ __forceinline__ void top_p_filter(Scratch &s, float *l, int V, float top_p) {
    const int t = threadIdx.x;
    const double lse = row_lse(s, l, V);
    const unsigned long long target = (unsigned long long)((1.0 - (double)top_p) * kFixed);
    unsigned prefix = 0, mask = 0;
    unsigned long long below = 0;
    int crossed = 1;
    for (int shift = 24; shift >= 0 && crossed; shift -= 8) {
        s.mass[t] = 0;
        __syncthreads();
        for (int i = t; i < V; i += kThreads) {
            const unsigned key = order_key(l[i]);
            if ((key & mask) != prefix || l[i] == -INFINITY) continue;
            const float p = prob((float)((double)l[i] - lse));
            atomicAdd(&s.mass[(key >> shift) & 255u], (unsigned long long)((double)p * kFixed));
        }
        __syncthreads();
        if (t == 0) { // the lowest digit at which the cumulative mass passes the target
            unsigned b = 0;
            unsigned long long acc = below;
            while (b < 256 && acc + s.mass[b] <= target) acc += s.mass[b++];
            s.found = b < 256, s.sel = b < 256 ? b : 0, s.below = b < 256 ? acc : below;
        }
        __syncthreads();
        crossed = s.found, below = s.below, prefix |= s.sel << shift, mask |= 255u << shift;
        __syncthreads();
    }
    // never crossed (rounding left the whole mass at the target): only the most likely stays
    const unsigned cut = prefix;
    float mx = -INFINITY;
    if (!crossed) {
        for (int i = t; i < V; i += kThreads) mx = fmaxf(mx, l[i]);
        mx = block_max(s, mx);
    }
    for (int i = t; i < V; i += kThreads)
        if (crossed ? order_key(l[i]) < cut : l[i] < mx) l[i] = -INFINITY;
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads) sample_kernel(ctrl_sample_batch b, float *work) {
    __shared__ Scratch s;
    const int r = blockIdx.x, t = threadIdx.x, V = b.V;
    const ctrl_sample_row &row = b.rows[r];
    const float *src = b.logits + (size_t)row.src * V;
    float *l = work + (size_t)r * V;
    // the final soft-capping (the decode's), then the logit bias and suppressed stop ids, in order
    for (int i = t; i < V; i += kThreads)
        l[i] = b.softcap > 0 ? b.softcap * tanhf(src[i] / b.softcap) : src[i];
    __syncthreads();
    if (t == 0)
        for (int e = 0; e < row.n_edit; e++) {
            const int id = b.ids[row.edit_at + e];
            if (id >= 0 && id < V) l[id] += b.vals[row.edit_at + e];
        }
    __syncthreads();
    // the repetition penalty over the seen ids, then the completion's presence and frequency
    for (int e = t; e < row.n_seen; e += kThreads) {
        const int id = b.ids[row.seen_at + e];
        const float count = b.vals[row.seen_at + e];
        float x = l[id];
        if (row.repetition_penalty != 1.0f) {
            x = x < 0 ? x * row.repetition_penalty : x / row.repetition_penalty;
            if (x > FLT_MAX) x = FLT_MAX;
        }
        if (count > 0 && (row.presence_penalty != 0 || row.frequency_penalty != 0) && x != -INFINITY)
            x = fmaxf(
                fminf(__fsub_rn(__fsub_rn(x, __fmul_rn(row.frequency_penalty, count)), row.presence_penalty),
                      FLT_MAX),
                -FLT_MAX);
        l[id] = x;
    }
    __syncthreads();
    if (row.temperature > 0 && row.temperature != 1.0f)
        for (int i = t; i < V; i += kThreads) l[i] = fminf(l[i] / row.temperature, FLT_MAX);
    __syncthreads();
    if (row.top_k > 0 && row.top_k < V) top_k_filter(s, l, V, row.top_k);
    if (row.top_p < 1.0f) top_p_filter(s, l, V, row.top_p);
    if (row.min_p > 0) {
        float mx = -INFINITY;
        for (int i = t; i < V; i += kThreads) mx = fmaxf(mx, l[i]);
        mx = block_max(s, mx);
        for (int i = t; i < V; i += kThreads)
            if ((double)l[i] - mx < row.min_p_log) l[i] = -INFINITY;
        __syncthreads();
    }
    const double lse = row_lse(s, l, V);
    int tok;
    if (row.temperature == 0) { // greedy: the first maximum
        float best = -INFINITY;
        int at = -1;
        for (int i = t; i < V; i += kThreads)
            if (at < 0 || l[i] > best) best = l[i], at = i;
        tok = block_argmax(s, best, at);
    } else { // the inverse CDF over contiguous chunks, one a thread: their sums, then the chunk u is in
        const int chunk = (V + kThreads - 1) / kThreads, i0 = t * chunk, i1 = min(V, i0 + chunk);
        double sum = 0;
        int last = -1;
        for (int i = i0; i < i1; i++)
            if (l[i] != -INFINITY) sum += prob((float)((double)l[i] - lse)), last = i;
        s.d[t] = sum, s.i[t] = last;
        __syncthreads();
        if (t == 0) {
            double cum = 0;
            int c = 0, fallback = -1;
            for (; c < kThreads && !(row.u < cum + s.d[c]); c++) {
                cum += s.d[c];
                fallback = s.i[c] >= 0 ? s.i[c] : fallback; // the last possible so far
            }
            int pick = fallback;
            for (int i = c * chunk; c < kThreads && i < min(V, (c + 1) * chunk); i++) {
                if (l[i] == -INFINITY) continue;
                cum += prob((float)((double)l[i] - lse));
                pick = i;
                if (row.u < cum) break;
            }
            s.found = pick < 0 ? 0 : pick;
        }
        __syncthreads();
        tok = s.found;
        __syncthreads();
    }
    if (tok < 0) tok = 0;
    if (t == 0) b.out[r] = ctrl_sample_out{tok, (float)((double)l[tok] - lse)};
    // the top log-probabilities: the next largest after the previous one (equal values: lower id first)
    float prev = INFINITY;
    int prev_id = -1;
    for (int j = 0; j < row.n_top; j++) {
        float best = -INFINITY;
        int at = -1;
        for (int i = t; i < V; i += kThreads) {
            const float x = l[i];
            if (x == -INFINITY || !(x < prev || (x == prev && i > prev_id))) continue;
            if (at < 0 || x > best) best = x, at = i;
        }
        const int id = block_argmax(s, best, at);
        if (t == 0)
            b.out[b.n_rows + row.top_at + j] =
                ctrl_sample_out{id, id < 0 ? -INFINITY : (float)((double)l[id] - lse)};
        if (id < 0) {
            for (int k = j + 1; k < row.n_top && t == 0; k++)
                b.out[b.n_rows + row.top_at + k] = ctrl_sample_out{-1, -INFINITY};
            break;
        }
        prev = l[id], prev_id = id;
    }
}

} // namespace

extern "C" ctrl_status ctrl_cuda_sample(const ctrl_sample_batch *b) {
    if (b->n_rows <= 0) return CTRL_OK;
    float *work = nullptr;
    ctrl_status st = ctrl_cuda_malloc((void **)&work, sizeof(float) * (size_t)b->n_rows * b->V);
    if (st != CTRL_OK) return st;
    sample_kernel<<<b->n_rows, kThreads>>>(*b, work);
    cudaError_t err = cudaGetLastError();
    ctrl_cuda_free(work); // the caching allocator reuses it only after the stream's work before
    if (err != cudaSuccess)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "cuda sample: %s", cudaGetErrorString(err));
    return CTRL_OK;
}
