/* The data files a dataset path names, as the `datasets` library finds them: a file; a folder (a
 * local copy, a `datasets` save_to_disk folder, a Hub snapshot), searched recursively for
 * .parquet files (else .jsonl / .json, else `datasets`' save_to_disk .arrow files) and narrowed to one split
 * by the names the Hub uses (data/train-00000-of-00003.parquet, train/..., test.jsonl,
 * default/validation/0000.parquet...); or a Hub dataset id ORG/NAME[@REVISION] found in the local Hugging
 * Face cache (datasets--ORG--NAME, as core/hub_cache.h finds models). No network. */
#ifndef CTRL_DATASET_FILES_H
#define CTRL_DATASET_FILES_H

#include <ctrl/status.h>

typedef struct ctrl_data_files {
    char **paths; /* sorted */
    int n;
} ctrl_data_files;

/* The files of `split` (NULL: "train") under `path`. A folder whose file names carry no split is
 * all "train". Errors name the path, what was looked for and the splits found. */
ctrl_status ctrl_data_files_find(const char *path, const char *split, ctrl_data_files *out);
/* The same within a subset (a Hub dataset's configuration: the files under the folder SUBSET/, as
 * push_to_hub(config_name=SUBSET) and the Hub's parquet conversion lay them out; `default` is also
 * data/); NULL or "" for all. */
ctrl_status ctrl_data_files_find_in(const char *path, const char *subset, const char *split,
                                    ctrl_data_files *out);
void ctrl_data_files_free(ctrl_data_files *f);

/* Which split a file belongs to, by its path relative to the dataset's folder ("data/train-00000-
 * of-00001.parquet" -> "train"): the canonical split name (train, validation, test) or, for the
 * Hub's sharded names, the name in the file; NULL when the name carries none. Exposed for tests. */
const char *ctrl_data_file_split(const char *rel, char *buf, unsigned cap);

#endif
