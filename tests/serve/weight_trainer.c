/* See weight_trainer.h. The store keeps its keys in a small table under one lock; a thread per
 * connection answers its commands in order, as torch's (non-libuv) master does. */
#include "weight_trainer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_KEYS 64
#define MAX_CONN 16

struct wt_trainer {
    int lfd, stop;
    pthread_t acceptor;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    struct {
        char *key;
        uint8_t *val;
        size_t len;
    } kv[MAX_KEYS];
    int nkv;
    int conn[MAX_CONN], nconn;
    pthread_t conn_thread[MAX_CONN];
    ncclComm_t comm;
    ncclUniqueId id; /* published in the store */
};

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

static int send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        const ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

/* A length-prefixed string (malloc'd, NUL-terminated), *len its length. */
static uint8_t *recv_bytes(int fd, size_t *len) {
    uint64_t n = 0;
    if (recv_all(fd, &n, 8) || n > (1u << 24)) return NULL;
    uint8_t *b = malloc(n + 1);
    if (!b || recv_all(fd, b, n)) return free(b), NULL;
    b[n] = 0, *len = n;
    return b;
}

/* The slot of key (under the lock); -1 when absent. */
static int find(wt_trainer *t, const char *key) {
    for (int i = 0; i < t->nkv; i++)
        if (!strcmp(t->kv[i].key, key)) return i;
    return -1;
}

static void set(wt_trainer *t, const char *key, const uint8_t *val, size_t len) {
    pthread_mutex_lock(&t->lock);
    int i = find(t, key);
    if (i < 0 && t->nkv < MAX_KEYS) i = t->nkv++, t->kv[i].key = strdup(key), t->kv[i].val = NULL;
    if (i >= 0) {
        free(t->kv[i].val);
        t->kv[i].val = malloc(len ? len : 1), t->kv[i].len = len;
        memcpy(t->kv[i].val, val, len);
    }
    pthread_cond_broadcast(&t->changed);
    pthread_mutex_unlock(&t->lock);
}

static int64_t add(wt_trainer *t, const char *key, int64_t delta) {
    pthread_mutex_lock(&t->lock);
    const int i = find(t, key);
    char buf[32];
    const int64_t v = (i >= 0 ? strtoll((const char *)t->kv[i].val, NULL, 10) : 0) + delta;
    pthread_mutex_unlock(&t->lock);
    const int n = snprintf(buf, sizeof buf, "%lld", (long long)v);
    set(t, key, (const uint8_t *)buf, (size_t)n + 1); /* with the NUL: read back by strtoll */
    return v;
}

/* Whether every key of keys[n] is in the store. */
static int all_there(wt_trainer *t, char **keys, uint64_t n) {
    pthread_mutex_lock(&t->lock);
    int ok = 1;
    for (uint64_t i = 0; i < n && ok; i++) ok = find(t, keys[i]) >= 0;
    pthread_mutex_unlock(&t->lock);
    return ok;
}

/* WAIT: answers STOP_WAITING (0) once every key is there, or WAIT_CANCELED (1) after a
 * CANCEL_WAIT (12) from the client; -1 when the connection closed. */
static int wait_keys(wt_trainer *t, int fd, char **keys, uint64_t n) {
    for (;;) {
        if (all_there(t, keys, n)) return send_all(fd, "\0", 1);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10) > 0) {
            uint8_t q;
            if (recv_all(fd, &q, 1) || q != 12) return -1;
            return send_all(fd, "\1", 1);
        }
        if (t->stop) return -1;
    }
}

static void *serve_conn(void *arg) {
    void **a = arg;
    wt_trainer *t = a[0];
    const int fd = (int)(intptr_t)a[1];
    free(arg);
    for (;;) {
        uint8_t q;
        if (recv_all(fd, &q, 1)) break;
        size_t len = 0, vlen = 0;
        if (q == 0 || q == 13) { /* VALIDATE magic / PING nonce */
            uint32_t v;
            if (recv_all(fd, &v, 4) || (q == 0 && v != 0x3C85F7CEu) || (q == 13 && send_all(fd, &v, 4)))
                break;
        } else if (q == 1) { /* SET key value */
            uint8_t *k = recv_bytes(fd, &len), *v = k ? recv_bytes(fd, &vlen) : NULL;
            if (v) set(t, (char *)k, v, vlen);
            free(k), free(v);
            if (!v) break;
        } else if (q == 3) { /* GET key */
            uint8_t *k = recv_bytes(fd, &len);
            if (!k) break;
            pthread_mutex_lock(&t->lock);
            const int i = find(t, (char *)k);
            uint64_t n = i >= 0 ? t->kv[i].len : 0;
            uint8_t *copy = malloc(n ? n : 1);
            if (i >= 0) memcpy(copy, t->kv[i].val, n);
            pthread_mutex_unlock(&t->lock);
            const int bad = send_all(fd, &n, 8) || send_all(fd, copy, n);
            free(copy), free(k);
            if (bad) break;
        } else if (q == 4) { /* ADD key delta */
            uint8_t *k = recv_bytes(fd, &len);
            int64_t d = 0, v;
            if (!k || recv_all(fd, &d, 8)) break;
            v = add(t, (char *)k, d);
            free(k);
            if (send_all(fd, &v, 8)) break;
        } else if (q == 6 || q == 5) { /* WAIT / CHECK: a count and keys */
            uint64_t n = 0;
            if (recv_all(fd, &n, 8) || n > 64) break;
            char *keys[64];
            uint64_t got = 0;
            while (got < n && (keys[got] = (char *)recv_bytes(fd, &len))) got++;
            const int bad = got < n || (q == 6 ? wait_keys(t, fd, keys, n)
                                               : send_all(fd, all_there(t, keys, n) ? "\0" : "\1", 1));
            while (got) free(keys[--got]);
            if (bad) break;
        } else {
            break; /* a command this store does not know: torch's master closes the connection too */
        }
    }
    shutdown(fd, SHUT_RDWR); /* closed by wt_trainer_free, after this thread ended */
    return NULL;
}

static void *accept_loop(void *arg) {
    wt_trainer *t = arg;
    while (!t->stop) {
        struct pollfd p = {.fd = t->lfd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        const int fd = accept(t->lfd, NULL, NULL);
        if (fd < 0) continue;
        void **a = malloc(2 * sizeof *a);
        pthread_mutex_lock(&t->lock);
        const int slot = t->nconn < MAX_CONN ? t->nconn++ : -1;
        if (slot >= 0) t->conn[slot] = fd;
        pthread_mutex_unlock(&t->lock);
        if (slot < 0 || !a) {
            close(fd), free(a);
            continue;
        }
        a[0] = t, a[1] = (void *)(intptr_t)fd;
        pthread_create(&t->conn_thread[slot], NULL, serve_conn, a);
    }
    return NULL;
}

wt_trainer *wt_trainer_start(int *port) {
    wt_trainer *t = calloc(1, sizeof *t);
    FILE *f = fopen(CTRL_FIXTURE_DIR "/serve/nccl_unique_id.pickle", "rb");
    uint8_t pk[1024];
    const size_t n = f ? fread(pk, 1, sizeof pk, f) : 0;
    if (f) fclose(f);
    ncclUniqueId id;
    uint8_t pattern[128];
    for (int i = 0; i < 128; i++) pattern[i] = (uint8_t)(7 * i);
    uint8_t *at = n ? memmem(pk, n, pattern, 128) : NULL;
    if (!t || !at || ncclGetUniqueId(&id) != ncclSuccess) return free(t), NULL;
    memcpy(at, id.internal, 128);
    t->id = id;
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->changed, NULL);
    t->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(t->lfd, (struct sockaddr *)&a, sizeof a) || listen(t->lfd, 16) ||
        getsockname(t->lfd, (struct sockaddr *)&a, &al))
        return close(t->lfd), free(t), NULL;
    *port = ntohs(a.sin_port);
    add(t, "init/", 1); /* the master itself, as torch's does */
    set(t, "/broadcast_from/0/0", pk, n);
    pthread_create(&t->acceptor, NULL, accept_loop, t);
    return t;
}

int wt_trainer_join(wt_trainer *t, int world, double timeout_s) {
    const time_t end = time(NULL) + (time_t)timeout_s + 1;
    for (;;) {
        pthread_mutex_lock(&t->lock);
        const int i = find(t, "init/");
        const long joined = i >= 0 ? strtol((const char *)t->kv[i].val, NULL, 10) : 0;
        pthread_mutex_unlock(&t->lock);
        if (joined >= world) break;
        if (time(NULL) > end) return -1;
        usleep(10 * 1000);
    }
    /* the id the store holds was made in this process: rank 0 runs here */
    if (ncclCommInitRank(&t->comm, world, t->id, 0) != ncclSuccess) return -1;
    float one = 0;
    return ncclAllReduce(&one, &one, 1, ncclFloat32, ncclSum, t->comm, NULL) == ncclSuccess ? 0 : -1;
}

ncclComm_t wt_trainer_comm(wt_trainer *t) { return t->comm; }

void wt_trainer_free(wt_trainer *t) {
    if (!t) return;
    if (t->comm) ncclCommAbort(t->comm);
    t->stop = 1;
    pthread_join(t->acceptor, NULL);
    pthread_mutex_lock(&t->lock);
    for (int i = 0; i < t->nconn; i++) shutdown(t->conn[i], SHUT_RDWR);
    const int nconn = t->nconn;
    pthread_mutex_unlock(&t->lock);
    for (int i = 0; i < nconn; i++) pthread_join(t->conn_thread[i], NULL), close(t->conn[i]);
    close(t->lfd);
    for (int i = 0; i < t->nkv; i++) free(t->kv[i].key), free(t->kv[i].val);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->changed);
    free(t);
}
