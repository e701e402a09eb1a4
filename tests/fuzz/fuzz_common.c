/* See fuzz_common.h. */
#include "fuzz_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ctrl/log.h>

int fuzz_split(const uint8_t *data, size_t size, fuzz_part *parts, int max) {
    const size_t sep = strlen(FUZZ_SEPARATOR);
    int n = 0;
    for (int i = 0; i < max; i++) parts[i] = (fuzz_part){(const uint8_t *)"", 0};
    while (n < max - 1) {
        const uint8_t *at = size >= sep ? memmem(data, size, FUZZ_SEPARATOR, sep) : NULL;
        if (!at) break;
        parts[n++] = (fuzz_part){data, (size_t)(at - data)};
        size -= (size_t)(at - data) + sep;
        data = at + sep;
    }
    parts[n++] = (fuzz_part){data, size};
    return n;
}

int fuzz_memfile(const void *data, size_t size, char *path, size_t cap) {
    int fd = memfd_create("fuzz", 0);
    if (fd < 0) return -1;
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, (const char *)data + done, size - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

void fuzz_file_close(int fd) {
    if (fd >= 0) close(fd);
}

static char scratch[512];

static void scratch_remove(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    if (scratch[0] && system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", scratch);
}

const char *fuzz_scratch_dir(void) {
    if (!scratch[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
        snprintf(scratch, sizeof scratch, "%s/ctrl-fuzz-XXXXXX", base ? base : "/tmp");
        if (!mkdtemp(scratch)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(scratch_remove);
    }
    return scratch;
}

void fuzz_scratch_put(const char *name, const void *data, size_t size) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", fuzz_scratch_dir(), name);
    if (size == (size_t)-1) {
        unlink(path);
        return;
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

char *fuzz_strdup(fuzz_part p) {
    char *s = malloc(p.size + 1);
    if (!s) abort();
    memcpy(s, p.data, p.size);
    s[p.size] = '\0';
    return s;
}

void fuzz_quiet(void) {
    ctrl_log_set_level(CTRL_LOG_OFF);
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
}
