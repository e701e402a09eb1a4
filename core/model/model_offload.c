/* Activation offloading (the offload_activations memory strategy, TRL's activation_offloading):
 * the inputs of the recomputed (checkpointed) layers share two slots of the activation memory
 * (layer l's: l % 2, model_ensure_acts) and are kept elsewhere between their forward and their
 * backward -- on a device in host memory, on the CPU in a file, as DeepSpeed's NVMe offload: the
 * process's resident memory then holds two layers' inputs instead of one per layer, the page cache
 * the rest (which the kernel writes back and may drop). The same bytes come back, so the gradients
 * are the same bit for bit.
 *
 * On a device whose backend has side copies (CUDA: backend.h's side_copy / side_wait) the host
 * memory is page-locked and the copies run on a side stream beside the kernels, ordered by events:
 * an input goes out while its own layer's forward reads it, and comes back while the layer above
 * it runs its backward (offload_async below). Without them, synchronous copies.
 *
 * The file: made with mkstemp in the chosen directory and unlinked at once -- it has no name from
 * then on, so it goes away when the descriptor closes, on exit, on an error or a crash alike. Each
 * input is written right after its layer's forward (pwrite at l * T * C floats; the write-back is
 * started at once, sync_file_range), read back before the layer's backward, and the next input the
 * backward needs is announced to the kernel (POSIX_FADV_WILLNEED) so that its read-ahead runs
 * during this layer's backward; the pages read are then dropped from the cache (DONTNEED). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctrl/log.h>

#include "device/backend.h"
#include "model/model.h"
#include "model/model_internal.h"

ctrl_status ctrl_model_set_offload_activations(ctrl_model *m, int on) {
    if (on && m->n_recompute == 0)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "no layer is recomputed, so no layer keeps only its input through the "
                              "forward: list checkpointing beside it");
    m->offload_acts = on != 0;
    m->act_cap_T = 0; /* the activation layout changes */
    return CTRL_OK;
}

ctrl_status ctrl_model_set_offload_dir(ctrl_model *m, const char *dir) {
    char *copy = NULL;
    if (dir && *dir && !(copy = strdup(dir))) return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    free(m->offload_dir);
    m->offload_dir = copy;
    return CTRL_OK;
}

size_t ctrl_model_offloaded_bytes(const ctrl_model *m, size_t *per_layer) {
    const int stored = m->offload_host || (m->offload_file && m->act_cap_T > 0);
    const size_t one = stored ? sizeof(float) * (size_t)m->act_cap_T * (size_t)m->cfg.hidden_size : 0;
    if (per_layer) *per_layer = one;
    return one * (size_t)m->n_recompute;
}

int ctrl_model_offload_overlapped(const ctrl_model *m) { return m->offload_async; }

static const char *offload_dir(const ctrl_model *m) {
    if (m->offload_dir) return m->offload_dir;
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

/* The file, made once (kept open across layouts: it grows as a longer batch is written). */
static ctrl_status open_file(ctrl_model *m) {
    if (m->offload_file) return CTRL_OK;
    const char *dir = offload_dir(m);
    char *path = malloc(strlen(dir) + 32);
    if (!path) return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    sprintf(path, "%s/ctrl-activations-XXXXXX", dir);
    const int fd = mkstemp(path);
    if (fd < 0) {
        const int e = errno;
        free(path);
        return ctrl_error_set(CTRL_ERR_IO, "activation offloading: cannot make a file in %s: %s", dir,
                              strerror(e));
    }
    unlink(path); /* nameless from now on: nothing is left behind, whatever happens */
    free(path);
    m->offload_fd = fd, m->offload_file = 1;
    CTRL_DEBUG("activation offloading: the layer inputs go to an unlinked file in %s", dir);
    return CTRL_OK;
}

ctrl_status model_offload_store(ctrl_model *m, int T) {
    const size_t bytes = sizeof(float) * (size_t)T * (size_t)m->cfg.hidden_size * (size_t)m->cfg.n_layers;
    m->offload_prefetched = 0;
    if (m->be->host_memory) return open_file(m);
    const ctrl_backend_ops *be = m->be;
    if (ctrl_backend_has(be, side_copy) && ctrl_backend_has(be, side_wait) &&
        ctrl_backend_has(be, host_alloc) && ctrl_backend_has(be, host_free)) {
        ctrl_status st = be->host_alloc((void **)&m->offload_host, bytes);
        if (st != CTRL_OK)
            return ctrl_error_wrap(st, "model: page-locked host memory for %d layers' inputs of %d tokens",
                                   m->cfg.n_layers, T);
        m->offload_async = 1;
        return CTRL_OK;
    }
    if (!(m->offload_host = malloc(bytes)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: host memory for %d layers' inputs of %d tokens",
                              m->cfg.n_layers, T);
    return CTRL_OK;
}

void model_offload_release(ctrl_model *m) {
    if (m->offload_async) {
        m->be->side_wait(-1); /* the copies in flight touch both buffers */
        m->be->host_free(m->offload_host);
    } else {
        free(m->offload_host);
    }
    m->offload_host = NULL, m->offload_async = 0, m->offload_prefetched = 0;
}

/* The compute waits for both slots' copies (a forward after a forward: the last inputs' copies out
 * may still run). */
ctrl_status model_offload_begin(ctrl_model *m) {
    if (!m->offload_async) return CTRL_OK;
    m->offload_prefetched = 0;
    ctrl_status st = m->be->side_wait(0);
    return st == CTRL_OK ? m->be->side_wait(1) : st;
}

void model_offload_close(ctrl_model *m) {
    model_offload_release(m);
    if (m->offload_file) close(m->offload_fd);
    m->offload_file = 0;
    free(m->offload_dir);
    m->offload_dir = NULL;
}

/* All of n bytes at off, or the error named. */
static ctrl_status file_io(ctrl_model *m, int out, void *buf, size_t n, off_t off, int l) {
    char *p = buf;
    while (n > 0) {
        const ssize_t k = out ? pwrite(m->offload_fd, p, n, off) : pread(m->offload_fd, p, n, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ctrl_error_set(CTRL_ERR_IO,
                                  "activation offloading: %s layer %d's input %s the file in %s: %s",
                                  out ? "writing" : "reading", l, out ? "to" : "from", offload_dir(m),
                                  k < 0 ? strerror(errno) : "the file is shorter than what was written");
        p += k, n -= (size_t)k, off += k;
    }
    return CTRL_OK;
}

/* On the side stream (offload_async): slot s = l % 2 has event s. Forward: layer l's input goes out
 * while layer l reads it; the compute first waits for the other slot's copy out (layer l - 1's
 * input), which layer l's output overwrites (model_offload_input, for every layer). Backward: layer l's input
 * is waited for (queued while layer l + 1 ran back, or now), then the input of the next recomputed layer down
 * is queued into the other slot, which layer l + 1's backward no longer needs, so it comes back during layer
 * l's recompute and backward. */
static ctrl_status offload_async(ctrl_model *m, int l, int out, float *host, size_t bytes) {
    const ctrl_backend_ops *be = m->be;
    const int slot = l % 2;
    if (out) return be->side_copy(host, m->acts[l].x_in, bytes, 0, slot); /* the wait: the caller's */
    if (m->offload_prefetched != l + 1) MODEL_TRY(be->side_copy(m->acts[l].x_in, host, bytes, 1, slot));
    MODEL_TRY(be->side_wait(slot));
    m->offload_prefetched = 0;
    int prev = l - 1;
    while (prev >= 0 && !model_recomputed(m, prev)) prev--;
    if (prev < 0 || prev % 2 == slot) return CTRL_OK; /* its slot is this layer's: fetched when reached */
    const size_t n = bytes / sizeof(float);
    MODEL_TRY(be->side_copy(m->acts[prev].x_in, m->offload_host + (size_t)prev * n, bytes, 1, prev % 2));
    m->offload_prefetched = prev + 1;
    return CTRL_OK;
}

/* Layer l's input to host memory or the file just before its forward (out = 1), or back before
 * its backward. */
ctrl_status model_offload_input(ctrl_model *m, int l, int out) {
    /* any layer's output may overwrite the other slot (a kept layer before a recomputed one too) */
    if (out && m->offload_async) MODEL_TRY(m->be->side_wait(1 - l % 2));
    if (!model_recomputed(m, l) || !(m->offload_host || (m->offload_file && m->offload_acts))) return CTRL_OK;
    const size_t n = (size_t)m->T * (size_t)m->cfg.hidden_size, bytes = sizeof(float) * n;
    if (m->offload_host) {
        float *host = m->offload_host + (size_t)l * n;
        if (m->offload_async) return offload_async(m, l, out, host, bytes);
        return out ? m->be->to_host(host, m->acts[l].x_in, bytes)
                   : m->be->to_device(m->acts[l].x_in, host, bytes);
    }
    const off_t off = (off_t)((size_t)l * sizeof(float) * (size_t)m->act_cap_T * (size_t)m->cfg.hidden_size);
    ctrl_status st = file_io(m, out, m->acts[l].x_in, bytes, off, l);
    if (st != CTRL_OK) return st;
#ifdef __linux__
    if (out)
        sync_file_range(m->offload_fd, off, (off_t)bytes, SYNC_FILE_RANGE_WRITE); /* start writing back */
#endif
    if (out) return CTRL_OK;
    posix_fadvise(m->offload_fd, off, (off_t)bytes, POSIX_FADV_DONTNEED); /* read: its pages may go */
    int prev = l - 1;                                                     /* the backward's next input */
    while (prev >= 0 && !model_recomputed(m, prev)) prev--;
    if (prev >= 0) {
        const off_t at =
            (off_t)((size_t)prev * sizeof(float) * (size_t)m->act_cap_T * (size_t)m->cfg.hidden_size);
        posix_fadvise(m->offload_fd, at, (off_t)bytes, POSIX_FADV_WILLNEED);
    }
    return CTRL_OK;
}
