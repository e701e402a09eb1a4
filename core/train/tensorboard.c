/* TensorBoard event files (tensorboard.h). The protocol buffers are written by hand: an Event is
 * wall_time (field 1, double), step (2, varint), file_version (3, bytes) or summary (5, message);
 * a Summary is repeated value (1, message); a Summary.Value is tag (1, bytes) and simple_value (2,
 * float). */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ctrl/status.h>

#include "clock.h"
#include "train/tensorboard.h"

struct ctrl_tb_writer {
    FILE *f;
    char path[4352];
};

uint32_t ctrl_crc32c(const void *data, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
    const unsigned char *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

uint32_t ctrl_tb_masked_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* A growing byte buffer for one record. */
typedef struct buf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_varint(buf *b, uint64_t v) {
    unsigned char tmp[10];
    int n = 0;
    do {
        tmp[n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put(b, tmp, (size_t)n);
}
static void put_le(buf *b, uint64_t v, int bytes) {
    unsigned char tmp[8];
    for (int i = 0; i < bytes; i++) tmp[i] = (unsigned char)(v >> (8 * i));
    put(b, tmp, (size_t)bytes);
}
/* proto3 leaves out a plain field holding its default (0, bitwise), as the protobuf library does */
static void put_double(buf *b, int field, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    if (!u) return;
    put_varint(b, (uint64_t)field << 3 | 1);
    put_le(b, u, 8);
}
static void put_float(buf *b, int field, float v) {
    uint32_t u; /* simple_value is in Summary.Value's oneof: written even when 0 */
    memcpy(&u, &v, 4);
    put_varint(b, (uint64_t)field << 3 | 5);
    put_le(b, u, 4);
}
static void put_bytes(buf *b, int field, const void *p, size_t n) {
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    put(b, p, n);
}

/* The record's framing around the Event in `e`. */
static ctrl_status write_record(ctrl_tb_writer *w, const buf *e) {
    if (e->oom) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for an event", w->path);
    unsigned char head[12];
    const uint64_t len = e->n;
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(len >> (8 * i));
    const uint32_t lc = ctrl_tb_masked_crc(ctrl_crc32c(head, 8)),
                   dc = ctrl_tb_masked_crc(ctrl_crc32c(e->p, e->n));
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(lc >> (8 * i));
    unsigned char tail[4];
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(dc >> (8 * i));
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(e->p, 1, e->n, w->f) != e->n ||
        fwrite(tail, 1, 4, w->f) != 4 || fflush(w->f) != 0)
        return ctrl_error_set(CTRL_ERR_IO, "%s: %s", w->path, strerror(errno));
    return CTRL_OK;
}

ctrl_status ctrl_tb_open_file(const char *path, double wall_time, ctrl_tb_writer **out) {
    *out = NULL;
    ctrl_tb_writer *w = calloc(1, sizeof *w);
    if (!w) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    snprintf(w->path, sizeof w->path, "%s", path);
    if (!(w->f = fopen(path, "wb"))) {
        ctrl_status st = ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
        free(w);
        return st;
    }
    buf e = {0};
    put_double(&e, 1, wall_time);
    put_bytes(&e, 3, "brain.Event:2", 13);
    ctrl_status st = write_record(w, &e);
    free(e.p);
    if (st != CTRL_OK) {
        ctrl_tb_close(w);
        return st;
    }
    *out = w;
    return CTRL_OK;
}

ctrl_status ctrl_tb_open(const char *logdir, ctrl_tb_writer **out) {
    if (mkdir(logdir, 0755) != 0 && errno != EEXIST)
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot create the TensorBoard directory: %s", logdir,
                              strerror(errno));
    char host[256] = "localhost", path[4352];
    gethostname(host, sizeof host - 1);
    const double t = ctrl_clock_seconds(CLOCK_REALTIME);
    snprintf(path, sizeof path, "%s/events.out.tfevents.%010ld.%s.%ld.0", logdir, (long)t, host,
             (long)getpid());
    return ctrl_tb_open_file(path, t, out);
}

ctrl_status ctrl_tb_scalars(ctrl_tb_writer *w, double wall_time, int64_t step, const char *const *tags,
                            const float *values, int n) {
    buf summary = {0}, e = {0};
    for (int i = 0; i < n; i++) {
        buf v = {0};
        put_bytes(&v, 1, tags[i], strlen(tags[i]));
        put_float(&v, 2, values[i]);
        put_bytes(&summary, 1, v.p, v.n);
        summary.oom |= v.oom;
        free(v.p);
    }
    put_double(&e, 1, wall_time);
    if (step) {
        put_varint(&e, 2 << 3 | 0);
        put_varint(&e, (uint64_t)step);
    }
    put_bytes(&e, 5, summary.p, summary.n);
    e.oom |= summary.oom;
    ctrl_status st = write_record(w, &e);
    free(summary.p), free(e.p);
    return st;
}

ctrl_status ctrl_tb_metrics_line(ctrl_tb_writer *w, double wall_time, const char *json_line) {
    cJSON *root = cJSON_Parse(json_line);
    const cJSON *step = root ? cJSON_GetObjectItemCaseSensitive(root, "step") : NULL;
    if (!cJSON_IsNumber(step)) {
        cJSON_Delete(root);
        return CTRL_OK; /* not a step's metrics */
    }
    int n = 0;
    for (const cJSON *it = root->child; it; it = it->next)
        n += cJSON_IsNumber(it) && strcmp(it->string, "step");
    char **tags = calloc((size_t)n + 1, sizeof *tags);
    float *values = calloc((size_t)n + 1, sizeof *values);
    ctrl_status st = tags && values ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "tensorboard: out of memory");
    int k = 0;
    for (const cJSON *it = root->child; st == CTRL_OK && it; it = it->next) {
        if (!cJSON_IsNumber(it) || !strcmp(it->string, "step")) continue;
        const int eval = !strncmp(it->string, "eval_", 5);
        const size_t len = strlen(it->string) + 8;
        if (!(tags[k] = malloc(len))) {
            st = ctrl_error_set(CTRL_ERR_NOMEM, "tensorboard: out of memory");
            break;
        }
        snprintf(tags[k], len, "%s/%s", eval ? "eval" : "train", it->string + (eval ? 5 : 0));
        values[k++] = (float)it->valuedouble;
    }
    if (st == CTRL_OK && k)
        st = ctrl_tb_scalars(w, wall_time, (int64_t)step->valuedouble, (const char *const *)tags, values, k);
    for (int i = 0; tags && i < k; i++) free(tags[i]);
    free(tags), free(values);
    cJSON_Delete(root);
    return st;
}

ctrl_status ctrl_tb_close(ctrl_tb_writer *w) {
    if (!w) return CTRL_OK;
    ctrl_status st = CTRL_OK;
    if (w->f && fclose(w->f) != 0) st = ctrl_error_set(CTRL_ERR_IO, "%s: %s", w->path, strerror(errno));
    free(w);
    return st;
}
