/* Packing against TRL's pack_dataset (fixtures from tests/reference/make_packing_fixtures.py: 1500
 * sequences with a skewed length distribution and 1200 with a bimodal one, pack length 128): bfd,
 * bfd_split and wrapped give TRL's rows, in TRL's order, with its sequence lengths; the fill rates
 * of bfd against wrapped equal those TRL's rows have (fill_rates.txt) and are printed. And the batch layouts:
 * sequences of a packed row restart positions and predict nothing across their boundary; padded rows and
 * pad_to_multiple_of add masked pad segments only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_text.h"
#include "test.h"
#include "train/train.h"

#define SEQ 128

/* Sequence i holds the consecutive ids start_i .. start_i + len_i - 1, all trained. */
static void load_input(ctrl_dataset *d, const char *dist) {
    char path[512];
    snprintf(path, sizeof path, CTRL_FIXTURE_DIR "/packing/lengths%s.txt", dist);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 20, &st);
    CHECK(text != NULL);
    memset(d, 0, sizeof *d);
    d->ex = calloc(2000, sizeof(ctrl_example));
    if (!text) return;
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

/* Compares the packed rows with TRL's. */
static void compare(const char *strategy, const char *dist, const ctrl_dataset *d) {
    char path[512];
    snprintf(path, sizeof path, CTRL_FIXTURE_DIR "/packing/%s%s.txt", strategy, dist);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 20, &st), *save;
    int rows = 0, same = 1;
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
        }
        CHECK_MSG(same, "%s row %d differs from TRL's", strategy, rows);
        if (!same) break;
    }
    CHECK_EQ_INT(d->n, rows);
    free(text);
}

typedef struct packed_stats {
    int rows;
    long tokens_in, tokens_kept;
    double fill;
} packed_stats;

static packed_stats pack_case(const char *strategy, const char *dist, int n_in) {
    ctrl_dataset d;
    load_input(&d, dist);
    CHECK_EQ_INT(d.n, n_in);
    packed_stats p = {0};
    for (int i = 0; i < d.n; i++) p.tokens_in += d.ex[i].len;
    CHECK_EQ_INT(ctrl_dataset_pack(&d, SEQ, strategy), CTRL_OK);
    CHECK_EQ_INT(d.packed_from, n_in);
    compare(strategy, dist, &d);
    p.rows = d.n;
    for (int i = 0; i < d.n; i++) p.tokens_kept += d.ex[i].len;
    p.fill = ctrl_dataset_fill_rate(&d, SEQ);
    ctrl_dataset_free(&d);
    return p;
}

TEST(bfd_matches_trl) {
    pack_case("bfd", "", 1500);
    pack_case("bfd", ".bimodal", 1200);
}
TEST(bfd_split_matches_trl) {
    pack_case("bfd_split", "", 1500);
    pack_case("bfd_split", ".bimodal", 1200);
}
TEST(wrapped_matches_trl) {
    pack_case("wrapped", "", 1500);
    pack_case("wrapped", ".bimodal", 1200);
}

/* The fill rate (tokens kept / (rows * 128)) of bfd against wrapped, on both distributions, equals
 * what TRL's own packing gives (fill_rates.txt, written by the reference script from TRL's rows).
 * On the skewed one (mostly short sequences) bfd fills nearly as well as wrapped while keeping
 * sequence boundaries; on the bimodal one (mostly over half the pack length) bfd leaves a fifth of
 * each row empty and drops the overflow of long sequences, bfd_split keeps every token in more
 * rows, and wrapped fills every block but the last by cutting sequences anywhere. */
TEST(fill_rate_bfd_against_wrapped) {
    ctrl_status st;
    char *text = ctrl_read_text_file(CTRL_FIXTURE_DIR "/packing/fill_rates.txt", 1 << 16, &st), *save;
    CHECK(text != NULL);
    if (!text) return;
    int cases = 0;
    double fill[2][3] = {{0}};
    printf("  pack length %d        rows  tokens kept / in   fill rate (TRL)\n", SEQ);
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char dist[32], strategy[32];
        int rows;
        long kept, in;
        double trl_fill;
        CHECK_EQ_INT(sscanf(line, "%31s %31s %d %ld %ld %lf", dist, strategy, &rows, &kept, &in, &trl_fill),
                     6);
        const int bimodal = !strcmp(dist, "bimodal");
        const packed_stats p = pack_case(strategy, bimodal ? ".bimodal" : "", bimodal ? 1200 : 1500);
        CHECK_EQ_INT(p.rows, rows);
        CHECK_EQ_INT(p.tokens_kept, kept);
        CHECK_EQ_INT(p.tokens_in, in);
        CHECK_NEAR(p.fill, trl_fill, 1e-12);
        fill[bimodal][!strcmp(strategy, "bfd") ? 0 : !strcmp(strategy, "bfd_split") ? 1 : 2] = p.fill;
        printf("  %-7s %-9s %6d  %6ld / %6ld   %.4f (%.4f)\n", dist, strategy, p.rows, p.tokens_kept,
               p.tokens_in, p.fill, trl_fill);
        cases++;
    }
    CHECK_EQ_INT(cases, 6);
    for (int k = 0; k < 2; k++)
        CHECK(fill[k][2] > fill[k][0] && fill[k][2] > fill[k][1]); /* wrapped fills most */
    free(text);
}

TEST(unknown_strategy_is_an_error) {
    ctrl_dataset d;
    load_input(&d, "");
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
