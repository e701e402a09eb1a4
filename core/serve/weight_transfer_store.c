/* The rendezvous of vLLM's NCCL weight-transfer engine, server side: the client half of torch's
 * TCPStore wire protocol (torch/csrc/distributed/c10d/TCPStore.cpp, the store the trainer hosts as
 * rank 0 of vLLM's StatelessProcessGroup) and the NCCL unique id that rank 0 publishes there as a
 * pickled ncclUniqueId (StatelessProcessGroup.broadcast_obj). See weight_transfer.h.
 *
 * The protocol: a request is a 1-byte query type, then its arguments -- strings and byte strings
 * as a little-endian uint64 length and the bytes, numbers as their little-endian bytes; a new
 * client sends VALIDATE (the magic 0x3C85F7CE) and PING (a nonce it gets back); one whose store
 * has a world size adds 1 to the key "init/" (the master waits for world_size of them); GET waits
 * for the key first (WAIT: a key count and keys, answered by one STOP_WAITING byte; on a timeout
 * CANCEL_WAIT, answered WAIT_CANCELED) and is answered by the value. The Python API's keys travel
 * with the prefix "/". */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "serve/weight_transfer.h"

enum { Q_VALIDATE = 0, Q_GET = 3, Q_ADD = 4, Q_WAIT = 6, Q_CANCEL_WAIT = 12, Q_PING = 13 };
enum { STOP_WAITING = 0, WAIT_CANCELED = 1 };
#define VALIDATION_MAGIC 0x3C85F7CEu

struct serve_store {
    int fd;
    char where[300]; /* host:port, for messages */
};

static ctrl_status io_error(serve_store *s, const char *what) {
    return ctrl_error_set(CTRL_ERR_IO, "the trainer's TCPStore at %s: %s: %s", s->where, what,
                          errno ? strerror(errno) : "connection closed");
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

/* n bytes within the deadline (a monotonic time); -1 on a closed connection, -2 on the deadline. */
static int recv_by(int fd, void *p, size_t n, double deadline) {
    char *c = p;
    while (n) {
        const double left = deadline - ctrl_now();
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (left <= 0) return -2;
        const int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) return -2;
        const ssize_t k = recv(fd, c, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

/* A request: the query byte, then `n` pieces (a string piece is sent as length + bytes). */
static int put_string(uint8_t *buf, size_t *at, size_t cap, const char *str) {
    const uint64_t len = strlen(str);
    if (*at + 8 + len > cap) return -1;
    memcpy(buf + *at, &len, 8);
    memcpy(buf + *at + 8, str, len);
    *at += 8 + len;
    return 0;
}

static ctrl_status validate_and_ping(serve_store *s, double deadline) {
    uint8_t req[5] = {Q_VALIDATE};
    const uint32_t magic = VALIDATION_MAGIC, nonce = (uint32_t)getpid();
    memcpy(req + 1, &magic, 4);
    if (send_all(s->fd, req, 5)) return io_error(s, "validate");
    req[0] = Q_PING;
    memcpy(req + 1, &nonce, 4);
    uint32_t back = 0;
    if (send_all(s->fd, req, 5) || recv_by(s->fd, &back, 4, deadline)) return io_error(s, "ping");
    if (back != nonce)
        return ctrl_error_set(CTRL_ERR_FORMAT, "the trainer's TCPStore at %s: bad ping answer", s->where);
    return CTRL_OK;
}

ctrl_status serve_store_connect(const char *host, int port, double timeout_s, serve_store **out) {
    *out = NULL;
    serve_store *s = calloc(1, sizeof *s);
    if (!s) return ctrl_error_set(CTRL_ERR_NOMEM, "TCPStore client: out of memory");
    s->fd = -1;
    snprintf(s->where, sizeof s->where, "%s:%d", host, port);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    const double deadline = ctrl_now() + timeout_s;
    ctrl_status st = CTRL_OK;
    for (;;) { /* the trainer may open its store just after our request arrives: retry until the deadline */
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        const int rc = getaddrinfo(host, ps, &hints, &ai);
        if (rc != 0) {
            st = ctrl_error_set(CTRL_ERR_CONFIG, "init_info.master_address: %s: %s", host, gai_strerror(rc));
            break;
        }
        for (struct addrinfo *a = ai; a && s->fd < 0; a = a->ai_next) {
            s->fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (s->fd >= 0 && connect(s->fd, a->ai_addr, a->ai_addrlen) != 0) close(s->fd), s->fd = -1;
        }
        freeaddrinfo(ai);
        if (s->fd >= 0) {
            st = validate_and_ping(s, deadline);
            if (st == CTRL_OK) break;
            close(s->fd), s->fd = -1;
        }
        if (ctrl_now() > deadline) {
            st = ctrl_error_set(
                CTRL_ERR_IO,
                "the trainer's TCPStore at %s did not answer within %.0f s (is the trainer joining "
                "the group, and is master_address reachable from this server?)",
                s->where, timeout_s);
            break;
        }
        usleep(50 * 1000);
    }
    if (st != CTRL_OK) {
        serve_store_close(s);
        return st;
    }
    *out = s;
    return CTRL_OK;
}

void serve_store_close(serve_store *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    free(s);
}

ctrl_status serve_store_add(serve_store *s, const char *key, int64_t delta, int64_t *value,
                            double timeout_s) {
    uint8_t req[512] = {Q_ADD};
    size_t at = 1;
    if (put_string(req, &at, sizeof req - 8, key))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "TCPStore key too long: %s", key);
    memcpy(req + at, &delta, 8);
    at += 8;
    if (send_all(s->fd, req, at) || recv_by(s->fd, value, 8, ctrl_now() + timeout_s))
        return io_error(s, "add");
    return CTRL_OK;
}

ctrl_status serve_store_get(serve_store *s, const char *key, double timeout_s, uint8_t **val, size_t *len) {
    *val = NULL, *len = 0;
    uint8_t req[512] = {Q_WAIT};
    size_t at = 1;
    const uint64_t one = 1;
    memcpy(req + at, &one, 8);
    at += 8;
    if (put_string(req, &at, sizeof req, key))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "TCPStore key too long: %s", key);
    const double deadline = ctrl_now() + timeout_s;
    if (send_all(s->fd, req, at)) return io_error(s, "wait");
    uint8_t resp = 0;
    int r = recv_by(s->fd, &resp, 1, deadline);
    if (r == -2) { /* cancel the wait, as torch's client does, and say what was missing */
        const uint8_t cancel = Q_CANCEL_WAIT;
        (void)send_all(s->fd, &cancel, 1);
        return ctrl_error_set(
            CTRL_ERR_IO,
            "the trainer's TCPStore at %s: no '%s' within %.0f s (the trainer did not publish "
            "its NCCL unique id)",
            s->where, key, timeout_s);
    }
    if (r || resp != STOP_WAITING) return io_error(s, "wait");
    req[0] = Q_GET;
    at = 1;
    put_string(req, &at, sizeof req, key);
    uint64_t n = 0;
    if (send_all(s->fd, req, at) || recv_by(s->fd, &n, 8, deadline)) return io_error(s, "get");
    if (n > (1u << 20))
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "the trainer's TCPStore at %s: '%s' is %llu bytes (at most 1 MiB)", s->where,
                              key, (unsigned long long)n);
    uint8_t *b = malloc(n ? n : 1);
    if (!b) return ctrl_error_set(CTRL_ERR_NOMEM, "TCPStore client: out of memory");
    if (recv_by(s->fd, b, n, deadline)) {
        free(b);
        return io_error(s, "get");
    }
    *val = b, *len = n;
    return CTRL_OK;
}

/* The pickle opcodes that a pickled ctypes Structure uses (protocols 2 to 5), and how many bytes
 * of argument each has (-1: a length-prefixed argument, read below; -2: newline-terminated
 * lines, GLOBAL's two). Anything else is refused. */
static int pickle_arg(uint8_t op, const uint8_t *p, size_t left, size_t *arg, size_t *skip) {
    *arg = 0;
    switch (op) {
    case 0x80: *skip = 1; return 0; /* PROTO */
    case 0x95: *skip = 8; return 0; /* FRAME */
    case 0x94:
    case '.':
    case '}':
    case ')':
    case 0x85:
    case 0x86:
    case 0x87:
    case 'R':
    case 't':
    case '(':
    case 'N':
    case 'b':
    case 0x93:
    case '0':
    case 0x88:
    case 0x89:
        *skip = 0;
        return 0; /* MEMOIZE STOP EMPTY_DICT EMPTY_TUPLE TUPLE1-3 REDUCE TUPLE MARK NONE BUILD STACK_GLOBAL
                     POP NEWTRUE NEWFALSE */
    case 'q':
    case 'h':
    case 'K': *skip = 1; return 0; /* BINPUT BINGET BININT1 */
    case 'r':
    case 'j':
    case 'J': *skip = 4; return 0; /* LONG_BINPUT LONG_BINGET BININT */
    case 'M': *skip = 2; return 0; /* BININT2 */
    case 0x8c:
    case 'C':
    case 'U': /* SHORT_BINUNICODE SHORT_BINBYTES SHORT_BINSTRING */
        if (left < 1) return -1;
        *arg = p[0], *skip = 1 + p[0];
        return 0;
    case 'X':
    case 'B':
    case 'T': { /* BINUNICODE BINBYTES BINSTRING */
        if (left < 4) return -1;
        uint32_t n;
        memcpy(&n, p, 4);
        *arg = n, *skip = 4 + (size_t)n;
        return 0;
    }
    case 'c': { /* GLOBAL "module\nname\n" */
        const uint8_t *a = memchr(p, '\n', left),
                      *b = a ? memchr(a + 1, '\n', left - (size_t)(a + 1 - p)) : NULL;
        if (!b) return -1;
        *skip = (size_t)(b + 1 - p);
        return 0;
    }
    default: return -1;
    }
}

ctrl_status serve_unpickle_nccl_id(const uint8_t *p, size_t n, uint8_t id[128]) {
    int found = 0, named = 0;
    for (size_t at = 0; at < n;) {
        const uint8_t op = p[at++];
        size_t arg = 0, skip = 0;
        if (pickle_arg(op, p + at, n - at, &arg, &skip) || skip > n - at)
            return ctrl_error_set(CTRL_ERR_FORMAT,
                                  "the NCCL unique id from the trainer's store is not a pickled ncclUniqueId "
                                  "(opcode 0x%02x at byte %zu)",
                                  op, at - 1);
        const uint8_t *a = p + at + (skip - arg);
        if ((op == 'C' || op == 'B') && arg == 128) memcpy(id, a, 128), found++;
        if ((op == 0x8c || op == 'X') && arg == 12 && !memcmp(a, "ncclUniqueId", 12)) named = 1;
        if (op == 'c' && memmem(p + at, skip, "\nncclUniqueId\n", 14)) named = 1;
        at += skip;
        if (op == '.') break;
    }
    if (!named || found != 1)
        return ctrl_error_set(
            CTRL_ERR_FORMAT, "the NCCL unique id from the trainer's store is not a pickled ncclUniqueId (%s)",
            !named ? "no ncclUniqueId class" : "not one 128-byte id");
    return CTRL_OK;
}
