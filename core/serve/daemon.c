/* ctrl serve's libmicrohttpd daemon: a thread per connection (requests wait for the batcher side
 * by side). Each request's route is looked up when its headers are in; its body is gathered up to
 * the route's limit (413 past it) within the upload deadline (the connection is closed past it);
 * then the API key is checked and the route's handler answers. Idle connections are closed after
 * timeout_s (libmicrohttpd's connection timeout), headers not complete within timeout_s too
 * (deadline.c), and connections are limited in all and per address, so partial requests cannot
 * hold the server. */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/serve_internal.h"

typedef struct request {
    const serve_route *route; /* NULL: `status` answers */
    unsigned status;
    char *data;
    size_t len;
    int too_big;
    int counted;  /* in the server's in_flight */
    int draining; /* a POST whose headers came after the stop signal: refused (503) */
    struct timespec start;
} request;

static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

static int authorized(const ctrl_server *s, struct MHD_Connection *c) {
    const char *key = s->opt->api_key;
    if (!key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, key);
}

/* The body's bytes so far; 0 to close the connection: the upload deadline passed (timeout_s for a
 * JSON body; a weights body gets timeout_s more per 64 MiB received). */
static int gather(ctrl_server *s, request *q, const char *upload, size_t n) {
    if (since(&q->start) > (double)s->opt->timeout_s * (double)(1 + (q->len >> 26))) return 0;
    const size_t limit = q->route && q->route->large_body ? s->weights_body : s->opt->max_body;
    if (q->len + n > limit) q->too_big = 1;
    if (q->too_big || !q->route || q->draining) return 1; /* read and dropped */
    char *p = realloc(q->data, q->len + n + 1);
    if (!p) return q->too_big = 1, 1;
    q->data = p;
    memcpy(q->data + q->len, upload, n);
    q->len += n;
    q->data[q->len] = 0;
    return 1;
}

static enum MHD_Result answer(ctrl_server *s, struct MHD_Connection *c, const request *q) {
    static const char *const why[] = {"no such endpoint", "method not allowed",
                                      "missing or wrong API key (Authorization: Bearer KEY)"};
    if (!q->route) return serve_error(c, q->status, why[q->status == 405 ? 1 : q->status == 401 ? 2 : 0]);
    if (q->too_big) return serve_error(c, 413, "request body too large");
    if (q->draining) return serve_error(c, 503, "the server is shutting down (draining)");
    if (!q->route->json) return q->route->fn(s, c, NULL, q->data, q->len);
    cJSON *in = q->len ? cJSON_ParseWithLength(q->data, q->len) : cJSON_CreateObject();
    const enum MHD_Result ret = cJSON_IsObject(in) ? q->route->fn(s, c, in, q->data, q->len)
                                                   : serve_error(c, 400, "the body is not a JSON object");
    cJSON_Delete(in);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version;
    ctrl_server *s = cls;
    request *q = *state;
    if (!q) { /* first call: the headers are in */
        if (!(q = calloc(1, sizeof *q))) return MHD_NO;
        clock_gettime(CLOCK_MONOTONIC, &q->start);
        q->route = serve_route_find(method, url, &q->status);
        if (q->route && q->route->auth && !authorized(s, c)) /* refused now: its body is not kept */
            q->route = NULL, q->status = 401;
        q->counted = !strcmp(method, "POST");          /* what the drain waits for; GETs answer at once */
        q->draining = q->counted && serve_draining(s); /* in flight before the signal: it runs on */
        *state = q;
        serve_deadline_request(s->deadline, c, 1);
        pthread_mutex_lock(&s->lock);
        s->in_flight += q->counted;
        pthread_mutex_unlock(&s->lock);
        return MHD_YES;
    }
    if (*upload_size) {
        const int keep = gather(s, q, upload, *upload_size);
        *upload_size = 0;
        return keep ? MHD_YES : MHD_NO;
    }
    return answer(s, c, q);
}

static void finished(void *cls, struct MHD_Connection *c, void **state,
                     enum MHD_RequestTerminationCode code) {
    (void)code;
    ctrl_server *s = cls;
    request *q = *state;
    if (q) {
        serve_deadline_request(s->deadline, c, 0);
        pthread_mutex_lock(&s->lock);
        s->in_flight -= q->counted;
        pthread_mutex_unlock(&s->lock);
        free(q->data), free(q);
    }
    *state = NULL;
}

struct MHD_Daemon *serve_daemon_start(ctrl_server *s) {
    const ctrl_serve_options *o = s->opt;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host, &addr.sin_addr) != 1) return NULL;
    return MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                                MHD_USE_ERROR_LOG,
                            (uint16_t)o->port, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR, &addr,
                            MHD_OPTION_NOTIFY_COMPLETED, finished, s, MHD_OPTION_NOTIFY_CONNECTION,
                            serve_deadline_notify, s->deadline, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o->max_per_ip, MHD_OPTION_END);
}
