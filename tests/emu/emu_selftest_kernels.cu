// Kernels for the emulator's own test (test_cuda_emu.c): correct ones, and deliberately broken
// ones that the emulator must expose. Host wrappers take host pointers and return a cudaError_t.
#include <cuda_runtime.h>
#include <ctrl_emu_ptx.h>

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

// One mma.sync m16n8k16 (bf16 in, fp32 accumulate) of D = A (16x16) B (16x8) + C, every lane
// building its fragments from global memory by the PTX ISA's layout, written out here on its own
// (not through the emulator's): groupID g = lane / 4, t = lane % 4. With `swap` the lanes put A's
// rows g+8 where its columns 2t+8 belong (a[1] and a[2] exchanged): the layout bug to catch.
// With `half`, only lanes 0..15 execute it (the emulator must report the partial warp).
__global__ void mma_tile(const uint16_t *A, const uint16_t *B, const float *C, float *D, int swap, int half) {
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    if (half && l >= 16) return;
    auto pair = [](const uint16_t *p, int i, int j) { return (uint32_t)p[i] | (uint32_t)p[j] << 16; };
    uint32_t a[4] = {pair(A, g * 16 + 2 * t, g * 16 + 2 * t + 1),
                     pair(A, (g + 8) * 16 + 2 * t, (g + 8) * 16 + 2 * t + 1),
                     pair(A, g * 16 + 2 * t + 8, g * 16 + 2 * t + 9),
                     pair(A, (g + 8) * 16 + 2 * t + 8, (g + 8) * 16 + 2 * t + 9)};
    if (swap) {
        const uint32_t x = a[1];
        a[1] = a[2], a[2] = x;
    }
    const uint32_t b[2] = {pair(B, 2 * t * 8 + g, (2 * t + 1) * 8 + g),
                           pair(B, (2 * t + 8) * 8 + g, (2 * t + 9) * 8 + g)};
    const float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                        C[(g + 8) * 8 + 2 * t + 1]};
    float d[4];
    ptx_mma_m16n8k16_bf16(d, a, b, c);
    D[g * 8 + 2 * t] = d[0], D[g * 8 + 2 * t + 1] = d[1], D[(g + 8) * 8 + 2 * t] = d[2],
                  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// ldmatrix.x4 and .x4.trans of a 16x16 tile of 16-bit values staged in shared memory, with the row
// addresses a kernel uses for an A fragment (plain) and for B fragments of a [k][n] tile (trans);
// each lane writes its 4 + 4 registers. `misalign` offsets every address by one element.
__global__ void ldmatrix_tile(const uint16_t *M, uint32_t *out, int misalign) {
    __shared__ uint4 sh[16 * 16 / 8 + 1]; // 16-byte aligned rows
    uint16_t *sm = reinterpret_cast<uint16_t *>(sh);
    const int l = threadIdx.x;
    for (int i = l; i < 256; i += 32) sm[i] = M[i];
    __syncthreads();
    uint32_t r[4], rt[4];
    ptx_ldmatrix_x4(r, sm + (l % 16) * 16 + 8 * (l / 16) + misalign);
    ptx_ldmatrix_x4_trans(rt, sm + (l % 8 + 8 * (l / 8 % 2)) * 16 + 8 * (l / 16) + misalign);
    for (int i = 0; i < 4; i++) out[l * 8 + i] = r[i], out[l * 8 + 4 + i] = rt[i];
}

// Each lane copies 16 bytes into shared memory by cp.async, then (after cp.async.wait_group 0 when
// `wait`, else straight away) the block reads its neighbour lane's copy: without the wait the copy
// has not landed (the bug to catch).
__global__ void cp_async_tile(const uint4 *src, uint4 *dst, int wait) {
    __shared__ uint4 sh[32];
    const int l = threadIdx.x;
    sh[l] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    ptx_cp_async_16(&sh[l], &src[l]);
    ptx_cp_async_commit();
    if (wait) ptx_cp_async_wait<0>();
    __syncthreads();
    dst[l] = sh[(l + 1) % 32];
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

extern "C" int emu_mma_tile(const uint16_t *A, const uint16_t *B, const float *C, float *D, int swap,
                            int half) {
    uint16_t *da = upload(A, 256), *db = upload(B, 128);
    float *dc = upload(C, 128), *dd = upload<float>(nullptr, 128);
    mma_tile<<<1, 32>>>(da, db, dc, dd, swap, half);
    int err = cudaGetLastError();
    download(D, dd, 128);
    cudaFree(da), cudaFree(db), cudaFree(dc);
    return err;
}

extern "C" int emu_ldmatrix_tile(const uint16_t *M, uint32_t *out, int misalign) {
    uint16_t *dm = upload(M, 256);
    uint32_t *dout = upload<uint32_t>(nullptr, 256);
    ldmatrix_tile<<<1, 32>>>(dm, dout, misalign);
    int err = cudaGetLastError();
    download(out, dout, 256);
    cudaFree(dm);
    return err;
}

extern "C" int emu_cp_async_tile(const unsigned *src, unsigned *dst, int wait) {
    uint4 *ds = upload(reinterpret_cast<const uint4 *>(src), 32), *dd = upload<uint4>(nullptr, 32);
    cp_async_tile<<<1, 32>>>(ds, dd, wait);
    int err = cudaGetLastError();
    download(reinterpret_cast<uint4 *>(dst), dd, 32);
    cudaFree(ds);
    return err;
}
