#include "fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARRAYS 64

struct fixture {
    int n;
    char names[MAX_ARRAYS][64];
    long counts[MAX_ARRAYS];
    float *data[MAX_ARRAYS];
};

fixture *fixture_load(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "fixture %s: cannot open\n", path);
        return NULL;
    }
    fixture *f = calloc(1, sizeof *f);
    char line[256];
    int ok = 0;
    while (fgets(line, sizeof line, fp)) {
        if (line[0] == '#') continue;
        if (!strcmp(line, "end\n")) {
            ok = 1;
            break;
        }
        if (f->n == MAX_ARRAYS || sscanf(line, "%63s %ld", f->names[f->n], &f->counts[f->n]) != 2) break;
        f->n++;
    }
    for (int i = 0; ok && i < f->n; i++) {
        f->data[i] = malloc(sizeof(float) * (size_t)(f->counts[i] ? f->counts[i] : 1));
        if (!f->data[i] || fread(f->data[i], sizeof(float), (size_t)f->counts[i], fp) != (size_t)f->counts[i])
            ok = 0;
    }
    fclose(fp);
    if (!ok) {
        fprintf(stderr, "fixture %s: malformed\n", path);
        fixture_free(f);
        return NULL;
    }
    return f;
}

const float *fixture_get(const fixture *f, const char *name, long *n) {
    for (int i = 0; f && i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            if (n) *n = f->counts[i];
            return f->data[i];
        }
    if (n) *n = 0;
    return NULL;
}

void fixture_free(fixture *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->data[i]);
    free(f);
}
