// ctrl's CUDA emulator runtime: the scheduler that runs a kernel's threads as fibers, the warp
// collectives and barriers, and the runtime API over host memory (every call synchronous).
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <vector>

extern "C" void ctrl_emu_reset_matmuls(void); // emu_cublaslt.cpp

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

namespace {

// Fiber contexts. On x86-64 a switch saves the callee-saved registers on the old stack and
// swaps stack pointers (no system call: ucontext's swapcontext makes two sigprocmask calls per
// switch, which made a kernel with barriers several times slower); elsewhere ucontext.
#if defined(__x86_64__)
struct Context {
    void *sp = nullptr;
};
extern "C" void ctrl_emu_switch(void **save_sp, void *to_sp);
__asm__(".text\n"
        ".globl ctrl_emu_switch\n"
        ".type ctrl_emu_switch,@function\n"
        "ctrl_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size ctrl_emu_switch, .-ctrl_emu_switch\n");
void context_switch(Context &from, Context &to) { ctrl_emu_switch(&from.sp, to.sp); }
// A fresh context whose first switch "returns" into entry with the stack aligned as after a call.
void context_make(Context &c, char *stack, size_t bytes, void (*entry)()) {
    uintptr_t top = ((uintptr_t)(stack + bytes)) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr;       // entry's (never used) return address: rsp % 16 == 8 at entry
    *--sp = (void *)entry; // popped by ret
    for (int i = 0; i < 6; i++) *--sp = nullptr; // rbp rbx r12-r15
    c.sp = sp;
}
#else
struct Context {
    ucontext_t uc;
};
void context_switch(Context &from, Context &to) { swapcontext(&from.uc, &to.uc); }
void context_make(Context &c, char *stack, size_t bytes, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = bytes;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

enum State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
    Context ctx;
    uint3 tid;
    int lane, warp;
    State state;
    ctrl_emu::Collective kind; // the warp collective this fiber waits in
    unsigned mask;
    int arg, width;
    uint64_t value, result;
    void *data;                        // kApply: this lane's operands and results
    void (*apply)(void *const *lanes); // kApply: computes every lane's results at once
    struct AsyncCopy {
        void *dst;
        const void *src;
        int bytes;
    };
    std::vector<AsyncCopy> async; // cp.async copies issued and not yet landed, in order
    std::vector<size_t> groups;   // the end (in `async`) of each committed group, oldest first
};

// Lands the thread's oldest cp.async copies: those of every committed group but the newest
// `keep` (cp.async.wait_group keep), or all of them (keep < 0: at the thread's exit).
void complete_async(Fiber &f, int keep) {
    size_t n = f.async.size();
    if (keep >= 0) n = (int)f.groups.size() > keep ? f.groups[f.groups.size() - keep - 1] : 0;
    for (size_t i = 0; i < n; i++) memcpy(f.async[i].dst, f.async[i].src, (size_t)f.async[i].bytes);
    f.async.erase(f.async.begin(), f.async.begin() + (long)n);
    size_t g = 0;
    while (g < f.groups.size() && f.groups[g] <= n) g++;
    f.groups.erase(f.groups.begin(), f.groups.begin() + (long)g);
    for (size_t &e : f.groups) e -= n;
}

constexpr size_t kStackBytes = 64 * 1024;

struct Block {
    std::vector<Fiber> fibers;
    char *stacks = nullptr;
    std::vector<int> warp_waiting, warp_done;
    int block_waiting = 0, done = 0;
    Context scheduler;
    Fiber *current = nullptr;
    void (*fn)(void *) = nullptr;
    void *fn_ctx = nullptr;
};

thread_local Block *g_block = nullptr;
thread_local std::vector<unsigned char> g_dynamic_shared;
constexpr size_t kMaxDynamicShared = 1 << 20;
cudaError_t g_last_error = cudaSuccess; // sticky until cudaGetLastError, as on a device
uint64_t g_rng = 0;

uint64_t next_random() {
    if (g_rng == 0) {
        const char *s = getenv("CTRL_EMU_SEED");
        g_rng = s ? strtoull(s, nullptr, 0) : 0x9e3779b97f4a7c15ull;
        if (g_rng == 0) g_rng = 1;
    }
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

void fail(const char *what) {
    fprintf(stderr, "ctrl CUDA emulator: block (%u,%u,%u): %s\n", blockIdx.x, blockIdx.y, blockIdx.z, what);
    if (g_last_error == cudaSuccess) g_last_error = cudaErrorLaunchFailure;
}

void fiber_entry() {
    Block *b = g_block;
    b->fn(b->fn_ctx);
    complete_async(*b->current, -1);
    b->current->state = kDone;
    context_switch(b->current->ctx, b->scheduler); // never resumed
    abort();
}

// Back to the scheduler; returns when the scheduler runs this fiber again.
void yield_to_scheduler() {
    Block *b = g_block;
    context_switch(b->current->ctx, b->scheduler);
}

int warp_lanes(const Block &b, int warp) {
    int n = (int)b.fibers.size() - warp * 32;
    return n < 32 ? n : 32;
}

// The last live lane of a warp has arrived: compute every lane's result, release them all.
void resolve_warp(Block &b, int warp, std::vector<Fiber *> &runnable) {
    Fiber *lanes = &b.fibers[(size_t)warp * 32];
    const int n = warp_lanes(b, warp);
    Fiber *first = nullptr;
    for (int i = 0; i < n; i++)
        if (lanes[i].state == kAtWarpBarrier) {
            first = &lanes[i];
            break;
        }
    if (!first) return;
    for (int i = 0; i < n; i++) {
        Fiber &f = lanes[i];
        if (f.state != kAtWarpBarrier) {
            if (f.state == kDone && (first->mask >> i) & 1u)
                fail("warp collective's mask names a lane that has exited");
            continue;
        }
        if (f.kind != first->kind || f.mask != first->mask) fail("lanes of a warp in different collectives");
    }
    if (first->kind == ctrl_emu::kApply) { // mma.sync, ldmatrix: the whole warp, one computation
        void *data[32];
        bool whole = n == 32;
        for (int i = 0; i < n && whole; i++) {
            whole = lanes[i].state == kAtWarpBarrier && lanes[i].kind == ctrl_emu::kApply &&
                    lanes[i].apply == first->apply;
            data[i] = lanes[i].data;
        }
        if (whole)
            first->apply(data);
        else
            fail("a warp-wide matrix instruction (mma.sync / ldmatrix, .aligned) without all 32 lanes of the "
                 "warp executing the same one");
        for (int i = 0; i < n; i++)
            if (lanes[i].state == kAtWarpBarrier) {
                lanes[i].state = kRunnable;
                runnable.push_back(&lanes[i]);
            }
        b.warp_waiting[warp] = 0;
        return;
    }
    uint64_t ballot = 0;
    for (int i = 0; i < n; i++)
        if (lanes[i].state == kAtWarpBarrier && lanes[i].value) ballot |= 1ull << i;
    const uint64_t live = [&] {
        uint64_t m = 0;
        for (int i = 0; i < n; i++)
            if (lanes[i].state == kAtWarpBarrier) m |= 1ull << i;
        return m;
    }();
    for (int i = 0; i < n; i++) {
        Fiber &f = lanes[i];
        if (f.state != kAtWarpBarrier) continue;
        // Lanes are grouped in segments of `width`; a source outside the segment keeps its own value.
        const int w = f.width, base = i / w * w, in = i - base;
        int src = i;
        switch (f.kind) {
        case ctrl_emu::kShflIdx: src = base + ((f.arg % w) + w) % w; break;
        case ctrl_emu::kShflXor: src = (in ^ f.arg) < w ? base + (in ^ f.arg) : i; break;
        case ctrl_emu::kShflDown: src = in + f.arg < w ? i + f.arg : i; break;
        case ctrl_emu::kShflUp: src = in - f.arg >= 0 ? i - f.arg : i; break;
        default: break;
        }
        switch (f.kind) {
        case ctrl_emu::kSyncWarp: f.result = 0; break;
        case ctrl_emu::kBallot: f.result = ballot; break;
        case ctrl_emu::kAny: f.result = ballot != 0; break;
        case ctrl_emu::kAll: f.result = ballot == live; break;
        default:
            if (src >= n || lanes[src].state != kAtWarpBarrier) {
                fail("shuffle reads a lane that is not in the collective");
                f.result = f.value;
            } else {
                f.result = lanes[src].value;
            }
        }
    }
    for (int i = 0; i < n; i++)
        if (lanes[i].state == kAtWarpBarrier) {
            lanes[i].state = kRunnable;
            runnable.push_back(&lanes[i]);
        }
    b.warp_waiting[warp] = 0;
}

void release_block(Block &b, std::vector<Fiber *> &runnable) {
    for (Fiber &f : b.fibers)
        if (f.state == kAtBlockBarrier) {
            f.state = kRunnable;
            runnable.push_back(&f);
        }
    b.block_waiting = 0;
}

// Runs one block to completion: pick a random runnable fiber, run it to its next synchronisation
// point (or its end), release whatever barrier that completed, repeat.
void run_block(Block &b) {
    const int n = (int)b.fibers.size();
    std::vector<Fiber *> runnable;
    runnable.reserve(n);
    for (int i = 0; i < n; i++) {
        Fiber &f = b.fibers[i];
        f.state = kRunnable;
        f.async.clear(), f.groups.clear();
        context_make(f.ctx, b.stacks + (size_t)i * kStackBytes, kStackBytes, fiber_entry);
        runnable.push_back(&f);
    }
    std::fill(b.warp_waiting.begin(), b.warp_waiting.end(), 0);
    std::fill(b.warp_done.begin(), b.warp_done.end(), 0);
    b.block_waiting = 0, b.done = 0;
    while (b.done < n) {
        if (runnable.empty()) {
            fail("deadlock: threads wait in different barriers (__syncthreads or a warp collective in "
                 "divergent code)");
            return;
        }
        size_t pick = (size_t)(next_random() % runnable.size());
        Fiber *f = runnable[pick];
        runnable[pick] = runnable.back();
        runnable.pop_back();
        b.current = f;
        threadIdx = f->tid;
        context_switch(b.scheduler, f->ctx);
        const int w = f->warp;
        if (f->state == kDone) {
            b.done++;
            b.warp_done[w]++;
        } else if (f->state == kAtWarpBarrier) {
            b.warp_waiting[w]++;
        } else if (f->state == kAtBlockBarrier) {
            b.block_waiting++;
        }
        if (b.warp_waiting[w] > 0 && b.warp_waiting[w] + b.warp_done[w] == warp_lanes(b, w))
            resolve_warp(b, w, runnable);
        if (b.block_waiting > 0 && b.block_waiting + b.done == n) release_block(b, runnable);
    }
}

} // namespace

namespace ctrl_emu {

void *dynamic_shared() { return g_dynamic_shared.data(); }

void sync_block() {
    g_block->current->state = kAtBlockBarrier;
    yield_to_scheduler();
}

uint64_t warp_collective(Collective kind, unsigned mask, uint64_t value, int arg, int width) {
    Fiber *f = g_block->current;
    if (width <= 0 || width > 32 || (width & (width - 1)))
        fail("shuffle width is not a power of two up to 32");
    f->state = kAtWarpBarrier;
    f->kind = kind, f->mask = mask, f->value = value, f->arg = arg,
    f->width = width > 0 && width <= 32 ? width : 32;
    yield_to_scheduler();
    return f->result;
}

void warp_apply(void *lane_data, void (*apply)(void *const *lanes)) {
    Fiber *f = g_block->current;
    f->state = kAtWarpBarrier;
    f->kind = kApply, f->mask = 0xffffffffu, f->value = 0, f->arg = 0, f->width = 32;
    f->data = lane_data, f->apply = apply;
    yield_to_scheduler();
}

void emu_fail(const char *what) { fail(what); }

void cp_async(void *dst, const void *src, int bytes) {
    if (((uintptr_t)dst | (uintptr_t)src) % (uintptr_t)bytes != 0) {
        fail("cp.async: an address is not aligned to the copy's size (misaligned address on a GPU)");
        return;
    }
    g_block->current->async.push_back({dst, src, bytes});
}

void cp_async_commit() {
    Fiber &f = *g_block->current;
    f.groups.push_back(f.async.size());
}

void cp_async_wait(int keep) { complete_async(*g_block->current, keep); }

// The launch counters (ctrl_emu_launches): launches by kernel name, as written at the launch.
struct LaunchCount {
    const char *name;
    long n;
};
std::vector<LaunchCount> g_launches;
pthread_mutex_t g_count_lock = PTHREAD_MUTEX_INITIALIZER;

void count_launch(const char *name) {
    pthread_mutex_lock(&g_count_lock);
    bool found = false;
    for (LaunchCount &c : g_launches)
        if (c.name == name || !strcmp(c.name, name)) {
            c.n++, found = true;
            break;
        }
    if (!found) g_launches.push_back(LaunchCount{name, 1});
    pthread_mutex_unlock(&g_count_lock);
}

void run_grid(dim3 grid, dim3 block, size_t dynamic_shared, void (*fn)(void *), void *ctx) {
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
        grid.z > 65535 || block.z > 64 || dynamic_shared > kMaxDynamicShared) {
        if (g_last_error == cudaSuccess) g_last_error = cudaErrorInvalidConfiguration;
        return;
    }
    Block b;
    const int n = (int)threads, warps = (n + 31) / 32;
    b.fibers.resize(n);
    // The fiber stacks stay allocated for the next launch (1024 threads: 64 MiB of address space,
    // touched only as deep as the kernels go), and are freed when the launching thread ends (a
    // server's batcher threads come and go).
    struct StackCache {
        char *stacks = nullptr;
        int stacks_for = 0;
        ~StackCache() { free(stacks); }
    };
    static thread_local StackCache cache;
    if (cache.stacks_for < n) {
        free(cache.stacks);
        cache.stacks = static_cast<char *>(malloc((size_t)n * kStackBytes));
        if (!cache.stacks) {
            cache.stacks_for = 0;
            if (g_last_error == cudaSuccess) g_last_error = cudaErrorMemoryAllocation;
            return;
        }
        cache.stacks_for = n;
    }
    b.stacks = cache.stacks;
    b.warp_waiting.assign(warps, 0);
    b.warp_done.assign(warps, 0);
    b.fn = fn, b.fn_ctx = ctx;
    for (int i = 0; i < n; i++) {
        Fiber &f = b.fibers[i];
        f.tid = uint3{(unsigned)(i % block.x), (unsigned)(i / block.x % block.y),
                      (unsigned)(i / (block.x * block.y))};
        f.lane = i % 32, f.warp = i / 32;
    }
    Block *saved = g_block;
    g_block = &b;
    blockDim = block, gridDim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = uint3{x, y, z};
                // poison: a read of dynamic shared memory before a write sees NaN, not the last block's data
                g_dynamic_shared.assign(dynamic_shared, 0xff);
                run_block(b);
                if (b.done < n) break; // deadlocked; reported
            }
    g_block = saved;
}

} // namespace ctrl_emu

// ---- the runtime API: host memory, synchronous ----
//
// Except the copies queued on a created stream (cudaMemcpyAsync with a stream other than 0): they
// wait in the stream's queue and run as late as CUDA allows -- when something waits for them (an
// event recorded after them waited for by cudaStreamWaitEvent or cudaEventSynchronize, or
// cudaStreamSynchronize / cudaDeviceSynchronize / cudaStreamDestroy). A copy reads its source and
// writes its destination then, so code that overwrites a copy's source, or reads its destination,
// without waiting for its event gets other bytes than it expects, as it may on a GPU (a side stream
// copying behind the compute stream's back: activation offloading).
// The emulated NCCL's collectives on such a stream wait in its queue the same way
// (ctrl_emu_stream_defer): a reduce-scatter or an all-gather on a communication stream runs when the
// compute stream waits for an event recorded after it, so code that reads the result without that
// wait reads the bytes from before the collective.

struct emu_copy {
    void *dst;
    const void *src;
    size_t bytes;
    int (*fn)(void *); // instead of a copy: work queued by ctrl_emu_stream_defer
    void *arg;
};
struct CUstream_st {
    std::vector<emu_copy> queue; // not yet run
    size_t done;                 // how many of every copy queued so far have run
};
struct CUevent_st {
    struct timespec at;
    cudaStream_t stream; // recorded on a created stream: the copies before it
    size_t upto;
};

static std::vector<cudaStream_t> g_streams;

// Runs the stream's queued copies up to the upto-th copy ever queued on it (all: SIZE_MAX); nothing
// for a stream destroyed since (its copies ran then).
static void emu_stream_run(cudaStream_t s, size_t upto) {
    if (std::find(g_streams.begin(), g_streams.end(), s) == g_streams.end()) return;
    size_t k = 0;
    while (k < s->queue.size() && s->done < upto) {
        const emu_copy c = s->queue[k++]; // (a copy: fn may queue more on another stream)
        if (c.fn && c.fn(c.arg) && g_last_error == cudaSuccess) g_last_error = cudaErrorLaunchFailure;
        if (!c.fn && c.bytes) memmove(c.dst, c.src, c.bytes);
        s->done++;
    }
    s->queue.erase(s->queue.begin(), s->queue.begin() + (long)k);
}

extern "C" {

const char *cudaGetErrorString(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulator)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulator: see its message above)";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last_error; }
/* The emulated devices: 1, or CTRL_EMU_DEVICES (up to 8) where a test runs several ranks on one
 * machine, each process taking its local rank's (one memory, the process's, whichever it is). */
static int emu_devices(void) {
    const char *s = getenv("CTRL_EMU_DEVICES");
    const int n = s ? atoi(s) : 1;
    return n >= 1 && n <= 8 ? n : 1;
}
static int g_device;
cudaError_t cudaGetDeviceCount(int *count) {
    *count = emu_devices();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= emu_devices()) return cudaErrorInvalidDevice;
    g_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
    *device = g_device;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device < 0 || device >= emu_devices()) return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "ctrl CUDA emulator");
    prop->totalGlobalMem = (size_t)4 << 30;
    prop->major = 8, prop->minor = 0, prop->multiProcessorCount = 1, prop->warpSize = 32;
    prop->sharedMemPerBlock = 48 * 1024, prop->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    for (cudaStream_t s : g_streams) emu_stream_run(s, SIZE_MAX);
    return g_last_error;
}
cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    *ptr = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *ptr) {
    free(ptr);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
cudaError_t cudaFreeHost(void *ptr) { return cudaFree(ptr); }
// Page-locking memory the caller allocated: nothing to do where "device" memory is the host's.
cudaError_t cudaHostRegister(void *ptr, size_t bytes, unsigned int flags) {
    (void)flags;
    return ptr && bytes ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaHostUnregister(void *ptr) { return ptr ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    (void)kind;
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    if (!s) return cudaMemcpy(dst, src, bytes, kind);
    s->queue.push_back(emu_copy{dst, src, bytes, nullptr, nullptr});
    return cudaSuccess;
}
cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    if (bytes) memset(dst, value, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
    (void)s;
    return cudaMemset(dst, value, bytes);
}
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = new CUstream_st{};
    g_streams.push_back(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    (void)flags; // the default stream runs everything at once: nothing to synchronise with
    return cudaStreamCreate(s);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return cudaSuccess;
    emu_stream_run(s, SIZE_MAX);
    g_streams.erase(std::find(g_streams.begin(), g_streams.end(), s));
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (s) emu_stream_run(s, SIZE_MAX);
    return g_last_error;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)s, (void)flags; // every stream waiting runs the event's copies now (the default one at once)
    if (e->stream) emu_stream_run(e->stream, e->upto);
    return g_last_error; // (a collective queued before the event failed)
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new CUevent_st{};
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    (void)flags;
    return cudaEventCreate(e);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    clock_gettime(CLOCK_MONOTONIC, &e->at);
    e->stream = s, e->upto = s ? s->done + s->queue.size() : 0;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (e->stream) emu_stream_run(e->stream, e->upto);
    return g_last_error;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    *ms = (float)((end->at.tv_sec - start->at.tv_sec) * 1e3 + (end->at.tv_nsec - start->at.tv_nsec) * 1e-6);
    return cudaSuccess;
}

int ctrl_emu_stream_defer(cudaStream_t s, int (*fn)(void *arg), void *arg) {
    if (!s || std::find(g_streams.begin(), g_streams.end(), s) == g_streams.end()) return -1;
    s->queue.push_back(emu_copy{nullptr, nullptr, 0, fn, arg});
    return 0;
}

void ctrl_emu_stream_flush(cudaStream_t s) {
    if (s) emu_stream_run(s, SIZE_MAX);
}

void ctrl_emu_set_seed(uint64_t seed) { g_rng = seed ? seed : 1; }

long ctrl_emu_launches(const char *name_part) {
    long n = 0;
    pthread_mutex_lock(&ctrl_emu::g_count_lock);
    for (const ctrl_emu::LaunchCount &c : ctrl_emu::g_launches)
        if (!name_part || strstr(c.name, name_part)) n += c.n;
    pthread_mutex_unlock(&ctrl_emu::g_count_lock);
    return n;
}

void ctrl_emu_reset_counters(void) {
    pthread_mutex_lock(&ctrl_emu::g_count_lock);
    ctrl_emu::g_launches.clear();
    pthread_mutex_unlock(&ctrl_emu::g_count_lock);
    ctrl_emu_reset_matmuls();
}

} // extern "C"
