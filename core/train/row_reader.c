/* Streaming row reader for JSONL files and JSON array files. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "train/row_reader.h"

struct ctrl_row_reader {
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

ctrl_status ctrl_row_reader_open(const char *path, ctrl_row_reader **out) {
    FILE *f = fopen(path, "r");
    if (!f) return ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
    ctrl_row_reader *r = calloc(1, sizeof *r);
    char *name = strdup(path);
    if (!r || !name) {
        free(r), free(name), fclose(f);
        return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    }
    r->f = f, r->path = name, r->line = 1;
    /* A file whose first non-blank character is '[' is one JSON array; anything else is JSONL. */
    int c;
    while ((c = getc(f)) != EOF && (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == 0xEF ||
                                    c == 0xBB || c == 0xBF)) /* blanks and a UTF-8 BOM */
        r->line += c == '\n';
    if (c == '[')
        r->array = 1;
    else if (c != EOF)
        ungetc(c, f);
    *out = r;
    return CTRL_OK;
}

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
    return r->array ? next_element(r, row, line) : next_line(r, row, line);
}

void ctrl_row_reader_close(ctrl_row_reader *r) {
    if (!r) return;
    fclose(r->f);
    free(r->path);
    free(r->buf);
    free(r);
}
