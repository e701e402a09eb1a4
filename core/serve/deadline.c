/* ctrl serve's header deadline: libmicrohttpd closes a connection that sends nothing for
 * timeout_s, but one that trickles its headers a byte at a time stays within that forever (until
 * the header buffer fills, hours later). So every connection is tracked from the moment it opens
 * or finishes a request; a watchdog thread shuts down the socket of one whose next request's
 * headers are not complete within timeout_s (the connection's thread then sees the peer gone and
 * closes it). Bodies have their own deadline (daemon.c). */
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "serve/serve_internal.h"

typedef struct conn {
    int fd;
    struct timespec since; /* opened, or its last request finished */
    int in_request;        /* headers in: the request's own limits apply */
    int shut;
    struct conn *prev, *next;
} conn;

struct serve_deadline {
    int timeout_s;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    conn *head;
    int stop;
    pthread_t thread;
};

static double age(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

static void *watch(void *arg) {
    serve_deadline *w = arg;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        for (conn *c = w->head; c; c = c->next)
            if (!c->in_request && !c->shut && age(&c->since) > w->timeout_s) {
                shutdown(c->fd, SHUT_RDWR); /* the fd is open: CLOSED removes it under this lock first */
                c->shut = 1;
            }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&w->wake, &w->lock, &until);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

serve_deadline *serve_deadline_start(int timeout_s) {
    serve_deadline *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->timeout_s = timeout_s;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    if (pthread_create(&w->thread, NULL, watch, w) != 0) {
        pthread_mutex_destroy(&w->lock), pthread_cond_destroy(&w->wake);
        free(w);
        return NULL;
    }
    return w;
}

void serve_deadline_stop(serve_deadline *w) {
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    while (w->head) {
        conn *c = w->head;
        w->head = c->next;
        free(c);
    }
    pthread_mutex_destroy(&w->lock), pthread_cond_destroy(&w->wake);
    free(w);
}

void serve_deadline_notify(void *cls, struct MHD_Connection *connection, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe) {
    serve_deadline *w = cls;
    conn *c = *socket_context;
    pthread_mutex_lock(&w->lock);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
        c = info ? calloc(1, sizeof *c) : NULL;
        if (c) {
            c->fd = info->connect_fd;
            clock_gettime(CLOCK_MONOTONIC, &c->since);
            c->next = w->head;
            if (w->head) w->head->prev = c;
            w->head = c;
        }
        *socket_context = c;
    } else if (c) { /* closed */
        if (c->prev) c->prev->next = c->next;
        if (c->next) c->next->prev = c->prev;
        if (w->head == c) w->head = c->next;
        free(c);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&w->lock);
}

void serve_deadline_request(serve_deadline *w, struct MHD_Connection *connection, int started) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn *c = info ? info->socket_context : NULL;
    if (!c) return;
    pthread_mutex_lock(&w->lock);
    c->in_request = started;
    if (!started) clock_gettime(CLOCK_MONOTONIC, &c->since);
    pthread_mutex_unlock(&w->lock);
}
