/* Device memory mapped piece by piece behind one address range (backend.h's vm_reserve, vm_map,
 * vm_unmap, vm_unreserve; ZeRO-3's sliced parameters and gradients, core/train/zero_device.c), over
 * CUDA's virtual memory management: a range reserved with cuMemAddressReserve, each granularity-sized
 * piece mapped to an allocation of its own (cuMemCreate + cuMemMap + cuMemSetAccess on the current
 * device), so that any piece can be unmapped and released alone. The driver's functions are looked up
 * through the runtime (cudaGetDriverEntryPointByVersion), so libctrl_cuda.so does not link libcuda
 * (a machine without a driver still loads it, to say there is no device); they use the runtime's
 * primary context, current once the device was selected. Under the emulator (kernels/cuda/emu/emu_vm.cpp)
 * the same calls map host pages, and a touch of an unmapped piece faults. */
#include "device/cuda_vm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef CTRL_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#define MAX_RANGES 16

typedef struct {
    CUdeviceptr base;
    size_t bytes, gran;
    CUmemGenericAllocationHandle *handles; /* per piece, 0 when unmapped */
} vm_range;

static vm_range ranges[MAX_RANGES];

/* The driver's functions, looked up once. */
static struct {
    CUresult (*get_error_string)(CUresult, const char **);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
} cu;

static ctrl_status load_driver(void) {
    if (cu.set_access) return CTRL_OK;
    static const char *names[] = {"cuGetErrorString",
                                  "cuMemGetAllocationGranularity",
                                  "cuMemAddressReserve",
                                  "cuMemAddressFree",
                                  "cuMemCreate",
                                  "cuMemRelease",
                                  "cuMemMap",
                                  "cuMemUnmap",
                                  "cuMemSetAccess"};
    void *fns[sizeof names / sizeof *names];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        cudaError_t e = cudaGetDriverEntryPointByVersion(names[i], &fns[i], 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fns[i])
            return ctrl_error_set(CTRL_ERR_DEVICE, "cuda_vm: the driver has no %s (%s)", names[i],
                                  e != cudaSuccess ? cudaGetErrorString(e) : "not found");
    }
    memcpy(&cu.get_error_string, &fns[0], sizeof fns[0]), memcpy(&cu.granularity, &fns[1], sizeof fns[1]);
    memcpy(&cu.reserve, &fns[2], sizeof fns[2]), memcpy(&cu.address_free, &fns[3], sizeof fns[3]);
    memcpy(&cu.create, &fns[4], sizeof fns[4]), memcpy(&cu.release, &fns[5], sizeof fns[5]);
    memcpy(&cu.map, &fns[6], sizeof fns[6]), memcpy(&cu.unmap, &fns[7], sizeof fns[7]);
    memcpy(&cu.set_access, &fns[8], sizeof fns[8]);
    return CTRL_OK;
}

static ctrl_status cu_fail(const char *what, CUresult r) {
    const char *s = "unknown error";
    cu.get_error_string(r, &s);
    return ctrl_error_set(CTRL_ERR_DEVICE, "cuda_vm: %s: %s", what, s);
}

static CUmemAllocationProp device_prop(void) {
    int dev = 0;
    cudaGetDevice(&dev);
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

static vm_range *range_of(const void *ptr) {
    const CUdeviceptr v = (CUdeviceptr)(uintptr_t)ptr;
    for (int i = 0; i < MAX_RANGES; i++)
        if (ranges[i].base && v >= ranges[i].base && v < ranges[i].base + ranges[i].bytes) return &ranges[i];
    return NULL;
}

ctrl_status ctrl_cuda_vm_reserve(void **ptr, size_t bytes, size_t *granularity) {
    *ptr = NULL;
    vm_range *r = NULL;
    for (int i = 0; i < MAX_RANGES && !r; i++)
        if (!ranges[i].base) r = &ranges[i];
    if (!r) return ctrl_error_set(CTRL_ERR_RUNTIME, "cuda_vm: more than %d reserved ranges", MAX_RANGES);
    ctrl_status ld = load_driver();
    if (ld != CTRL_OK) return ld;
    const CUmemAllocationProp prop = device_prop();
    size_t gran = 0;
    CUresult e = cu.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (e != CUDA_SUCCESS) return cu_fail("cuMemGetAllocationGranularity", e);
    const size_t size = (bytes + gran - 1) / gran * gran, n = size / gran;
    if (!(r->handles = calloc(n ? n : 1, sizeof *r->handles)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "cuda_vm: out of memory");
    if ((e = cu.reserve(&r->base, size, 0, 0, 0)) != CUDA_SUCCESS) {
        free(r->handles), r->handles = NULL, r->base = 0;
        return cu_fail("cuMemAddressReserve", e);
    }
    r->bytes = size, r->gran = gran;
    *ptr = (void *)(uintptr_t)r->base, *granularity = gran;
    return CTRL_OK;
}

/* [ptr, ptr + bytes) as pieces of its range: the range and the first and past-the-last piece. */
static ctrl_status pieces(void *ptr, size_t bytes, vm_range **out, size_t *first, size_t *end) {
    vm_range *r = range_of(ptr);
    const CUdeviceptr v = (CUdeviceptr)(uintptr_t)ptr;
    if (!r || (v - r->base) % r->gran || bytes % r->gran || v - r->base + bytes > r->bytes)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "cuda_vm: %zu bytes at %p are not whole pieces of a reserved range", bytes,
                              ptr);
    *out = r, *first = (size_t)(v - r->base) / r->gran, *end = *first + bytes / r->gran;
    return CTRL_OK;
}

ctrl_status ctrl_cuda_vm_map(void *ptr, size_t bytes) {
    vm_range *r;
    size_t a, b;
    ctrl_status st = pieces(ptr, bytes, &r, &a, &b);
    if (st != CTRL_OK) return st;
    const CUmemAllocationProp prop = device_prop();
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location = prop.location, access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (size_t i = a; i < b; i++) {
        if (r->handles[i]) return ctrl_error_set(CTRL_ERR_RUNTIME, "cuda_vm: piece %zu mapped twice", i);
        const CUdeviceptr at = r->base + i * r->gran;
        CUmemGenericAllocationHandle h = 0;
        CUresult e = cu.create(&h, r->gran, &prop, 0);
        if (e != CUDA_SUCCESS) return cu_fail("cuMemCreate", e);
        if ((e = cu.map(at, r->gran, 0, h, 0)) != CUDA_SUCCESS) {
            cu.release(h);
            return cu_fail("cuMemMap", e);
        }
        r->handles[i] = h;
        if ((e = cu.set_access(at, r->gran, &access, 1)) != CUDA_SUCCESS) return cu_fail("cuMemSetAccess", e);
    }
    return CTRL_OK;
}

ctrl_status ctrl_cuda_vm_unmap(void *ptr, size_t bytes) {
    vm_range *r;
    size_t a, b;
    ctrl_status st = pieces(ptr, bytes, &r, &a, &b);
    for (size_t i = a; st == CTRL_OK && i < b; i++) {
        if (!r->handles[i]) continue;
        CUresult e = cu.unmap(r->base + i * r->gran, r->gran);
        if (e == CUDA_SUCCESS) e = cu.release(r->handles[i]);
        if (e != CUDA_SUCCESS) st = cu_fail("cuMemUnmap", e);
        r->handles[i] = 0;
    }
    return st;
}

void ctrl_cuda_vm_unreserve(void *ptr, size_t bytes) {
    (void)bytes;
    vm_range *r = range_of(ptr);
    if (!r) return;
    cudaDeviceSynchronize(); /* nothing still reads it */
    ctrl_cuda_vm_unmap((void *)(uintptr_t)r->base, r->bytes);
    cu.address_free(r->base, r->bytes);
    free(r->handles);
    memset(r, 0, sizeof *r);
}

#else /* built without CUDA */

ctrl_status ctrl_cuda_vm_reserve(void **ptr, size_t bytes, size_t *granularity) {
    (void)bytes, (void)granularity;
    *ptr = NULL;
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "this ctrl was built without CUDA");
}
ctrl_status ctrl_cuda_vm_map(void *ptr, size_t bytes) {
    (void)ptr, (void)bytes;
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "this ctrl was built without CUDA");
}
ctrl_status ctrl_cuda_vm_unmap(void *ptr, size_t bytes) {
    (void)ptr, (void)bytes;
    return CTRL_OK;
}
void ctrl_cuda_vm_unreserve(void *ptr, size_t bytes) { (void)ptr, (void)bytes; }

#endif
