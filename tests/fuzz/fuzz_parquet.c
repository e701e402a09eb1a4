/* Parquet files (core/dataset/): the footer, the schema tree, every row group's pages decoded and
 * every row assembled into JSON (docs/fuzzing.md). Seeds: the .parquet files of tests/fixtures/parquet. */
#include "dataset/parquet.h"
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    const int fd = fuzz_memfile(data, size, path, sizeof path);
    ctrl_parquet *p = NULL;
    if (fd >= 0 && ctrl_parquet_open(path, &p) == CTRL_OK) {
        cJSON *row;
        while (ctrl_parquet_next(p, &row) == 1) cJSON_Delete(row);
        ctrl_parquet_close(p);
    }
    fuzz_file_close(fd);
    return 0;
}
