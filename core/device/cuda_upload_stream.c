/* An upload stream for offload_optimizer's overlapped host step (backend.h's upload_copy /
 * upload_wait): a non-blocking stream of host to device copies that, unlike the side stream's
 * (cuda_side_stream.c), do not first wait for the compute stream -- the caller copies a layer's
 * parameters that no queued kernel reads (the host stepped them while the device ran the other
 * layers). Each copy records its own event (created on first use, up to CTRL_UPLOAD_EVENTS); the
 * compute stream waits for exactly the event of the layer it needs next. Under the emulator
 * (kernels/cuda/emu) the copies run only when waited for, so a missing wait reads stale weights.
 * Called from one thread (the one that queues the compute). */
#include "device/cuda_upload_stream.h"

#include "device/backend.h"

#ifdef CTRL_HAVE_CUDA
#include "device/cuda_check.h"

static cudaStream_t up;
static cudaEvent_t done[CTRL_UPLOAD_EVENTS];

static ctrl_status check_event(int ev) {
    if (ev >= 0 && ev < CTRL_UPLOAD_EVENTS) return CTRL_OK;
    return ctrl_error_set(CTRL_ERR_RUNTIME, "cuda upload stream: event %d out of 0..%d", ev,
                          CTRL_UPLOAD_EVENTS - 1);
}

ctrl_status ctrl_cuda_upload_copy(void *dst, const void *src, size_t bytes, int ev) {
    ctrl_status st = check_event(ev);
    if (st != CTRL_OK) return st;
    if (!up) CTRL_CUDA_CHECK(cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking));
    if (!done[ev]) CTRL_CUDA_CHECK(cudaEventCreateWithFlags(&done[ev], cudaEventDisableTiming));
    CTRL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, up));
    CTRL_CUDA_CHECK(cudaEventRecord(done[ev], up));
    return CTRL_OK;
}

ctrl_status ctrl_cuda_upload_wait(int ev) {
    if (!up) return CTRL_OK; /* nothing was ever queued */
    if (ev < 0) {
        CTRL_CUDA_CHECK(cudaStreamSynchronize(up));
        return CTRL_OK;
    }
    ctrl_status st = check_event(ev);
    if (st != CTRL_OK) return st;
    if (!done[ev]) return ctrl_error_set(CTRL_ERR_RUNTIME, "cuda upload stream: event %d never recorded", ev);
    CTRL_CUDA_CHECK(cudaStreamWaitEvent(0, done[ev], 0));
    return CTRL_OK;
}

ctrl_status ctrl_cuda_host_register(void *ptr, size_t bytes) {
    CTRL_CUDA_CHECK(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault));
    return CTRL_OK;
}

void ctrl_cuda_host_unregister(void *ptr) {
    if (ptr) cudaHostUnregister(ptr);
}

#else /* built without CUDA */

ctrl_status ctrl_cuda_upload_copy(void *dst, const void *src, size_t bytes, int ev) {
    (void)dst, (void)src, (void)bytes, (void)ev;
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "this ctrl was built without CUDA");
}
ctrl_status ctrl_cuda_upload_wait(int ev) {
    (void)ev;
    return CTRL_OK;
}
ctrl_status ctrl_cuda_host_register(void *ptr, size_t bytes) {
    (void)ptr, (void)bytes;
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "this ctrl was built without CUDA");
}
void ctrl_cuda_host_unregister(void *ptr) { (void)ptr; }

#endif
