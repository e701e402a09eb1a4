/* The parquet reader (core/dataset/) against files written by pyarrow and the `datasets` library
 * (tests/reference/make_parquet_fixtures.py): every row equals the row pyarrow reads back (the
 * fixture's .jsonl), across snappy / zstd / gzip / uncompressed pages, data pages v1 and v2,
 * dictionary and plain encodings, nulls, nested lists and structs, several row groups. Then the
 * dataset paths: folders, the Hub's split file names, Hub dataset ids in a local cache; and damaged
 * files (truncated, bytes changed), which must fail with a message naming the file, never crash. */
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataset/arrow_ipc.h"
#include "dataset/dataset_files.h"
#include "dataset/parquet.h"
#include "test.h"
#include "train/row_reader.h"

#define FX CTRL_FIXTURE_DIR "/parquet/"

static const char *const fixtures[] = {"sft_messages", "prompt_completion", "preference", "types",
                                       "arithmetic"};

/* Every row of FILE (or folder) read through the row reader against JSONL (pyarrow's read-back);
 * returns the row count. */
static int compare_rows(const char *file, const char *jsonl) {
    ctrl_row_reader *r;
    CHECK_MSG(ctrl_row_reader_open(file, &r) == CTRL_OK, "%s: %s", file, ctrl_error_message());
    FILE *f = fopen(jsonl, "r");
    CHECK(f != NULL);
    char line[8192];
    int n = 0, got;
    long at;
    cJSON *row;
    while ((got = ctrl_row_reader_next(r, &row, &at)) == 1) {
        CHECK_MSG(f && fgets(line, sizeof line, f), "%s: more rows than %s", file, jsonl);
        cJSON *want = cJSON_Parse(line);
        const int same = want && cJSON_Compare(row, want, 1);
        if (!same) {
            char *s = cJSON_PrintUnformatted(row);
            CHECK_MSG(same, "%s row %d: got %s, pyarrow read %s", file, n, s, line);
            free(s);
        }
        cJSON_Delete(want), cJSON_Delete(row);
        n++;
    }
    CHECK_MSG(got == 0, "%s: %s", file, ctrl_error_message());
    CHECK_MSG(!f || !fgets(line, sizeof line, f), "%s: fewer rows than %s", file, jsonl);
    if (f) fclose(f);
    ctrl_row_reader_close(r);
    return n;
}

/* Every row of NAME.parquet against NAME.jsonl, and the footer's row count; returns the row count. */
static int compare_fixture(const char *name) {
    char pq_path[512], jl_path[512];
    snprintf(pq_path, sizeof pq_path, FX "%s.parquet", name);
    snprintf(jl_path, sizeof jl_path, FX "%s.jsonl", name);
    const int n = compare_rows(pq_path, jl_path);
    ctrl_parquet *p = NULL;
    CHECK_MSG(ctrl_parquet_open(pq_path, &p) == CTRL_OK, "%s: %s", name, ctrl_error_message());
    if (p) CHECK_EQ_INT(n, (int)ctrl_parquet_num_rows(p));
    ctrl_parquet_close(p);
    return n;
}

TEST(rows_equal_pyarrow) {
    const int want[] = {20, 24, 12, 7, 48};
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(compare_fixture(fixtures[i]), want[i]);
    CHECK_EQ_INT(compare_fixture("encodings"), 300); /* DELTA_* and BYTE_STREAM_SPLIT, 2 row groups */
}

TEST(messages_are_lists_of_objects) {
    ctrl_parquet *p;
    CHECK_EQ_INT(ctrl_parquet_open(FX "sft_messages.parquet", &p), CTRL_OK);
    cJSON *row;
    CHECK_EQ_INT(ctrl_parquet_next(p, &row), 1);
    const cJSON *m = cJSON_GetObjectItem(row, "messages");
    CHECK(cJSON_IsArray(m) && cJSON_GetArraySize(m) == 3);
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "role")->valuestring, "user");
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "content")->valuestring, "What is 1 + 0?");
    cJSON_Delete(row);
    ctrl_parquet_close(p);
}

/* A MAP column, as the Arrow reader gives one too: a list of {key, value} objects (pyarrow's own
 * read-back is a list of pairs, not JSON). */
TEST(maps_are_lists_of_key_value_objects) {
    ctrl_parquet *p;
    CHECK_EQ_INT(ctrl_parquet_open(FX "map.parquet", &p), CTRL_OK);
    cJSON *row,
        *want = cJSON_Parse("{\"m\": [{\"key\": \"a\", \"value\": 1}, {\"key\": \"b\", \"value\": null}]}");
    CHECK_EQ_INT(ctrl_parquet_next(p, &row), 1);
    CHECK(cJSON_Compare(row, want, 1));
    cJSON_Delete(row), cJSON_Delete(want);
    want = cJSON_Parse("{\"m\": null}");
    CHECK_EQ_INT(ctrl_parquet_next(p, &row), 1);
    CHECK(cJSON_Compare(row, want, 1));
    cJSON_Delete(row), cJSON_Delete(want);
    want = cJSON_Parse("{\"m\": []}");
    CHECK_EQ_INT(ctrl_parquet_next(p, &row), 1);
    CHECK(cJSON_Compare(row, want, 1));
    cJSON_Delete(row), cJSON_Delete(want);
    CHECK_EQ_INT(ctrl_parquet_next(p, &row), 0);
    ctrl_parquet_close(p);
}

TEST(split_names) {
    char b[256];
    CHECK_STR(ctrl_data_file_split("data/train-00000-of-00003.parquet", b, sizeof b), "train");
    CHECK_STR(ctrl_data_file_split("data/my_split-00001-of-00002.parquet", b, sizeof b), "my_split");
    CHECK_STR(ctrl_data_file_split("default/validation/0000.parquet", b, sizeof b), "validation");
    CHECK_STR(ctrl_data_file_split("train/data-00000-of-00001.arrow", b, sizeof b), "train");
    CHECK_STR(ctrl_data_file_split("test.jsonl", b, sizeof b), "test");
    CHECK_STR(ctrl_data_file_split("sets/my_dev.jsonl", b, sizeof b), "validation");
    CHECK_STR(ctrl_data_file_split("evaluation-2.parquet", b, sizeof b), "test");
    CHECK(ctrl_data_file_split("foo.parquet", b, sizeof b) == NULL);
    CHECK(ctrl_data_file_split("retrain.parquet", b, sizeof b) == NULL); /* no separator before */
    CHECK(ctrl_data_file_split("intervals/x.parquet", b, sizeof b) == NULL);
}

static int count_rows(const char *path, const char *split) {
    ctrl_row_reader *r;
    if (ctrl_row_reader_open_split(path, split, &r) != CTRL_OK) return -1;
    cJSON *row;
    long line;
    int n = 0, got;
    while ((got = ctrl_row_reader_next(r, &row, &line)) == 1) {
        n += row != NULL;
        cJSON_Delete(row);
    }
    ctrl_row_reader_close(r);
    return got < 0 ? -2 : n;
}

static char root[256];

static void sh(const char *cmd) { CHECK_MSG(system(cmd) == 0, "%s", cmd); }

TEST(folders_and_hub_ids) {
    snprintf(root, sizeof root, "/tmp/ctrl-parquet-test-XXXXXX");
    CHECK(mkdtemp(root) != NULL);
    /* the fixture folder: .parquet files win over the .jsonl beside them; no split names: all train */
    CHECK_EQ_INT(count_rows(CTRL_FIXTURE_DIR "/parquet", NULL), 20 + 24 + 12 + 7 + 48 + 3 + 300);
    CHECK_EQ_INT(count_rows(CTRL_FIXTURE_DIR "/parquet", "test"), -1);
    CHECK_CONTAINS(ctrl_error_message(), "no data files of split 'test' (splits found: train)");
    CHECK_EQ_INT(count_rows(FX "preference.jsonl", NULL), 12); /* a file as before */
    /* a Hub cache as huggingface_hub lays it out: snapshot files linking into blobs/, refs/main */
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "set -e; r=%s/hub/datasets--org--chat; mkdir -p $r/refs $r/blobs $r/snapshots/1a2b/data; "
             "echo 1a2b > $r/refs/main; cp " FX "sft_messages.parquet $r/blobs/b1; cp " FX
             "arithmetic.parquet "
             "$r/blobs/b2; cp " FX "prompt_completion.parquet $r/blobs/b3; cd $r/snapshots/1a2b; "
             "ln -s ../../../blobs/b1 data/train-00000-of-00002.parquet; "
             "ln -s ../../../blobs/b2 data/train-00001-of-00002.parquet; "
             "ln -s ../../../blobs/b3 data/test-00000-of-00001.parquet; echo card > README.md; "
             "touch .gitattributes",
             root);
    sh(cmd);
    char hub[512];
    snprintf(hub, sizeof hub, "%s/hub", root);
    setenv("HF_HUB_CACHE", hub, 1);
    CHECK_EQ_INT(count_rows("org/chat", NULL), 20 + 48);
    CHECK_EQ_INT(count_rows("org/chat", "train"), 20 + 48);
    CHECK_EQ_INT(count_rows("org/chat@1a2b", "test"), 24);
    CHECK_EQ_INT(count_rows("org/chat", "validation"), -1);
    CHECK_CONTAINS(ctrl_error_message(), "splits found: test, train");
    CHECK_EQ_INT(count_rows("org/missing", NULL), -1);
    CHECK_CONTAINS(ctrl_error_message(), "datasets--org--missing");
    CHECK_CONTAINS(ctrl_error_message(), "--repo-type dataset");
    /* the Hub's parquet conversion, revision refs/convert/parquet: CONFIG/SPLIT/NNNN.parquet, a subset per
     * configuration */
    snprintf(
        cmd, sizeof cmd,
        "set -e; r=%s/hub/datasets--org--chat; mkdir -p $r/refs/refs/convert $r/snapshots/9c9c/default/train "
        "$r/snapshots/9c9c/default/test $r/snapshots/9c9c/other/train; echo 9c9c > "
        "$r/refs/refs/convert/parquet; "
        "cd $r/snapshots/9c9c; cp ../../blobs/b1 default/train/0000.parquet; cp ../../blobs/b3 "
        "default/test/0000.parquet; cp ../../blobs/b2 other/train/0000.parquet",
        root);
    sh(cmd);
    ctrl_data_files f;
    CHECK_EQ_INT(ctrl_data_files_find_in("org/chat@refs/convert/parquet", "default", "train", &f), CTRL_OK);
    CHECK(f.n == 1 && strstr(f.paths[0], "snapshots/9c9c/default/train/0000.parquet"));
    ctrl_data_files_free(&f);
    CHECK_EQ_INT(ctrl_data_files_find_in("org/chat@refs/convert/parquet", "other", NULL, &f), CTRL_OK);
    CHECK(f.n == 1 && strstr(f.paths[0], "other/train/0000.parquet"));
    ctrl_data_files_free(&f);
    CHECK_EQ_INT(ctrl_data_files_find_in("org/chat@refs/convert/parquet", NULL, "test", &f), CTRL_OK);
    CHECK_EQ_INT(f.n, 1);
    ctrl_data_files_free(&f);
    CHECK_EQ_INT(ctrl_data_files_find_in("org/chat@refs/convert/parquet", NULL, "train", &f), CTRL_OK);
    CHECK_EQ_INT(f.n, 2); /* both configurations without a subset */
    ctrl_data_files_free(&f);
    CHECK(ctrl_data_files_find_in("org/chat@refs/convert/parquet", "nope", NULL, &f) != CTRL_OK);
    CHECK_CONTAINS(ctrl_error_message(),
                   "no data files in the folder of subset 'nope' (folders: default, other)");
    /* push_to_hub's default configuration lives in data/ */
    CHECK_EQ_INT(ctrl_data_files_find_in("org/chat", "default", "train", &f), CTRL_OK);
    CHECK_EQ_INT(f.n, 2);
    ctrl_data_files_free(&f);
    /* the row reader names the file each row came from */
    ctrl_row_reader *r;
    CHECK_EQ_INT(ctrl_row_reader_open_split("org/chat", "train", &r), CTRL_OK);
    cJSON *row;
    long line = 0;
    for (int i = 0; i < 21; i++) {
        CHECK_EQ_INT(ctrl_row_reader_next(r, &row, &line), 1);
        cJSON_Delete(row);
    }
    CHECK_CONTAINS(ctrl_row_reader_file(r), "train-00001-of-00002.parquet");
    CHECK_EQ_INT((int)line, 1);
    ctrl_row_reader_close(r);
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    sh(cmd);
    unsetenv("HF_HUB_CACHE");
}

/* Reads every row of `path` (parquet, or an Arrow stream or file); 1 when it read to the end, 0 on
 * a clean error naming the file, -1 on an error that does not name it. */
static int read_all(const char *path, int arrow) {
    ctrl_parquet *p = NULL;
    ctrl_arrow *a = NULL;
    if ((arrow ? ctrl_arrow_open(path, &a) : ctrl_parquet_open(path, &p)) != CTRL_OK)
        return strstr(ctrl_error_message(), path) ? 0 : -1;
    cJSON *row;
    int r;
    while ((r = arrow ? ctrl_arrow_next(a, &row) : ctrl_parquet_next(p, &row)) == 1) cJSON_Delete(row);
    ctrl_parquet_close(p);
    ctrl_arrow_close(a);
    if (r == 0) return 1;
    return strstr(ctrl_error_message(), path) ? 0 : -1;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = malloc(*n);
    if (b && fread(b, 1, *n, f) != *n) free(b), b = NULL;
    fclose(f);
    return b;
}

/* An in-memory file holding b[0..n): its /proc path in `path` (the caller closes the fd). */
static int memfile(const unsigned char *b, size_t n, char *path, size_t cap) {
    const int fd = memfd_create("parquet", 0);
    if (fd < 0 || (n && write(fd, b, n) != (ssize_t)n)) return fd;
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

/* Damaged copies of `file`: cut at many lengths (each must fail: a parquet file ends with its footer,
 * an Arrow stream with its end marker, an Arrow file with its footer), and single bytes changed all
 * over (the footer's or metadata's lengths and offsets, page headers, buffers, compressed data,
 * levels), which must read or fail naming the file. None may crash (the sanitizer build runs this
 * too). Counts the changed copies that failed. */
static int damage(const char *file, int arrow) {
    int failed = 0;
    char tmp[64];
    size_t n = 0;
    unsigned char *b = slurp(file, &n), *c = malloc(n ? n : 1);
    CHECK(b && c);
    for (size_t cut = 0; b && c && cut < n; cut += 1 + n / 40) {
        const int fd = memfile(b, cut, tmp, sizeof tmp);
        const int r = read_all(tmp, arrow);
        CHECK_MSG(r == 0, "%s cut at %zu: %s", file, cut, ctrl_error_message());
        close(fd);
    }
    for (size_t at = 0; b && c && at < n; at += 5) {
        memcpy(c, b, n);
        c[at] ^= (unsigned char)(0x55 + at);
        const int fd = memfile(c, n, tmp, sizeof tmp);
        const int r = read_all(tmp, arrow);
        CHECK_MSG(r >= 0, "%s byte %zu: a failure not naming the file: %s", file, at, ctrl_error_message());
        failed += r == 0;
        close(fd);
    }
    free(b), free(c);
    return failed;
}

TEST(damaged_files_fail_cleanly) {
    int failed = 0;
    for (int i = 0; i < 4; i++) {
        char path[512];
        snprintf(path, sizeof path, FX "%s.parquet", fixtures[i]);
        failed += damage(path, 0);
    }
    failed += damage(FX "encodings.parquet", 0);
    printf("damaged parquet files: %d of the changed copies failed cleanly\n", failed);
    CHECK(failed > 100);
}

TEST(not_parquet) {
    CHECK(ctrl_parquet_open(FX "types.jsonl", &(ctrl_parquet *){NULL}) == CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "no PAR1 magic");
    CHECK(ctrl_parquet_open(FX "nothing.parquet", &(ctrl_parquet *){NULL}) == CTRL_ERR_IO);
    CHECK_CONTAINS(ctrl_error_message(), "nothing.parquet");
}

#define AX CTRL_FIXTURE_DIR "/arrow/"

TEST(arrow_rows_equal_pyarrow) {
    CHECK_EQ_INT(compare_rows(AX "types_zstd.arrow", AX "types.jsonl"), 7); /* ZSTD, 3 record batches */
    CHECK_EQ_INT(compare_rows(AX "types_file.arrow", AX "types.jsonl"), 7); /* the file format */
    /* a save_to_disk DatasetDict: its train/ folder is the train split */
    CHECK_EQ_INT(compare_rows(AX "chat_dict", AX "chat_dict.train.jsonl"), 20);
    CHECK_EQ_INT(count_rows(AX "chat_dict", "test"), 5);
    CHECK_EQ_INT(count_rows(AX "chat_dict", "validation"), -1);
    CHECK_CONTAINS(ctrl_error_message(), "splits found: test, train");
}

TEST(damaged_arrow_fails_cleanly) {
    const int failed = damage(AX "types_zstd.arrow", 1) + damage(AX "types_file.arrow", 1) +
                       damage(AX "chat_dict/train/data-00000-of-00001.arrow", 1);
    printf("damaged Arrow files: %d of the changed copies failed cleanly\n", failed);
    CHECK(failed > 100);
}
