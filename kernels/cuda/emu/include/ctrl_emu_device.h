/* ctrl's CUDA emulator, device side (C++ only): what a kernel body sees. Every CUDA thread of a
 * block is a fiber; the scheduler (emu_runtime.cpp) runs them one at a time on the calling host
 * thread, in an order shuffled by a seeded generator between synchronisation points, so a
 * missing __syncthreads or a race shows up as a wrong result instead of passing by luck. */
#ifndef CTRL_EMU_DEVICE_H
#define CTRL_EMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
/* Blocks run one after another on one host thread, so a function-local static is exactly one
 * copy per block at a time, which is what __shared__ means. */
#define __shared__ static thread_local

struct uint3 {
    unsigned x, y, z;
};
/* CUDA's 16-byte vector types (vector_types.h), for 128-bit loads and stores. */
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* Set by the scheduler before it switches to a fiber. */
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
static const int warpSize = 32;

namespace ctrl_emu {

enum Collective { kSyncWarp, kShflIdx, kShflXor, kShflDown, kShflUp, kBallot, kAny, kAll, kApply };

/* Block-wide barrier; the calling fiber waits for every thread of the block still running. */
void sync_block();
/* One warp-wide exchange: every live lane of the warp contributes `value`; the result is computed
 * when the last one arrives (see emu_runtime.cpp for each kind's rule). */
uint64_t warp_collective(Collective kind, unsigned mask, uint64_t value, int arg, int width);

/* A warp-wide instruction that needs every lane's operands at once (mma.sync, ldmatrix;
 * ctrl_emu_ptx.h): each of the warp's 32 lanes passes a pointer to its own operands and results;
 * when the last one arrives, apply(lanes) runs once with the 32 pointers in lane order and the
 * lanes go on. All 32 lanes must execute the same instruction (.aligned), else the launch fails. */
void warp_apply(void *lane_data, void (*apply)(void *const *lanes));
/* cp.async (ctrl_emu_ptx.h): a copy of `bytes` from global to shared memory issued by the calling
 * thread; it lands when the thread waits for its group (cp_async_wait: every committed group but
 * the newest `keep`), so a read before the wait sees the old contents, as a race on a GPU may. */
void cp_async(void *dst, const void *src, int bytes);
void cp_async_commit();
void cp_async_wait(int keep);
/* Reports an error a GPU would fault on (the launch then fails, as cudaGetLastError says). */
void emu_fail(const char *what);

/* The launch's dynamic shared memory (`extern __shared__ T name[]`, rewritten at build time into a
 * pointer from here): one buffer per block, poisoned with NaN bytes before each block. */
void *dynamic_shared();

/* Counts a launch of the kernel named `name` (ctrl_emu_launches). */
void count_launch(const char *name);

/* Runs fn(ctx) once per thread of a grid of blocks. */
void run_grid(dim3 grid, dim3 block, size_t dynamic_shared, void (*fn)(void *), void *ctx);

template <class T> uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T> T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}

template <class... P> struct Launch {
    void (*kernel)(P...);
    dim3 grid, block;
    size_t shared;
    const char *name;
    template <class... A> void operator()(A &&...args) const {
        count_launch(name);
        std::tuple<P...> bound(std::forward<A>(args)...);
        struct Ctx {
            void (*k)(P...);
            std::tuple<P...> *a;
        } ctx{kernel, &bound};
        run_grid(
            grid, block, shared,
            [](void *c) {
                Ctx *x = static_cast<Ctx *>(c);
                std::apply(x->k, *x->a);
            },
            &ctx);
    }
};

/* What `k<<<grid, block[, shared[, stream]]>>>(args)` is rewritten into: launch("k", k, grid,
 * block...)(args). */
template <class... P>
Launch<P...> launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared = 0,
                    void *stream = nullptr) {
    (void)stream;
    return Launch<P...>{kernel, grid, block, shared, name};
}

} // namespace ctrl_emu

/* Accepted and ignored: the emulator has no shared-memory limit below its own (1 MiB). */
template <class F> cudaError_t cudaFuncSetAttribute(F *, cudaFuncAttribute, int) { return cudaSuccess; }

inline void __syncthreads() { ctrl_emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    ctrl_emu::warp_collective(ctrl_emu::kSyncWarp, mask, 0, 0, 32);
}

template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return ctrl_emu::from_bits<T>(
        ctrl_emu::warp_collective(ctrl_emu::kShflIdx, mask, ctrl_emu::to_bits(v), src, width));
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return ctrl_emu::from_bits<T>(
        ctrl_emu::warp_collective(ctrl_emu::kShflXor, mask, ctrl_emu::to_bits(v), lane_mask, width));
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ctrl_emu::from_bits<T>(
        ctrl_emu::warp_collective(ctrl_emu::kShflDown, mask, ctrl_emu::to_bits(v), (int)delta, width));
}
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ctrl_emu::from_bits<T>(
        ctrl_emu::warp_collective(ctrl_emu::kShflUp, mask, ctrl_emu::to_bits(v), (int)delta, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)ctrl_emu::warp_collective(ctrl_emu::kBallot, mask, pred != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int pred) {
    return (int)ctrl_emu::warp_collective(ctrl_emu::kAny, mask, pred != 0, 0, 32);
}
inline int __all_sync(unsigned mask, int pred) {
    return (int)ctrl_emu::warp_collective(ctrl_emu::kAll, mask, pred != 0, 0, 32);
}

/* Atomics: fibers never interleave inside a call, so a plain read-modify-write is atomic. */
template <class T> T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <class T> T atomicMax(T *p, T v) {
    T old = *p;
    *p = old < v ? v : old;
    return old;
}
template <class T> T atomicMin(T *p, T v) {
    T old = *p;
    *p = v < old ? v : old;
    return old;
}
template <class T> T atomicExch(T *p, T v) {
    T old = *p;
    *p = v;
    return old;
}
template <class T> T atomicCAS(T *p, T cmp, T v) {
    T old = *p;
    if (old == cmp) *p = v;
    return old;
}

/* Math: the device's overloads and intrinsics the kernels use. */
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
/* Rounded single operations (never contracted into an FMA): on a host build each is one IEEE
 * operation already. */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline unsigned __float_as_uint(float x) {
    unsigned u;
    memcpy(&u, &x, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

#endif
