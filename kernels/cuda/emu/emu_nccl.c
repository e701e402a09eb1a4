/* The emulated NCCL (include/nccl.h): communicators between threads or processes of one machine
 * over TCP, for tests without GPUs (device memory is host memory under the emulator, so the
 * collectives read and write the buffers directly). A star through rank 0: ncclGetUniqueId opens
 * a listening socket on 127.0.0.1 and writes its port and a random nonce into the id; rank 0 (in
 * the process that made the id, as the emulation's one restriction) accepts the other ranks,
 * which connect and say their rank. Every collective sends a header (operation, datatype, bytes,
 * root) before its data, so ranks that disagree get ncclInvalidUsage naming both sides instead of
 * the hang or corruption a real NCCL would give. A call on stream 0 is synchronous (as the compute
 * stream is under the emulator); one on a created stream is queued there (ctrl_emu_stream_defer) and
 * runs when something waits for that stream -- an event recorded after it, a synchronize --, so a
 * reader that skips the wait sees the buffer as it was before the collective. As NCCL, a
 * communicator's collectives run in the order they were issued: a call on another stream first runs
 * the ones still queued. A peer that closes its connection (its process died, or it aborted) makes the
 * collective fail with ncclRemoteError; ncclCommAbort from another thread unblocks a collective
 * in flight (it fails with ncclRemoteError) and frees the communicator once that call returned.
 * Joining waits at most CTRL_NCCL_EMU_TIMEOUT_S seconds (default 60). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#define EMU_MAGIC "CTRLNCCLEMU1"
#define MAX_LISTENERS 64

struct ncclComm {
    int rank, nranks;
    int *fd;              /* rank 0: fd[r] the connection to rank r; others: fd[0] to rank 0 */
    pthread_mutex_t lock; /* guards inflight and aborted */
    pthread_cond_t idle;
    int inflight, aborted;
    long queued; /* collectives queued on stream `queued_on`, not yet run */
    cudaStream_t queued_on;
    ncclResult_t async_error;
    char last_error[512];
};

typedef struct {
    char magic[12];
    uint16_t port;
    uint64_t nonce;
} emu_id;

static pthread_mutex_t listeners_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t nonce;
    int fd;
} listeners[MAX_LISTENERS];

static __thread char thread_error[512];

static ncclResult_t fail(ncclComm_t comm, ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(comm ? comm->last_error : thread_error, sizeof thread_error, fmt, ap);
    va_end(ap);
    if (comm && r == ncclRemoteError) comm->async_error = r;
    return r;
}

static double timeout_s(void) {
    const char *e = getenv("CTRL_NCCL_EMU_TIMEOUT_S");
    const double t = e ? atof(e) : 60;
    return t > 0 ? t : 60;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        const ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

static int recv_all(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        const ssize_t k = recv(fd, c, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fail(NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) { return comm ? comm->last_error : thread_error; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return fail(NULL, ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64) ||
        getsockname(fd, (struct sockaddr *)&a, &al)) {
        if (fd >= 0) close(fd);
        return fail(NULL, ncclSystemError, "ncclGetUniqueId: cannot listen on 127.0.0.1: %s",
                    strerror(errno));
    }
    emu_id e = {.port = ntohs(a.sin_port)};
    memcpy(e.magic, EMU_MAGIC, sizeof e.magic);
    FILE *ur = fopen("/dev/urandom", "rb");
    if (!ur || fread(&e.nonce, sizeof e.nonce, 1, ur) != 1)
        e.nonce = (uint64_t)now_s() * 1000003u ^ (uint64_t)getpid();
    if (ur) fclose(ur);
    pthread_mutex_lock(&listeners_lock);
    int slot = -1;
    for (int i = 0; i < MAX_LISTENERS && slot < 0; i++)
        if (!listeners[i].nonce) slot = i;
    if (slot >= 0) listeners[slot].nonce = e.nonce, listeners[slot].fd = fd;
    pthread_mutex_unlock(&listeners_lock);
    if (slot < 0) {
        close(fd);
        return fail(NULL, ncclSystemError, "ncclGetUniqueId: more than %d ids waiting for rank 0",
                    MAX_LISTENERS);
    }
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &e, sizeof e);
    return ncclSuccess;
}

/* Rank 0: the listening socket of the id (made in this process), taken out of the table. */
static int take_listener(uint64_t nonce) {
    int fd = -1;
    pthread_mutex_lock(&listeners_lock);
    for (int i = 0; i < MAX_LISTENERS; i++)
        if (listeners[i].nonce == nonce) fd = listeners[i].fd, listeners[i].nonce = 0;
    pthread_mutex_unlock(&listeners_lock);
    return fd;
}

static void comm_free(ncclComm_t c) {
    for (int r = 0; r < c->nranks; r++)
        if (c->fd[r] >= 0) close(c->fd[r]);
    free(c->fd);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->idle);
    free(c);
}

/* Small writes go out at once: a collective's header and its data are separate writes, which Nagle's
 * algorithm would hold back until the peer's delayed ACK (~40 ms a collective). */
static void no_delay(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static ncclResult_t init_root(ncclComm_t c, const emu_id *e) {
    const int lfd = take_listener(e->nonce);
    if (lfd < 0)
        return fail(NULL, ncclInvalidUsage,
                    "ncclCommInitRank: rank 0 must run in the process that called ncclGetUniqueId (emulated "
                    "NCCL), or the id was used twice");
    const double deadline = now_s() + timeout_s();
    int joined = 1;
    ncclResult_t r = ncclSuccess;
    while (joined < c->nranks && r == ncclSuccess) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        const double left = deadline - now_s();
        if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0) {
            r = fail(NULL, ncclSystemError, "ncclCommInitRank: %d of %d ranks joined within %.0f s", joined,
                     c->nranks, timeout_s());
            break;
        }
        const int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        struct {
            uint64_t nonce;
            int32_t rank, nranks;
        } hello;
        struct timeval tv = {.tv_sec = 5};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (recv_all(fd, &hello, sizeof hello) || hello.nonce != e->nonce || hello.rank <= 0 ||
            hello.rank >= c->nranks || hello.nranks != c->nranks || c->fd[hello.rank] >= 0) {
            close(fd); /* not one of ours, or a rank given twice: ignored */
            continue;
        }
        struct timeval none = {0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
        no_delay(fd);
        c->fd[hello.rank] = fd;
        joined++;
    }
    close(lfd);
    for (int k = 1; k < c->nranks && r == ncclSuccess; k++) /* everyone joined: tell them */
        if (send_all(c->fd[k], "go", 2)) r = fail(NULL, ncclRemoteError, "ncclCommInitRank: rank %d left", k);
    return r;
}

static ncclResult_t init_peer(ncclComm_t c, const emu_id *e) {
    const double deadline = now_s() + timeout_s();
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons(e->port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (;;) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            no_delay(fd);
            c->fd[0] = fd;
            break;
        }
        if (fd >= 0) close(fd);
        if (now_s() > deadline)
            return fail(NULL, ncclSystemError,
                        "ncclCommInitRank: rank 0 at 127.0.0.1:%u not reachable within %.0f s", e->port,
                        timeout_s());
        usleep(20 * 1000);
    }
    struct {
        uint64_t nonce;
        int32_t rank, nranks;
    } hello = {e->nonce, c->rank, c->nranks};
    char go[2];
    struct timeval tv = {.tv_sec = (long)timeout_s()};
    setsockopt(c->fd[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (send_all(c->fd[0], &hello, sizeof hello) || recv_all(c->fd[0], go, 2) || memcmp(go, "go", 2))
        return fail(NULL, ncclRemoteError, "ncclCommInitRank: rank 0 did not complete the group");
    struct timeval none = {0};
    setsockopt(c->fd[0], SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return fail(NULL, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    emu_id e;
    memcpy(&e, id.internal, sizeof e);
    if (memcmp(e.magic, EMU_MAGIC, sizeof e.magic))
        return fail(NULL, ncclInvalidArgument, "ncclCommInitRank: not a unique id of the emulated NCCL");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(NULL, ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c || !(c->fd = malloc(sizeof(int) * (size_t)nranks))) {
        free(c);
        return fail(NULL, ncclSystemError, "ncclCommInitRank: out of memory");
    }
    for (int r = 0; r < nranks; r++) c->fd[r] = -1;
    c->rank = rank, c->nranks = nranks;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->idle, NULL);
    const ncclResult_t r = rank == 0 ? init_root(c, &e) : init_peer(c, &e);
    if (r != ncclSuccess) {
        comm_free(c);
        return r;
    }
    *comm = c;
    return ncclSuccess;
}

static int enter(ncclComm_t c) {
    pthread_mutex_lock(&c->lock);
    const int ok = !c->aborted;
    if (ok) c->inflight++;
    pthread_mutex_unlock(&c->lock);
    return ok;
}

static void leave(ncclComm_t c) {
    pthread_mutex_lock(&c->lock);
    if (--c->inflight == 0) pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->lock);
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    if (c->queued) { /* the queued collectives fail now rather than touch a freed communicator */
        pthread_mutex_lock(&c->lock);
        c->aborted = 1;
        pthread_mutex_unlock(&c->lock);
        ctrl_emu_stream_flush(c->queued_on);
    }
    pthread_mutex_lock(&c->lock);
    c->aborted = 1;
    for (int r = 0; r < c->nranks; r++) /* a collective blocked on these returns now */
        if (c->fd[r] >= 0) shutdown(c->fd[r], SHUT_RDWR);
    while (c->inflight) pthread_cond_wait(&c->idle, &c->lock);
    pthread_mutex_unlock(&c->lock);
    comm_free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (c && c->queued) ctrl_emu_stream_flush(c->queued_on); /* what was queued runs first */
    return ncclCommAbort(c);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
    if (!c || !err) return fail(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    *err = c->async_error;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

static size_t dtype_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    }
    return 0;
}

typedef struct {
    uint32_t op, dtype;
    int32_t root, arg;
    uint64_t bytes;
} frame;

static const char *op_name(uint32_t op) {
    return op == 1 ? "ncclBroadcast" : op == 2 ? "ncclAllReduce" : "ncclReduce";
}

/* Sends a frame and its data to rank `to`'s connection. */
static ncclResult_t put(ncclComm_t c, int fd, int to, const frame *f, const void *data) {
    if (send_all(fd, f, sizeof *f) || (f->bytes && send_all(fd, data, f->bytes)))
        return fail(c, ncclRemoteError, "%s: rank %d is gone (connection closed)", op_name(f->op), to);
    return ncclSuccess;
}

/* Receives a frame from rank `from` that must equal `want`, and its data into buf. */
static ncclResult_t get(ncclComm_t c, int fd, int from, const frame *want, void *buf) {
    frame f;
    if (recv_all(fd, &f, sizeof f))
        return fail(c, ncclRemoteError, "%s: rank %d is gone (connection closed)", op_name(want->op), from);
    if (memcmp(&f, want, sizeof f))
        return fail(c, ncclInvalidUsage,
                    "rank %d called %s(%llu bytes, datatype %u, root %d) while rank %d called %s(%llu bytes, "
                    "datatype "
                    "%u, root %d)",
                    from, op_name(f.op), (unsigned long long)f.bytes, f.dtype, f.root, c->rank,
                    op_name(want->op), (unsigned long long)want->bytes, want->dtype, want->root);
    if (want->bytes && recv_all(fd, buf, want->bytes))
        return fail(c, ncclRemoteError, "%s: rank %d is gone mid-transfer", op_name(want->op), from);
    return ncclSuccess;
}

static ncclResult_t broadcast_now(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt,
                                  int root, ncclComm_t c) {
    if (!c) return fail(NULL, ncclInvalidArgument, "ncclBroadcast: comm is NULL");
    const size_t es = dtype_size(dt);
    if (!es || root < 0 || root >= c->nranks || (c->rank == root && !sendbuff) || !recvbuff)
        return fail(c, ncclInvalidArgument, "ncclBroadcast: invalid datatype, root or buffer");
    if (!enter(c)) return fail(c, ncclInvalidUsage, "ncclBroadcast: the communicator was aborted");
    const frame f = {1, (uint32_t)dt, root, 0, (uint64_t)(count * es)};
    ncclResult_t r = ncclSuccess;
    if (c->rank == root && sendbuff != recvbuff) memmove(recvbuff, sendbuff, f.bytes);
    if (c->rank == 0) {
        if (root != 0) r = get(c, c->fd[root], root, &f, recvbuff);
        for (int k = 1; k < c->nranks && r == ncclSuccess; k++)
            if (k != root) r = put(c, c->fd[k], k, &f, recvbuff);
    } else if (c->rank == root) {
        r = put(c, c->fd[0], 0, &f, recvbuff);
    } else {
        r = get(c, c->fd[0], 0, &f, recvbuff);
    }
    leave(c);
    return r;
}

/* acc op= x, n values of dt; 0 when the datatype or operation is not emulated. */
static int reduce(void *acc, const void *x, size_t n, ncclDataType_t dt, ncclRedOp_t op) {
#define REDUCE(T)                                                                                            \
    for (size_t i = 0; i < n; i++) {                                                                         \
        T *a = (T *)acc + i, b = ((const T *)x)[i];                                                          \
        *a = op == ncclSum || op == ncclAvg ? *a + b                                                         \
             : op == ncclProd               ? *a * b                                                         \
             : op == ncclMax                ? (*a > b ? *a : b)                                              \
                                            : (*a < b ? *a : b);                                                            \
    }
    switch (dt) {
    case ncclFloat32: REDUCE(float) return 1;
    case ncclFloat64: REDUCE(double) return 1;
    case ncclInt32: REDUCE(int32_t) return 1;
    case ncclInt64: REDUCE(int64_t) return 1;
    case ncclUint8: REDUCE(uint8_t) return 1;
    default: return 0;
    }
#undef REDUCE
}

static ncclResult_t allreduce_now(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt,
                                  ncclRedOp_t op, ncclComm_t c) {
    if (!c) return fail(NULL, ncclInvalidArgument, "ncclAllReduce: comm is NULL");
    const size_t es = dtype_size(dt);
    if (!es || !sendbuff || !recvbuff || (op == ncclAvg && dt != ncclFloat32 && dt != ncclFloat64))
        return fail(c, ncclInvalidArgument, "ncclAllReduce: invalid datatype, operation or buffer");
    if (!enter(c)) return fail(c, ncclInvalidUsage, "ncclAllReduce: the communicator was aborted");
    const frame f = {2, (uint32_t)dt, 0, (int32_t)op, (uint64_t)(count * es)};
    ncclResult_t r = ncclSuccess;
    if (sendbuff != recvbuff) memmove(recvbuff, sendbuff, f.bytes);
    if (c->rank == 0) {
        void *tmp = malloc(f.bytes ? f.bytes : 1);
        if (!tmp) r = fail(c, ncclSystemError, "ncclAllReduce: out of memory");
        for (int k = 1; k < c->nranks && r == ncclSuccess; k++) {
            r = get(c, c->fd[k], k, &f, tmp);
            if (r == ncclSuccess && !reduce(recvbuff, tmp, count, dt, op))
                r = fail(c, ncclInvalidArgument, "ncclAllReduce: datatype %d not emulated", (int)dt);
        }
        free(tmp);
        if (r == ncclSuccess && op == ncclAvg)
            for (size_t i = 0; i < count; i++) {
                if (dt == ncclFloat32)
                    ((float *)recvbuff)[i] /= (float)c->nranks;
                else
                    ((double *)recvbuff)[i] /= c->nranks;
            }
        for (int k = 1; k < c->nranks && r == ncclSuccess; k++) r = put(c, c->fd[k], k, &f, recvbuff);
    } else {
        r = put(c, c->fd[0], 0, &f, recvbuff);
        if (r == ncclSuccess) r = get(c, c->fd[0], 0, &f, recvbuff);
    }
    leave(c);
    return r;
}

/* The ranks' sendbuffs reduced at rank 0 in rank order (as ncclAllReduce), the result sent to the
 * root's recvbuff (in place when it is the root's sendbuff); recvbuff is not read elsewhere. */
static ncclResult_t reduce_now(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt,
                               ncclRedOp_t op, int root, ncclComm_t c) {
    if (!c) return fail(NULL, ncclInvalidArgument, "ncclReduce: comm is NULL");
    const size_t es = dtype_size(dt);
    if (!es || !sendbuff || root < 0 || root >= c->nranks || (c->rank == root && !recvbuff) ||
        (op == ncclAvg && dt != ncclFloat32 && dt != ncclFloat64))
        return fail(c, ncclInvalidArgument, "ncclReduce: invalid datatype, operation, root or buffer");
    if (!enter(c)) return fail(c, ncclInvalidUsage, "ncclReduce: the communicator was aborted");
    const frame f = {3, (uint32_t)dt, root, (int32_t)op, (uint64_t)(count * es)};
    ncclResult_t r = ncclSuccess;
    if (c->rank == 0) {
        void *acc = malloc(f.bytes ? f.bytes : 1), *tmp = malloc(f.bytes ? f.bytes : 1);
        if (!acc || !tmp) r = fail(c, ncclSystemError, "ncclReduce: out of memory");
        if (r == ncclSuccess) memcpy(acc, sendbuff, f.bytes);
        for (int k = 1; k < c->nranks && r == ncclSuccess; k++) {
            r = get(c, c->fd[k], k, &f, tmp);
            if (r == ncclSuccess && !reduce(acc, tmp, count, dt, op))
                r = fail(c, ncclInvalidArgument, "ncclReduce: datatype %d not emulated", (int)dt);
        }
        if (r == ncclSuccess && op == ncclAvg)
            for (size_t i = 0; i < count; i++) {
                if (dt == ncclFloat32)
                    ((float *)acc)[i] /= (float)c->nranks;
                else
                    ((double *)acc)[i] /= c->nranks;
            }
        if (r == ncclSuccess && root == 0) memcpy(recvbuff, acc, f.bytes);
        if (r == ncclSuccess && root != 0) r = put(c, c->fd[root], root, &f, acc);
        free(acc), free(tmp);
    } else {
        r = put(c, c->fd[0], 0, &f, sendbuff);
        if (r == ncclSuccess && c->rank == root) r = get(c, c->fd[0], 0, &f, recvbuff);
    }
    leave(c);
    return r;
}

/* A collective's arguments, run now or when its stream's queue reaches it. */
typedef struct {
    int what; /* 1 broadcast, 2 all-reduce, 3 reduce (frame.op) */
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root;
    ncclComm_t comm;
} collective;

static ncclResult_t run(const collective *k) {
    if (k->what == 1) return broadcast_now(k->sendbuff, k->recvbuff, k->count, k->dt, k->root, k->comm);
    if (k->what == 2) return allreduce_now(k->sendbuff, k->recvbuff, k->count, k->dt, k->op, k->comm);
    return reduce_now(k->sendbuff, k->recvbuff, k->count, k->dt, k->op, k->root, k->comm);
}

/* The runtime's callback for a queued collective: run, its failure reported on stderr (the stream's
 * waiter sees cudaErrorLaunchFailure; ncclCommGetAsyncError says ncclRemoteError for a lost peer). */
static int run_queued(void *arg) {
    collective *k = arg;
    const ncclResult_t r = run(k);
    k->comm->queued--;
    if (r != ncclSuccess) {
        if (k->comm->async_error == ncclSuccess) k->comm->async_error = r;
        fprintf(stderr, "emulated NCCL: %s queued on a stream failed: %s\n", op_name((uint32_t)k->what),
                k->comm->last_error);
    }
    free(k);
    return r != ncclSuccess;
}

/* The communicator's collectives still queued run first (NCCL runs them in issue order); then k runs
 * now (stream 0) or is queued on its stream. */
static ncclResult_t submit(collective k, cudaStream_t stream) {
    ncclComm_t c = k.comm;
    if (!c) return fail(NULL, ncclInvalidArgument, "%s: comm is NULL", op_name((uint32_t)k.what));
    if (c->queued && c->queued_on != stream) ctrl_emu_stream_flush(c->queued_on);
    collective *q = stream ? malloc(sizeof *q) : NULL;
    if (q) *q = k;
    if (q && ctrl_emu_stream_defer(stream, run_queued, q) == 0) {
        c->queued++, c->queued_on = stream;
        return ncclSuccess;
    }
    free(q); /* stream 0 (or one the runtime does not know): now */
    return run(&k);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt, int root,
                           ncclComm_t c, cudaStream_t stream) {
    return submit((collective){1, sendbuff, recvbuff, count, dt, ncclSum, root, c}, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t stream) {
    return submit((collective){2, sendbuff, recvbuff, count, dt, op, 0, c}, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                        int root, ncclComm_t c, cudaStream_t stream) {
    return submit((collective){3, sendbuff, recvbuff, count, dt, op, root, c}, stream);
}
