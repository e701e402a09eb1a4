/* Parquet files and Arrow IPC streams (core/dataset/), by their magic bytes: the footer or schema,
 * every row group's pages or record batch's buffers decoded and every row assembled into JSON
 * (docs/fuzzing.md). Seeds: the .parquet and .arrow files of tests/fixtures/parquet and arrow. */
#include "dataset/arrow_ipc.h"
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
    cJSON *row;
    if (fd >= 0 && ctrl_parquet_magic(data, size)) {
        ctrl_parquet *p = NULL;
        if (ctrl_parquet_open(path, &p) == CTRL_OK) {
            while (ctrl_parquet_next(p, &row) == 1) cJSON_Delete(row);
            ctrl_parquet_close(p);
        }
    } else if (fd >= 0) {
        ctrl_arrow *a = NULL;
        if (ctrl_arrow_open(path, &a) == CTRL_OK) {
            while (ctrl_arrow_next(a, &row) == 1) cJSON_Delete(row);
            ctrl_arrow_close(a);
        }
    }
    fuzz_file_close(fd);
    return 0;
}
