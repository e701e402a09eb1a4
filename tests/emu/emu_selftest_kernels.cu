// Kernels for the emulator's own test (test_cuda_emu.c): correct ones, and deliberately broken
// ones that the emulator must expose. Host wrappers take host pointers and return a cudaError_t.
#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 256;

// Shared-memory tree sum of each block's slice; with `missing_sync` the barrier between the stores
// and the first reads is left out (the bug this test exists for).
template <bool missing_sync> __global__ void block_sum(const float *x, int n, float *out) {
    __shared__ float buf[kThreads];
    const int t = threadIdx.x, i = blockIdx.x * kThreads + t;
    buf[t] = i < n ? x[i] : 0.0f;
    if (!missing_sync) __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = buf[0];
}

// A warp sum by __shfl_down_sync: only lane 0 ends with the total. `reader` is the lane that
// writes it out: lane 0 is right, any other lane is the lane-dependent bug.
__global__ void warp_sum_down(const float *x, float *out, int reader) {
    float v = x[blockIdx.x * 32 + threadIdx.x];
    for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffffu, v, off);
    if ((int)threadIdx.x == reader) out[blockIdx.x] = v;
}

// Every lane writes: the xor-butterfly sum, lane 5's value within its 16-lane segment, the ballot
// of lane % 3 == 0, and any/all of x > 0.
__global__ void warp_ops(const float *x, float *sum, float *bcast, unsigned *ballot, int *any_all) {
    const int lane = threadIdx.x;
    float v = x[lane], s = v;
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    sum[lane] = s;
    bcast[lane] = __shfl_sync(0xffffffffu, v, 5, 16);
    ballot[lane] = __ballot_sync(0xffffffffu, lane % 3 == 0);
    any_all[lane] = __any_sync(0xffffffffu, v > 0) * 2 + __all_sync(0xffffffffu, v > 0);
}

__global__ void count_atomically(int *counter) { atomicAdd(counter, 1); }

// Half a warp waits in __syncthreads, the other half in a full-warp __syncwarp: neither barrier
// can complete (undefined behaviour on a GPU, a hang at best).
__global__ void divergent_barrier(int *out) {
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncwarp();
    out[threadIdx.x] = 1;
}

template <class T> T *upload(const T *h, size_t n) {
    T *d = nullptr;
    if (cudaMalloc((void **)&d, n * sizeof(T)) != cudaSuccess) return nullptr;
    if (h)
        cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice);
    else
        cudaMemset(d, 0, n * sizeof(T));
    return d;
}

template <class T> void download(T *h, T *d, size_t n) {
    cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost);
    cudaFree(d);
}

} // namespace

extern "C" int emu_block_sum(const float *x, int n, float *out, int missing_sync) {
    const int blocks = (n + kThreads - 1) / kThreads;
    float *dx = upload(x, n), *dout = upload<float>(nullptr, blocks);
    if (missing_sync)
        block_sum<true><<<blocks, kThreads>>>(dx, n, dout);
    else
        block_sum<false><<<blocks, kThreads>>>(dx, n, dout);
    int err = cudaGetLastError();
    download(out, dout, blocks);
    cudaFree(dx);
    return err;
}

extern "C" int emu_warp_sum_down(const float *x, int warps, float *out, int reader) {
    float *dx = upload(x, (size_t)warps * 32), *dout = upload<float>(nullptr, warps);
    warp_sum_down<<<warps, 32>>>(dx, dout, reader);
    int err = cudaGetLastError();
    download(out, dout, warps);
    cudaFree(dx);
    return err;
}

extern "C" int emu_warp_ops(const float *x, float *sum, float *bcast, unsigned *ballot, int *any_all) {
    float *dx = upload(x, 32), *ds = upload<float>(nullptr, 32), *db = upload<float>(nullptr, 32);
    unsigned *dballot = upload<unsigned>(nullptr, 32);
    int *dany = upload<int>(nullptr, 32);
    warp_ops<<<1, 32>>>(dx, ds, db, dballot, dany);
    int err = cudaGetLastError();
    download(sum, ds, 32), download(bcast, db, 32), download(ballot, dballot, 32),
        download(any_all, dany, 32);
    cudaFree(dx);
    return err;
}

extern "C" int emu_count_atomically(int blocks, int threads, int *count) {
    int *d = upload<int>(nullptr, 1);
    count_atomically<<<blocks, threads>>>(d);
    int err = cudaGetLastError();
    download(count, d, 1);
    return err;
}

extern "C" int emu_divergent_barrier(void) {
    int *d = upload<int>(nullptr, 32);
    divergent_barrier<<<1, 32>>>(d);
    int err = cudaGetLastError();
    cudaFree(d);
    return err;
}
