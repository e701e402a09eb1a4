/* Shared by the libFuzzer targets (docs/fuzzing.md). The loaders take paths, so the fuzz bytes
 * become in-memory files (memfd, named /proc/self/fd/N); a loader that reads a directory gets a
 * scratch directory on tmpfs. Nothing touches the disk per input. */
#ifndef CTRL_FUZZ_COMMON_H
#define CTRL_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* The fuzz targets' entry points (libFuzzer's interface). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Separates the parts of a multi-part input (e.g. tokenizer.json, tokenizer_config.json, text). */
#define FUZZ_SEPARATOR "\n=====\n"

typedef struct fuzz_part {
    const uint8_t *data;
    size_t size;
} fuzz_part;

/* Splits data at FUZZ_SEPARATOR into at most `max` parts (the last takes the rest); returns the
 * count. Parts not present are empty. */
int fuzz_split(const uint8_t *data, size_t size, fuzz_part *parts, int max);

/* An in-memory file holding `size` bytes; *path receives its name. Returns the fd to pass to
 * fuzz_file_close, or -1. */
int fuzz_memfile(const void *data, size_t size, char *path, size_t cap);
void fuzz_file_close(int fd);

/* A scratch directory on tmpfs (made once, removed at exit) and writing one file into it;
 * size (size_t)-1 removes the file instead. */
const char *fuzz_scratch_dir(void);
void fuzz_scratch_put(const char *name, const void *data, size_t size);

/* A malloc'd NUL-terminated copy of a part. */
char *fuzz_strdup(fuzz_part p);

/* Silences the library's logging and makes OpenMP single-threaded: one input at a time. */
void fuzz_quiet(void);

#endif
