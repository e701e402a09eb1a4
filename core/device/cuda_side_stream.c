/* A side stream for copies that overlap the compute (backend.h's side_copy / side_wait): the
 * compute stream is CUDA's legacy default stream (every kernel and cudaMemcpy of the backend goes
 * there), the side stream is created non-blocking so that it does not wait for it implicitly. A
 * copy first makes the side stream wait for an event recorded on the compute stream (so that it
 * reads what the kernels queued before it wrote), then records event ev on the side stream; the
 * compute stream waits for ev before it reads the copy's destination or overwrites its source. With
 * page-locked host memory the copy then runs beside the kernels (pageable memory would make it
 * synchronous). Under the emulator (kernels/cuda/emu) the side stream's copies run only when waited
 * for, so a missing wait gives wrong bytes there too. */
#include "device/cuda_side_stream.h"

#ifdef CTRL_HAVE_CUDA
#include "device/cuda_check.h"

static cudaStream_t side;
static cudaEvent_t compute_done;
static cudaEvent_t done[CTRL_CUDA_SIDE_EVENTS];

static ctrl_status side_init(void) {
    if (side) return CTRL_OK;
    CTRL_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done, cudaEventDisableTiming));
    for (int i = 0; i < CTRL_CUDA_SIDE_EVENTS; i++)
        CTRL_CUDA_CHECK(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
    CTRL_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    return CTRL_OK;
}

static ctrl_status check_event(int ev) {
    if (ev >= 0 && ev < CTRL_CUDA_SIDE_EVENTS) return CTRL_OK;
    return ctrl_error_set(CTRL_ERR_RUNTIME, "cuda side stream: event %d out of 0..%d", ev,
                          CTRL_CUDA_SIDE_EVENTS - 1);
}

ctrl_status ctrl_cuda_side_copy(void *dst, const void *src, size_t bytes, int to_device, int ev) {
    ctrl_status st = check_event(ev);
    if (st == CTRL_OK) st = side_init();
    if (st != CTRL_OK) return st;
    CTRL_CUDA_CHECK(cudaEventRecord(compute_done, 0)); /* what the kernels queued so far */
    CTRL_CUDA_CHECK(cudaStreamWaitEvent(side, compute_done, 0));
    CTRL_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, side));
    CTRL_CUDA_CHECK(cudaEventRecord(done[ev], side));
    return CTRL_OK;
}

ctrl_status ctrl_cuda_side_wait(int ev) {
    if (!side) return CTRL_OK; /* nothing was ever queued */
    if (ev < 0) {
        CTRL_CUDA_CHECK(cudaStreamSynchronize(side));
        return CTRL_OK;
    }
    ctrl_status st = check_event(ev);
    if (st != CTRL_OK) return st;
    CTRL_CUDA_CHECK(cudaStreamWaitEvent(0, done[ev], 0));
    return CTRL_OK;
}

#else /* built without CUDA */

ctrl_status ctrl_cuda_side_copy(void *dst, const void *src, size_t bytes, int to_device, int ev) {
    (void)dst, (void)src, (void)bytes, (void)to_device, (void)ev;
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "this ctrl was built without CUDA");
}
ctrl_status ctrl_cuda_side_wait(int ev) {
    (void)ev;
    return CTRL_OK;
}

#endif
