/* vLLM's NCCL weight-transfer engine, server side (weight_transfer.h; docs/serve.md "NCCL weight
 * transfer"). The trainer (TRL's VLLMClient) is rank 0 of a group of rank_offset + 1 ranks and
 * hosts its rendezvous (a torch TCPStore); ctrl serve is one worker, rank rank_offset.
 *   /init_weight_transfer_engine {init_info}: joins the store, reads the NCCL unique id rank 0
 *     published, joins the NCCL group on the model's CUDA device and runs vLLM's warm-up
 *     all-reduce (one float) with the trainer.
 *   /start_weight_update, /finish_weight_update: bracket updates; finish flushes the prefix cache.
 *   /update_weights {update_info: names, dtype_names, shapes[, packed]}: receives the trainer's
 *     broadcasts -- one per tensor, or packed: the tensors' bytes concatenated into chunks that end
 *     at the first tensor taking the running size past packed_buffer_size_bytes (vLLM's
 *     packed_nccl_broadcast_consumer, 1 GiB by default) -- into device memory, copies each chunk to
 *     the host, converts it to the model's fp32 master weights under ctrl's Hugging Face names (as
 *     POST /update_weights with a safetensors body names them) and, once every tensor arrived and
 *     was found finite, writes them all between two generations and flushes the prefix cache.
 * Everything the update_info says is checked before the first byte arrives. A tensor the model
 * cannot take (an unknown name, a shape or dtype that does not fit) is still received, so that the
 * trainer's broadcast completes, and the update is refused whole (400) with the model unchanged.
 * An update_info whose byte layout cannot be known (a missing field, lists of different lengths,
 * an unknown dtype) cannot be matched to the trainer's broadcasts: the group is closed and the
 * answer says to initialise again. A broadcast that fails (the trainer died, its group was closed)
 * or makes no progress for --weight-transfer-timeout-s is aborted (ncclCommAbort, from a watchdog
 * thread, as torch's NCCL watchdog does): the update fails with the model unchanged and the group
 * closed. Answers are vLLM's ({"message": ...}); errors are OpenAI's shape. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ctrl/log.h>

#include "clock.h"
#include "device/backend.h"
#include "device/cuda_backend.h"
#include "serve/serve_internal.h"
#include "serve/weight_transfer.h"

struct serve_wt {
    pthread_mutex_t lock; /* one weight-transfer call at a time */
    const serve_nccl *nccl;
    void *comm; /* NULL: no group */
    int rank, world, packed, updating;
    int64_t packed_bytes;
    char closed[600]; /* why the last group is gone ("" when none was made) */
};

/* The engine of s, made on first use (under the server's lock). */
static serve_wt *wt_of(ctrl_server *s) {
    pthread_mutex_lock(&s->lock);
    if (!s->wt && (s->wt = calloc(1, sizeof *s->wt))) pthread_mutex_init(&s->wt->lock, NULL);
    serve_wt *w = s->wt;
    pthread_mutex_unlock(&s->lock);
    return w;
}

void serve_wt_free(ctrl_server *s) {
    serve_wt *w = s->wt;
    if (!w) return;
    if (w->comm) w->nccl->comm_abort(w->comm);
    pthread_mutex_destroy(&w->lock);
    free(w);
    s->wt = NULL;
}

static int on_device(ctrl_server *s) {
    const ctrl_backend_ops *be = ctrl_model_backend(s->model);
    return be && !be->host_memory;
}

cJSON *serve_wt_config(ctrl_server *s) {
    if (!on_device(s)) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "backend", "nccl");
    return o;
}

static enum MHD_Result message(struct MHD_Connection *c, const char *text) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "message", text);
    return serve_reply(c, 200, o);
}

/* Closes the group (if any), saying why for later calls. */
static void close_group(serve_wt *w, const char *why) {
    if (w->comm) w->nccl->comm_abort(w->comm);
    w->comm = NULL, w->updating = 0;
    snprintf(w->closed, sizeof w->closed, "%.590s", why);
}

/* 409 when there is no group (with why the last one closed), else 0. */
static enum MHD_Result no_group(serve_wt *w, struct MHD_Connection *c) {
    char msg[900];
    snprintf(msg, sizeof msg, "no NCCL weight-transfer group: %s%s; POST /init_weight_transfer_engine first",
             w->closed[0] ? "the last one was closed: " : "none was initialised", w->closed);
    return serve_error(c, 409, msg);
}

/* An integer field of o in [lo, hi]: 0, -1 absent, -2 present but not one (msg says so). */
static int int_field(const cJSON *o, const char *key, double lo, double hi, int64_t *out, char *msg,
                     size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return -1;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return snprintf(msg, cap, "init_info.%s: an integer between %.0f and %.0f", key, lo, hi), -2;
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* init_info read into w's fields and host/port; 0 or a 400's message. */
static int read_init_info(const cJSON *ii, serve_wt *w, char *host, size_t hcap, int *port, char *msg,
                          size_t cap) {
    if (!cJSON_IsObject(ii))
        return snprintf(msg, cap, "init_info: an object {master_address, master_port, ...}"), -1;
    static const char *const known[] = {"master_address",    "master_port", "rank_offset",
                                        "world_size",        "packed",      "packed_buffer_size_bytes",
                                        "packed_num_buffers"};
    for (const cJSON *f = ii->child; f; f = f->next) {
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] && strcmp(f->string, known[k])) k++;
        if (k == sizeof known / sizeof known[0])
            return snprintf(msg, cap,
                            "init_info.%s: unknown field (the NCCL engine's are %s, %s, %s, %s, %s, %s, %s)",
                            f->string, known[0], known[1], known[2], known[3], known[4], known[5], known[6]),
                   -1;
    }
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(ii, "master_address");
    if (!cJSON_IsString(a) || !a->valuestring[0] || strlen(a->valuestring) >= hcap)
        return snprintf(msg, cap, "init_info.master_address: the trainer's address (a string)"), -1;
    snprintf(host, hcap, "%s", a->valuestring);
    int64_t v = 0, offset = 0, world = 0, bufs = 2;
    if (int_field(ii, "master_port", 1, 65535, &v, msg, cap) == -1)
        return snprintf(msg, cap, "init_info.master_port: missing"), -1;
    if (int_field(ii, "master_port", 1, 65535, &v, msg, cap)) return -1;
    *port = (int)v;
    if (int_field(ii, "rank_offset", 0, 1 << 20, &offset, msg, cap) ||
        int_field(ii, "world_size", 2, 1 << 20, &world, msg, cap))
        return msg[0]
                   ? -1
                   : (snprintf(msg, cap, "init_info.rank_offset and init_info.world_size: both are needed"),
                      -1);
    if (world != offset + 1)
        return snprintf(msg, cap,
                        "init_info.world_size: %lld, but ctrl serve is one worker (GET /get_world_size "
                        "answers 1) at "
                        "rank rank_offset = %lld, so the group has rank_offset + 1 = %lld ranks",
                        (long long)world, (long long)offset, (long long)offset + 1),
               -1;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(ii, "packed");
    if (p && !cJSON_IsBool(p)) return snprintf(msg, cap, "init_info.packed: true or false"), -1;
    w->packed_bytes = (int64_t)1 << 30; /* vLLM's DEFAULT_PACKED_BUFFER_SIZE_BYTES */
    if (int_field(ii, "packed_buffer_size_bytes", 1, 1e15, &w->packed_bytes, msg, cap) == -2 ||
        int_field(ii, "packed_num_buffers", 1, 64, &bufs, msg, cap) == -2)
        return -1;
    w->packed = cJSON_IsTrue(p), w->rank = (int)offset, w->world = (int)world;
    return 0;
}

/* The rendezvous and the group: the unique id from the store, ncclCommInitRank, the warm-up. */
static ctrl_status join(ctrl_server *s, serve_wt *w, const char *host, int port) {
    const double timeout = s->opt->weight_transfer_timeout_s;
    serve_store *st = NULL;
    ctrl_status r = serve_store_connect(host, port, timeout, &st);
    int64_t joined = 0;
    uint8_t *val = NULL;
    size_t len = 0;
    serve_nccl_id id;
    if (r == CTRL_OK) r = serve_store_add(st, "init/", 1, &joined, timeout); /* the master waits for it */
    if (r == CTRL_OK) r = serve_store_get(st, "/broadcast_from/0/0", timeout, &val, &len);
    if (r == CTRL_OK) r = serve_unpickle_nccl_id(val, len, (uint8_t *)id.internal);
    free(val);
    serve_store_close(st);
    if (r != CTRL_OK) return r;
    if (s->cuda && s->cuda->set_device) s->cuda->set_device(0);
    int e = w->nccl->comm_init_rank(&w->comm, w->world, id, w->rank);
    if (e) {
        w->comm = NULL;
        return ctrl_error_set(CTRL_ERR_DEVICE, "ncclCommInitRank (rank %d of %d): %s", w->rank, w->world,
                              w->nccl->get_error_string(e));
    }
    const ctrl_backend_ops *be = ctrl_model_backend(s->model);
    void *one = NULL;
    r = be->alloc(&one, sizeof(float));
    if (r == CTRL_OK) r = be->fill_zero(one, sizeof(float));
    if (r == CTRL_OK &&
        (e = w->nccl->all_reduce(one, one, 1, SERVE_NCCL_FLOAT32, SERVE_NCCL_SUM, w->comm, NULL)))
        r = ctrl_error_set(CTRL_ERR_DEVICE, "the warm-up ncclAllReduce: %s", w->nccl->get_error_string(e));
    if (r == CTRL_OK) r = be->synchronize();
    be->free(one);
    if (r != CTRL_OK) w->nccl->comm_abort(w->comm), w->comm = NULL;
    return r;
}

enum MHD_Result serve_wt_init(ctrl_server *s, struct MHD_Connection *c, const cJSON *in) {
    if (!on_device(s))
        return serve_error(
            c, 501,
            "NCCL weight transfer needs ctrl serve on a CUDA device (--device cuda), as vLLM's engine "
            "does; on the CPU send new weights with POST /update_weights and a safetensors body "
            "(docs/serve.md)");
    serve_wt *w = wt_of(s);
    if (!w) return serve_error(c, 500, "out of memory");
    char msg[700] = "", host[256];
    int port = 0;
    const cJSON *ii = cJSON_GetObjectItemCaseSensitive(in, "init_info");
    if (!ii) return serve_error(c, 400, "init_info: missing (vLLM's {\"init_info\": {master_address, ...}})");
    if (pthread_mutex_trylock(&w->lock))
        return serve_error(c, 409, "another weight-transfer call is running");
    serve_wt next = *w;
    enum MHD_Result ret;
    if (read_init_info(ii, &next, host, sizeof host, &port, msg, sizeof msg)) {
        ret = serve_error(c, 400, msg);
    } else if (!(w->nccl = serve_nccl_load())) {
        ret = serve_error(c, 501, ctrl_error_message());
    } else {
        if (w->comm) close_group(w, "a new group was initialised");
        w->rank = next.rank, w->world = next.world, w->packed = next.packed,
        w->packed_bytes = next.packed_bytes;
        CTRL_INFO("serve: joining the trainer's NCCL group at %s:%d as rank %d of %d (%s)", host, port,
                  w->rank, w->world, w->nccl->path);
        const ctrl_status st = join(s, w, host, port);
        if (st == CTRL_OK) {
            w->closed[0] = '\0';
            ret = message(c, "Weight transfer initialized");
        } else {
            snprintf(msg, sizeof msg, "joining the trainer's NCCL group failed: %s", ctrl_error_message());
            snprintf(w->closed, sizeof w->closed, "%.590s", msg);
            ret = serve_error(c, st == CTRL_ERR_CONFIG ? 400 : 500, msg);
        }
    }
    pthread_mutex_unlock(&w->lock);
    return ret;
}

/* On the CPU there is no group: start and finish bracket POST /update_weights bodies (each applied
 * whole between generations) and answer as vLLM does, finish flushing the prefix cache. */
static void flush_prefix_cache(ctrl_server *s) {
    ctrl_batcher_lock_engine(s->batch);
    ctrl_engine_reset_prefix_cache(s->eng); /* whatever was cached came from the old weights */
    ctrl_batcher_unlock_engine(s->batch);
}

enum MHD_Result serve_wt_start(ctrl_server *s, struct MHD_Connection *c, const cJSON *in) {
    if (!on_device(s)) return message(c, "Weight update started");
    serve_wt *w = wt_of(s);
    if (!w) return serve_error(c, 500, "out of memory");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(in, "is_checkpoint_format");
    if (f && !cJSON_IsTrue(f))
        return serve_error(c, 400,
                           "is_checkpoint_format: ctrl takes weights under their checkpoint (Hugging Face) "
                           "names only: true");
    if (pthread_mutex_trylock(&w->lock))
        return serve_error(c, 409, "another weight-transfer call is running");
    enum MHD_Result ret = w->comm ? (w->updating = 1, message(c, "Weight update started")) : no_group(w, c);
    pthread_mutex_unlock(&w->lock);
    return ret;
}

enum MHD_Result serve_wt_finish(ctrl_server *s, struct MHD_Connection *c, const cJSON *in) {
    (void)in;
    if (!on_device(s)) return flush_prefix_cache(s), message(c, "Weight update finished");
    serve_wt *w = wt_of(s);
    if (!w) return serve_error(c, 500, "out of memory");
    if (pthread_mutex_trylock(&w->lock))
        return serve_error(c, 409, "another weight-transfer call is running");
    enum MHD_Result ret;
    if (!w->comm) {
        ret = no_group(w, c);
    } else if (!w->updating) {
        ret = serve_error(c, 409, "no weight update in progress: POST /start_weight_update first");
    } else {
        w->updating = 0;
        flush_prefix_cache(s);
        ret = message(c, "Weight update finished");
    }
    pthread_mutex_unlock(&w->lock);
    return ret;
}

/* ---- /update_weights with update_info ---- */

/* torch's dtype names as vLLM's update_info writes them: bytes per element, the NCCL datatype
 * vLLM's pynccl broadcasts them as, and whether ctrl's fp32 weights can take them. */
static const struct {
    const char *name;
    int size, nccl, kind; /* kind: 1 f32, 2 bf16, 3 f16, 4 f64, 0 not a weight */
} dtypes[] = {{"float32", 4, 7, 1},
              {"bfloat16", 2, 9, 2},
              {"float16", 2, 6, 3},
              {"float64", 8, 8, 4},
              {"int8", 1, 0, 0},
              {"uint8", 1, 1, 0},
              {"bool", 1, 1, 0},
              {"int16", 2, 1, 0},
              {"uint16", 2, 1, 0},
              {"int32", 4, 2, 0},
              {"uint32", 4, 3, 0},
              {"int64", 8, 4, 0},
              {"uint64", 8, 5, 0},
              {"float8_e4m3fn", 1, 1, 0},
              {"float8_e5m2", 1, 1, 0},
              {"float8_e4m3fnuz", 1, 1, 0},
              {"float8_e5m2fnuz", 1, 1, 0},
              {"complex64", 8, 1, 0}};

typedef struct {
    const char *name;
    const ctrl_param_view *v; /* NULL: refused (problem says why) */
    int dt;                   /* index into dtypes */
    int64_t numel;
    size_t bytes;
    size_t pending; /* offset of its fp32 values in the staged update */
} wt_tensor;

typedef struct {
    ctrl_server *s;
    serve_wt *w;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    double last; /* the last progress (monotonic s) */
    int done, timed_out;
} wt_watch;

static void *watchdog(void *arg) {
    wt_watch *g = arg;
    const double timeout = g->s->opt->weight_transfer_timeout_s;
    pthread_mutex_lock(&g->lock);
    while (!g->done) {
        const double due = g->last + timeout, now = ctrl_now();
        if (now >= due) { /* no progress: abort the group, which unblocks the receive */
            g->timed_out = 1;
            g->w->nccl->comm_abort(g->w->comm);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double wait = due - now < 0.2 ? due - now : 0.2;
        ts.tv_sec += (time_t)wait, ts.tv_nsec += (long)((wait - floor(wait)) * 1e9);
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&g->cv, &g->lock, &ts);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

/* The update_info's tensors: -1 (msg) when the byte layout cannot be known; else 0, with the first
 * tensor the model cannot take described in problem (empty when all fit). */
static int plan(ctrl_server *s, const cJSON *ui, wt_tensor **out, int *count, char *msg, size_t cap,
                char *problem, size_t pcap) {
    *out = NULL, *count = 0, problem[0] = '\0';
    if (!cJSON_IsObject(ui))
        return snprintf(msg, cap, "update_info: an object {names, dtype_names, shapes}"), -1;
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(ui, "names"),
                *dts = cJSON_GetObjectItemCaseSensitive(ui, "dtype_names"),
                *shapes = cJSON_GetObjectItemCaseSensitive(ui, "shapes");
    if (!cJSON_IsArray(names) || !cJSON_IsArray(dts) || !cJSON_IsArray(shapes))
        return snprintf(msg, cap, "update_info: names, dtype_names and shapes are lists"), -1;
    const int n = cJSON_GetArraySize(names);
    if (cJSON_GetArraySize(dts) != n || cJSON_GetArraySize(shapes) != n)
        return snprintf(msg, cap, "update_info: %d names, %d dtype_names and %d shapes: one each per tensor",
                        n, cJSON_GetArraySize(dts), cJSON_GetArraySize(shapes)),
               -1;
    wt_tensor *t = calloc((size_t)(n ? n : 1), sizeof *t);
    if (!t) return snprintf(msg, cap, "out of memory"), -1;
    const cJSON *nm = names->child, *dt = dts->child, *sh = shapes->child;
    size_t pending = 0;
    for (int i = 0; i < n; i++, nm = nm->next, dt = dt->next, sh = sh->next) {
        if (!cJSON_IsString(nm)) return free(t), snprintf(msg, cap, "update_info.names[%d]: a string", i), -1;
        t[i].name = nm->valuestring;
        size_t k = 0;
        while (cJSON_IsString(dt) && k < sizeof dtypes / sizeof dtypes[0] &&
               strcmp(dt->valuestring, dtypes[k].name))
            k++;
        if (!cJSON_IsString(dt) || k == sizeof dtypes / sizeof dtypes[0])
            return free(t),
                   snprintf(msg, cap,
                            "update_info.dtype_names[%d]: '%s' is not a torch dtype ctrl knows (float32, "
                            "bfloat16, float16, ...)",
                            i, cJSON_IsString(dt) ? dt->valuestring : "(not a string)"),
                   -1;
        t[i].dt = (int)k;
        if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > 8)
            return free(t), snprintf(msg, cap, "update_info.shapes[%d]: a list of at most 8 sizes", i), -1;
        int64_t numel = 1, dims[8];
        int nd = 0;
        for (const cJSON *d = sh->child; d; d = d->next, nd++) {
            if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble != floor(d->valuedouble) ||
                d->valuedouble > 1e12 || (numel && d->valuedouble > 1e15 / (double)numel))
                return free(t), snprintf(msg, cap, "update_info.shapes[%d]: sizes are whole numbers >= 0", i),
                       -1;
            dims[nd] = (int64_t)d->valuedouble, numel *= dims[nd];
        }
        t[i].numel = numel, t[i].bytes = (size_t)numel * (size_t)dtypes[k].size;
        if (problem[0]) continue; /* the layout of the rest still has to be known */
        const ctrl_param_view *v = ctrl_model_find_view(s->model, t[i].name);
        int fits = v && nd == v->ndim;
        for (int d = 0; fits && d < nd; d++) fits = dims[d] == v->shape[d];
        for (int j = 0; v && j < i; j++)
            if (t[j].v == v) {
                snprintf(problem, pcap, "update_info.names[%d]: '%s' is given twice", i, t[i].name);
                v = NULL;
            }
        if (problem[0]) continue;
        if (!v)
            snprintf(problem, pcap, "update_info.names[%d]: '%s' is not a parameter of this model", i,
                     t[i].name);
        else if (!fits) {
            char want[64];
            snprintf(want, sizeof want, v->ndim == 1 ? "[%lld]" : "[%lld, %lld]", (long long)v->shape[0],
                     (long long)(v->ndim > 1 ? v->shape[1] : 0));
            snprintf(problem, pcap, "update_info.shapes[%d]: '%s' does not have the model's shape %s", i,
                     t[i].name, want);
        } else if (!dtypes[k].kind)
            snprintf(problem, pcap,
                     "update_info.dtype_names[%d]: '%s' is %s: a weight is float32, bfloat16, float16 "
                     "or float64",
                     i, t[i].name, dtypes[k].name);
        else
            t[i].v = v, t[i].pending = pending, pending += (size_t)numel;
    }
    *out = t, *count = n;
    return 0;
}

/* The values of a received tensor (little-endian, dtypes[dt]) into fp32; the index of the first
 * non-finite value, or -1. */
static int64_t to_f32(const unsigned char *src, int dt, int64_t n, float *dst) {
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        float f;
        switch (dtypes[dt].kind) {
        case 1: memcpy(&f, src + 4 * i, 4); break;
        case 2: {
            const uint32_t u = (uint32_t)(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
            memcpy(&f, &u, 4);
            break;
        }
        case 3: { /* IEEE half */
            const uint32_t h = (uint32_t)(src[2 * i] | (src[2 * i + 1] << 8));
            const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
            f = e == 0    ? ldexpf((float)m, -24)
                : e == 31 ? (m ? NAN : INFINITY)
                          : ldexpf((float)(m | 0x400), (int)e - 25);
            if (sign) f = -f;
            break;
        }
        default: {
            double d;
            memcpy(&d, src + 8 * i, 8);
            f = (float)d;
        }
        }
        if (bad < 0 && !isfinite(f)) bad = i;
        dst[i] = f;
    }
    return bad;
}

typedef struct {
    ctrl_server *s;
    serve_wt *w;
    wt_watch *g;
    void *dev;
    unsigned char *host;
    float *pending; /* NULL: draining a refused update */
    char *problem;
    size_t pcap;
} wt_recv;

/* One broadcast of `bytes` (count of datatype) from rank 0, then its tensors [a, b) converted; a
 * transport failure is an error (the group is gone), a bad value goes into problem. */
static ctrl_status receive(wt_recv *r, const wt_tensor *t, int a, int b, size_t bytes, int datatype,
                           size_t count) {
    const ctrl_backend_ops *be = ctrl_model_backend(r->s->model);
    const int e = r->w->nccl->broadcast(NULL, r->dev, count, datatype, 0, r->w->comm, NULL);
    ctrl_status st = e ? ctrl_error_set(CTRL_ERR_DEVICE, "ncclBroadcast: %s", r->w->nccl->get_error_string(e))
                       : be->synchronize();
    pthread_mutex_lock(&r->g->lock);
    const int timed_out = r->g->timed_out;
    if (!timed_out) r->g->last = ctrl_now();
    pthread_mutex_unlock(&r->g->lock);
    if (timed_out) /* the watchdog aborted the group: w->comm is gone */
        return ctrl_error_set(CTRL_ERR_DEVICE,
                              "no data from the trainer for %d s (--weight-transfer-timeout-s)",
                              r->s->opt->weight_transfer_timeout_s);
    if (e && r->w->nccl->get_last_error)
        st = ctrl_error_set(CTRL_ERR_DEVICE, "ncclBroadcast: %s (%s)", r->w->nccl->get_error_string(e),
                            r->w->nccl->get_last_error(r->w->comm));
    if (st != CTRL_OK) return st;
    int async = 0;
    if (r->w->nccl->comm_get_async_error(r->w->comm, &async) == 0 && async)
        return ctrl_error_set(CTRL_ERR_DEVICE, "NCCL: %s", r->w->nccl->get_error_string(async));
    if (!r->pending || !bytes) return CTRL_OK;
    if ((st = be->to_host(r->host, r->dev, bytes)) != CTRL_OK) return st;
    size_t at = 0;
    for (int i = a; i < b; at += t[i].bytes, i++) {
        const int64_t bad = to_f32(r->host + at, t[i].dt, t[i].numel, r->pending + t[i].pending);
        if (bad >= 0 && !r->problem[0])
            snprintf(r->problem, r->pcap,
                     "tensor '%s' holds a non-finite value at element %lld: weights must be finite",
                     t[i].name, (long long)bad);
    }
    return CTRL_OK;
}

/* Receives every broadcast of the plan (packed chunks or one per tensor). */
static ctrl_status receive_all(wt_recv *r, const wt_tensor *t, int n, int packed) {
    ctrl_status st = CTRL_OK;
    if (!packed) {
        /* elements of the NCCL datatype it travels as (uint8 for the types NCCL has not: bytes) */
        static const size_t nccl_size[10] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
        for (int i = 0; i < n && st == CTRL_OK; i++)
            st = receive(r, t, i, i + 1, t[i].bytes, dtypes[t[i].dt].nccl,
                         t[i].bytes / nccl_size[dtypes[t[i].dt].nccl]);
        return st;
    }
    for (int a = 0; a < n && st == CTRL_OK;) {
        size_t bytes = 0;
        int b = a;
        while (b < n) { /* vLLM's consumer: a chunk ends with the tensor that takes it past the size */
            bytes += t[b++].bytes;
            if ((int64_t)bytes > r->w->packed_bytes) break;
        }
        st = receive(r, t, a, b, bytes, SERVE_NCCL_UINT8, bytes);
        a = b;
    }
    return st;
}

/* The largest single broadcast of the plan. */
static size_t largest(const wt_tensor *t, int n, int packed, int64_t packed_bytes) {
    size_t most = 0, run = 0;
    for (int i = 0; i < n; i++) {
        run = packed ? run + t[i].bytes : t[i].bytes;
        if (run > most) most = run;
        if (!packed || (int64_t)run > packed_bytes) run = 0;
    }
    return most;
}

static enum MHD_Result update(ctrl_server *s, serve_wt *w, struct MHD_Connection *c, const cJSON *ui) {
    char msg[900] = "", problem[600] = "";
    wt_tensor *t = NULL;
    int n = 0;
    if (plan(s, ui, &t, &n, msg, sizeof msg, problem, sizeof problem)) {
        /* the trainer is broadcasting a layout nobody can match: the group cannot continue */
        char why[1200];
        snprintf(why, sizeof why,
                 "%s (the trainer's broadcast cannot be matched, so the NCCL group was closed)", msg);
        close_group(w, why);
        snprintf(why, sizeof why, "%s; the NCCL group was closed: POST /init_weight_transfer_engine again",
                 msg);
        return serve_error(c, 400, why);
    }
    int packed = w->packed;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(ui, "packed");
    if (cJSON_IsBool(p)) packed = cJSON_IsTrue(p); /* vLLM before 0.28 says it per update */
    const ctrl_backend_ops *be = ctrl_model_backend(s->model);
    const size_t most = largest(t, n, packed, w->packed_bytes);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += t[i].v ? (size_t)t[i].numel : 0;
    wt_recv r = {.s = s, .w = w, .problem = problem, .pcap = sizeof problem};
    wt_watch g = {.s = s, .w = w, .last = ctrl_now()};
    ctrl_status st = be->alloc(&r.dev, most ? most : 1);
    if (st == CTRL_OK && !(r.host = malloc(most ? most : 1)))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "no host memory for a %zu-byte chunk", most);
    if (st == CTRL_OK && !problem[0] && !(r.pending = malloc(total ? total * sizeof(float) : 1)))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "no host memory to stage %zu weights", total);
    if (st != CTRL_OK) { /* nothing can be received: the trainer's broadcast would hang */
        snprintf(msg, sizeof msg, "%s (the NCCL group was closed)", ctrl_error_message());
        close_group(w, msg);
    } else {
        pthread_mutex_init(&g.lock, NULL);
        pthread_cond_init(&g.cv, NULL);
        pthread_t dog;
        const int watching = pthread_create(&dog, NULL, watchdog, &g) == 0;
        r.g = &g;
        st = receive_all(&r, t, n, packed);
        pthread_mutex_lock(&g.lock);
        g.done = 1;
        pthread_cond_signal(&g.cv);
        pthread_mutex_unlock(&g.lock);
        if (watching) pthread_join(dog, NULL);
        if (g.timed_out) w->comm = NULL; /* the watchdog aborted it */
        if (st != CTRL_OK) {
            snprintf(msg, sizeof msg,
                     "receiving the update failed: %s (the NCCL group was closed; the model is unchanged)",
                     ctrl_error_message());
            close_group(w, msg);
        } else if (g.timed_out) { /* it fired just as the last broadcast completed */
            close_group(w, "the watchdog closed it as the update completed (--weight-transfer-timeout-s)");
        }
        pthread_cond_destroy(&g.cv);
        pthread_mutex_destroy(&g.lock);
    }
    be->free(r.dev);
    free(r.host);
    enum MHD_Result ret;
    if (st != CTRL_OK) {
        ret = serve_error(c, g.timed_out ? 504 : 500, msg);
    } else if (problem[0]) {
        snprintf(msg, sizeof msg, "%s (every tensor was received and dropped: the model is unchanged)",
                 problem);
        ret = serve_error(c, 400, msg);
    } else {
        ctrl_batcher_lock_engine(s->batch); /* between generations, never during one */
        /* (through the model: a weight it holds otherwise than in fp32 is packed again) */
        ctrl_status ws = CTRL_OK;
        for (int i = 0; i < n && ws == CTRL_OK; i++)
            ws = ctrl_model_write_view(s->model, t[i].v, r.pending + t[i].pending);
        if (ws != CTRL_OK) /* (validated above: a failure here is a bug; the weights are no longer whole) */
            snprintf(msg, sizeof msg, "writing the received weights: %s", ctrl_error_message());
        if (n > 0) {
            ctrl_model_weights_changed(s->model);
            ctrl_engine_reset_prefix_cache(s->eng); /* cached K/V were computed with the old weights */
        }
        ctrl_batcher_unlock_engine(s->batch);
        ret = ws == CTRL_OK ? message(c, "Weights updated") : serve_error(c, 500, msg);
    }
    free(r.pending);
    free(t);
    return ret;
}

enum MHD_Result serve_wt_update(ctrl_server *s, struct MHD_Connection *c, const char *body, size_t len) {
    if (!on_device(s))
        return serve_error(
            c, 501,
            "update_info: NCCL weight transfer needs ctrl serve on a CUDA device (--device cuda); on the "
            "CPU POST /update_weights a safetensors body (docs/serve.md)");
    serve_wt *w = wt_of(s);
    if (!w) return serve_error(c, 500, "out of memory");
    cJSON *in = cJSON_ParseWithLength(body ? body : "", len);
    const cJSON *ui = cJSON_GetObjectItemCaseSensitive(in, "update_info");
    enum MHD_Result ret;
    if (!cJSON_IsObject(in)) {
        ret = serve_error(c, 400, "the body is not a JSON object ({\"update_info\": {...}})");
    } else if (!ui) {
        ret = serve_error(c, 400,
                          "update_info: missing (vLLM's {\"update_info\": {names, dtype_names, shapes}}; or "
                          "POST a safetensors body)");
    } else if (pthread_mutex_trylock(&w->lock)) {
        ret = serve_error(c, 409, "another weight-transfer call is running");
    } else {
        ret = w->comm ? update(s, w, c, ui) : no_group(w, c);
        pthread_mutex_unlock(&w->lock);
    }
    cJSON_Delete(in);
    return ret;
}
