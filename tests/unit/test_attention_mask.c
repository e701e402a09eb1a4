/* The one attention mask rule (include/ctrl/attention_mask.h) against the definition written out
 * here independently, and its range helpers as exact bounds of it: over every small sequence, with
 * and without causality and windows, the first/last visible key of each query span and the
 * first/last query that sees each key span are what the helpers say. */
#include <ctrl/attention_mask.h>

#include "test.h"

/* The definition, as the attention args document it: causal keys j <= i, window keys i-W < j. */
static int rule(int causal, int window, int i, int j) {
    if (causal && j > i) return 0;
    if (window > 0 && j <= i - window) return 0;
    return 1;
}

TEST(visible_is_the_documented_rule) {
    for (int causal = 0; causal <= 1; causal++)
        for (int w = 0; w <= 5; w++)
            for (int i = 0; i < 9; i++)
                for (int j = 0; j < 9; j++)
                    CHECK_EQ_INT(ctrl_attention_visible(causal, w, i, j), rule(causal, w, i, j));
}

TEST(key_and_query_ranges_are_exact_bounds) {
    for (int n = 1; n <= 9; n++)
        for (int causal = 0; causal <= 1; causal++)
            for (int w = 0; w <= 5; w++)
                for (int a = 0; a < n; a++)
                    for (int b = a + 1; b <= n; b++) { /* the span [a, b) */
                        int first_key = n, key_end = 0, first_query = n, query_end = 0;
                        for (int i = a; i < b; i++) /* keys seen by queries of the span */
                            for (int j = 0; j < n; j++)
                                if (rule(causal, w, i, j)) {
                                    if (j < first_key) first_key = j;
                                    if (j + 1 > key_end) key_end = j + 1;
                                }
                        for (int j = a; j < b; j++) /* queries that see keys of the span */
                            for (int i = 0; i < n; i++)
                                if (rule(causal, w, i, j)) {
                                    if (i < first_query) first_query = i;
                                    if (i + 1 > query_end) query_end = i + 1;
                                }
                        CHECK_EQ_INT(ctrl_attention_first_key(w, a), first_key);
                        CHECK_EQ_INT(ctrl_attention_key_end(causal, b, n), key_end);
                        CHECK_EQ_INT(ctrl_attention_first_query(causal, a), first_query);
                        CHECK_EQ_INT(ctrl_attention_query_end(w, b, n), query_end);
                    }
}
