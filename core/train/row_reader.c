/* Streaming row reader for JSONL files, JSON array files and parquet files, one file or the
 * files of a folder or a Hub dataset id (core/dataset/dataset_files.h) in turn. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_load.h"
#include "dataset/arrow_ipc.h"
#include "dataset/dataset_files.h"
#include "dataset/parquet.h"
#include "train/row_reader.h"

struct ctrl_row_reader {
    ctrl_data_files files;
    int next_file;     /* the index of the file after the open one */
    ctrl_parquet *pq;  /* the open file when it is parquet */
    ctrl_arrow *arrow; /* ... or an Arrow IPC stream */
    long pq_row;
    FILE *f;
    char *path;
    int array; /* a JSON array file, read element by element */
    int done;  /* the array's closing bracket was seen */
    long line; /* current line (1-based) */
    char *buf;
    size_t cap;
};

static void buf_put(ctrl_row_reader *r, size_t at, char c) {
    if (at + 2 > r->cap) {
        r->cap = r->cap ? r->cap * 2 : 1 << 16;
        r->buf = realloc(r->buf, r->cap);
        if (!r->buf) abort();
    }
    r->buf[at] = c;
}

/* Opens the next file of the list (0: none left). */
static ctrl_status open_file(ctrl_row_reader *r, int *opened) {
    *opened = 0;
    if (r->f) fclose(r->f);
    ctrl_parquet_close(r->pq);
    ctrl_arrow_close(r->arrow);
    r->f = NULL, r->pq = NULL, r->arrow = NULL, r->array = 0, r->done = 0, r->line = 1, r->pq_row = 0;
    if (r->next_file >= r->files.n) return CTRL_OK;
    const char *path = r->files.paths[r->next_file++];
    r->path = (char *)path;
    FILE *f = fopen(path, "r");
    if (!f) return ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
    unsigned char head[8];
    const size_t got = fread(head, 1, sizeof head, f);
    if (ctrl_parquet_magic(head, got) || ctrl_arrow_magic(head, got)) {
        fclose(f);
        ctrl_status st = ctrl_parquet_magic(head, got) ? ctrl_parquet_open(path, &r->pq)
                                                       : ctrl_arrow_open(path, &r->arrow);
        if (st == CTRL_OK) *opened = 1;
        return st;
    }
    rewind(f);
    r->f = f;
    /* A file whose first non-blank character is '[' is one JSON array; anything else is JSONL. */
    int c;
    while ((c = getc(f)) != EOF && (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == 0xEF ||
                                    c == 0xBB || c == 0xBF)) /* blanks and a UTF-8 BOM */
        r->line += c == '\n';
    if (c == '[')
        r->array = 1;
    else if (c != EOF)
        ungetc(c, f);
    *opened = 1;
    return CTRL_OK;
}

static ctrl_status open_files(const char *path, const char *subset, const char *split,
                              ctrl_row_reader **out) {
    *out = NULL;
    ctrl_row_reader *r = calloc(1, sizeof *r);
    if (!r) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    ctrl_status st = ctrl_data_files_find_in(path, subset, split, &r->files);
    int opened = 0;
    if (st == CTRL_OK) st = open_file(r, &opened);
    if (st != CTRL_OK) {
        ctrl_row_reader_close(r);
        return st;
    }
    *out = r;
    return CTRL_OK;
}

ctrl_status ctrl_row_reader_open_split(const char *path, const char *split, ctrl_row_reader **out) {
    return open_files(path, NULL, split, out);
}

ctrl_status ctrl_row_reader_open(const char *path, ctrl_row_reader **out) {
    return ctrl_row_reader_open_split(path, NULL, out);
}

ctrl_status ctrl_row_reader_open_data(const char *path, const ctrl_config *cfg, ctrl_row_reader **out) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    const int eval = s->data.eval_file && path == s->data.eval_file;
    return open_files(path, s->data.subset, eval ? s->data.eval_split : s->data.split, out);
}

const char *ctrl_row_reader_file(const ctrl_row_reader *r) { return r->path ? r->path : ""; }

static int next_line(ctrl_row_reader *r, cJSON **row, long *line) {
    for (;;) {
        size_t len = 0;
        int c;
        while ((c = getc(r->f)) != EOF && c != '\n') buf_put(r, len++, (char)c);
        if (c == EOF && len == 0) return 0;
        buf_put(r, len, '\0');
        *line = r->line++;
        if (r->buf[strspn(r->buf, " \t\r")] == '\0') {
            if (c == EOF) return 0;
            continue; /* blank line */
        }
        *row = cJSON_ParseWithLength(r->buf, len);
        return 1;
    }
}

/* The next element of the top-level array: its bytes are collected by tracking nesting and strings. */
static int next_element(ctrl_row_reader *r, cJSON **row, long *line) {
    if (r->done) return 0;
    int c;
    for (;;) { /* skip blanks and the separating comma */
        c = getc(r->f);
        if (c == '\n') r->line++;
        if (c != ' ' && c != '\t' && c != '\r' && c != '\n' && c != ',') break;
    }
    if (c == ']') return r->done = 1, 0;
    if (c == EOF) {
        ctrl_error_set(CTRL_ERR_FORMAT, "%s:%ld: the JSON array is not closed with ']'", r->path, r->line);
        return -1;
    }
    *line = r->line;
    size_t len = 0;
    int depth = 0, in_str = 0, esc = 0;
    for (; c != EOF; c = getc(r->f)) {
        if (!in_str && depth == 0 && (c == ',' || c == ']') && len > 0) {
            if (c == ']') r->done = 1;
            break;
        }
        if (c == '\n') r->line++;
        buf_put(r, len++, (char)c);
        if (in_str) {
            if (esc)
                esc = 0;
            else if (c == '\\')
                esc = 1;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) break; /* a complete object or array */
        }
    }
    if (c == EOF && (depth > 0 || in_str)) {
        ctrl_error_set(CTRL_ERR_FORMAT, "%s:%ld: the JSON array ends inside an element", r->path, *line);
        return -1;
    }
    buf_put(r, len, '\0');
    *row = cJSON_ParseWithLength(r->buf, len);
    return 1;
}

int ctrl_row_reader_next(ctrl_row_reader *r, cJSON **row, long *line) {
    *row = NULL;
    for (;;) {
        int got;
        if (r->pq || r->arrow) {
            got = r->pq ? ctrl_parquet_next(r->pq, row) : ctrl_arrow_next(r->arrow, row);
            *line = ++r->pq_row;
        } else if (r->f) {
            got = r->array ? next_element(r, row, line) : next_line(r, row, line);
        } else {
            return 0;
        }
        if (got != 0) return got;
        int opened; /* this file is done: on to the next */
        if (open_file(r, &opened) != CTRL_OK) return -1;
        if (!opened) return 0;
    }
}

void ctrl_row_reader_close(ctrl_row_reader *r) {
    if (!r) return;
    if (r->f) fclose(r->f);
    ctrl_parquet_close(r->pq);
    ctrl_arrow_close(r->arrow);
    ctrl_data_files_free(&r->files);
    free(r->buf);
    free(r);
}
