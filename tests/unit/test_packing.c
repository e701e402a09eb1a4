/* Packing against TRL's pack_dataset (fixtures from tests/reference/make_packing_fixtures.py: 1500
 * sequences with a skewed length distribution, pack length 128): bfd, bfd_split and wrapped give
 * TRL's rows, in TRL's order, with its sequence lengths; the fill rate of bfd against wrapped is
 * reported. And the batch layouts: sequences of a packed row restart positions and predict nothing
 * across their boundary; padded rows and pad_to_multiple_of add masked pad segments only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_text.h"
#include "test.h"
#include "train/train.h"

#define SEQ 128

/* Sequence i holds the consecutive ids start_i .. start_i + len_i - 1, all trained. */
static void load_input(ctrl_dataset *d) {
    ctrl_status st;
    char *text = ctrl_read_text_file(CTRL_FIXTURE_DIR "/packing/lengths.txt", 1 << 20, &st);
    CHECK(text != NULL);
    memset(d, 0, sizeof *d);
    d->ex = calloc(2000, sizeof(ctrl_example));
    int32_t next = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        ctrl_example *e = &d->ex[d->n++];
        e->len = atoi(line);
        e->ids = malloc(sizeof(int32_t) * (size_t)e->len);
        e->trained = malloc((size_t)e->len);
        for (int k = 0; k < e->len; k++) e->ids[k] = next++, e->trained[k] = 1;
    }
    free(text);
}

/* Compares the packed rows with TRL's; returns TRL's fill rate. */
static double compare(const char *strategy, const ctrl_dataset *d) {
    char path[512];
    snprintf(path, sizeof path, CTRL_FIXTURE_DIR "/packing/%s.txt", strategy);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 20, &st), *save;
    int rows = 0, same = 1;
    long tokens = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), rows++) {
        char *bar = strchr(line, '|');
        *bar = 0;
        int lens[256], firsts[256], n = 0, m = 0;
        for (char *p = strtok(line, " "); p; p = strtok(NULL, " ")) lens[n++] = atoi(p);
        for (char *p = strtok(bar + 1, " "); p; p = strtok(NULL, " ")) firsts[m++] = atoi(p);
        CHECK_EQ_INT(n, m);
        if (rows >= d->n) continue;
        const ctrl_example *e = &d->ex[rows];
        const int n_seg = e->n_seg ? e->n_seg : 1;
        same &= n_seg == n;
        for (int g = 0, off = 0; same && g < n; g++) {
            const int len = e->n_seg ? e->seg[g] : e->len;
            same &= len == lens[g] && e->ids[off] == firsts[g];
            for (int k = 1; k < len; k++) same &= e->ids[off + k] == e->ids[off] + k; /* the right tokens */
            off += len;
            tokens += len;
        }
        CHECK_MSG(same, "%s row %d differs from TRL's", strategy, rows);
        if (!same) break;
    }
    CHECK_EQ_INT(d->n, rows);
    free(text);
    return (double)tokens / ((double)rows * SEQ);
}

static void pack_case(const char *strategy, double *fill_ctrl, double *fill_trl) {
    ctrl_dataset d;
    load_input(&d);
    CHECK_EQ_INT(d.n, 1500);
    CHECK_EQ_INT(ctrl_dataset_pack(&d, SEQ, strategy), CTRL_OK);
    CHECK_EQ_INT(d.packed_from, 1500);
    *fill_trl = compare(strategy, &d);
    *fill_ctrl = ctrl_dataset_fill_rate(&d, SEQ);
    ctrl_dataset_free(&d);
}

TEST(bfd_matches_trl) {
    double a, b;
    pack_case("bfd", &a, &b);
    CHECK_NEAR(a, b, 1e-12);
}

TEST(bfd_split_matches_trl) {
    double a, b;
    pack_case("bfd_split", &a, &b);
    CHECK_NEAR(a, b, 1e-12);
}

TEST(wrapped_matches_trl) {
    double a, b;
    pack_case("wrapped", &a, &b);
    CHECK_NEAR(a, b, 1e-12);
}

/* The fill rate on the skewed distribution, bfd against wrapped: bfd keeps sequence boundaries and
 * still fills nearly as well (it drops the overflow of long sequences); wrapped fills every block
 * but the last, cutting sequences anywhere. */
TEST(fill_rate_bfd_against_wrapped) {
    double bfd, bfd_trl, split, split_trl, wrapped, wrapped_trl;
    pack_case("bfd", &bfd, &bfd_trl);
    pack_case("bfd_split", &split, &split_trl);
    pack_case("wrapped", &wrapped, &wrapped_trl);
    printf("  fill rate at pack length %d: bfd %.4f, bfd_split %.4f, wrapped %.4f (TRL: %.4f, %.4f, %.4f)\n",
           SEQ, bfd, split, wrapped, bfd_trl, split_trl, wrapped_trl);
    CHECK(bfd > 0.95 && split > 0.95 && wrapped > 0.99);
}

TEST(unknown_strategy_is_an_error) {
    ctrl_dataset d;
    load_input(&d);
    CHECK_EQ_INT(ctrl_dataset_pack(&d, SEQ, "first_fit"), CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "packing_strategy");
    ctrl_dataset_free(&d);
}

/* Two packed rows (3 and 1 sequences) and one plain example, laid out three ways. */
static void small_dataset(ctrl_dataset *d) {
    static const int lens[] = {3, 2, 4, 5, 6};
    ctrl_dataset in = {.ex = calloc(5, sizeof(ctrl_example))};
    for (int i = 0; i < 5; i++) {
        ctrl_example *e = &in.ex[in.n++];
        e->len = lens[i];
        e->ids = malloc(sizeof(int32_t) * (size_t)e->len);
        e->trained = malloc((size_t)e->len);
        for (int k = 0; k < e->len; k++) e->ids[k] = 100 * i + k, e->trained[k] = k > 0;
    }
    CHECK_EQ_INT(ctrl_dataset_pack(&in, 9, "bfd"), CTRL_OK);
    *d = in;
}

TEST(batch_layouts_restart_positions_and_mask_pads) {
    ctrl_dataset d;
    small_dataset(&d);
    int idx[16];
    long total = 0, real_sum = 0;
    for (int i = 0; i < d.n; i++) idx[i] = i, total += d.ex[i].len;
    for (int layout = 0; layout < 3; layout++) {
        d.padded = layout == 1;
        d.pad_multiple = layout == 2 ? 8 : 0;
        d.pad_id = 7;
        ctrl_batch b;
        long real = 0, trained = ctrl_batch_build(&d, idx, d.n, &b, &real);
        CHECK_EQ_INT(real, layout == 2 ? b.T : total); /* TRL counts padding-free pads, not padded rows' */
        if (layout == 2) CHECK_EQ_INT(b.T % 8, 0);
        if (layout == 1) CHECK_EQ_INT(b.T % d.n, 0); /* rows of equal length */
        long counted = 0;
        for (int s = 0; s < b.B; s++) {
            const int len = b.cu_seqlens[s + 1] - b.cu_seqlens[s];
            const int is_pad = b.tokens[b.cu_seqlens[s]] == 7;
            for (int k = 0; k < len; k++) {
                const int t = b.cu_seqlens[s] + k;
                CHECK_EQ_INT(b.positions[t], k);
                if (is_pad || k == len - 1)
                    CHECK_EQ_INT(b.targets[t], -100); /* nothing across a boundary */
                else
                    CHECK_EQ_INT(b.targets[t], b.tokens[t + 1]);
                counted += b.targets[t] >= 0;
            }
        }
        CHECK_EQ_INT(counted, trained);
        real_sum += trained;
        ctrl_batch_free(&b);
    }
    CHECK_EQ_INT(real_sum % 3, 0); /* the same trained targets in every layout */
    ctrl_dataset_free(&d);
}
