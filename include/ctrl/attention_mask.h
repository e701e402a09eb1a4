/* The attention mask rule, written once for every attention path (CPU and CUDA, training and
 * decoding; header-only, so plugins and the core use it without linking anything). Positions are
 * within one sequence -- a flat batch's sequences never see each other (cu_seqlens, block tables
 * bound every loop) -- and query i sees key j when
 *     causal:        j <= i
 *     window W > 0:  j > i - W   (the W most recent keys, itself included)
 * The range helpers bound the keys or queries a tile has to visit; `visible` decides inside it. */
#ifndef CTRL_ATTENTION_MASK_H
#define CTRL_ATTENTION_MASK_H

#ifdef __CUDACC__
#define CTRL_MASK_FN static inline __host__ __device__
#else
#define CTRL_MASK_FN static inline
#endif

/* 1 when query i sees key j. */
CTRL_MASK_FN int ctrl_attention_visible(int causal, int window, int i, int j) {
    return (!causal || j <= i) && (window <= 0 || j > i - window);
}

/* The first key query q sees (and so any query >= q): q - window + 1, at least 0. */
CTRL_MASK_FN int ctrl_attention_first_key(int window, int q) {
    return window > 0 && q - window + 1 > 0 ? q - window + 1 : 0;
}

/* One past the last key a query < q_end sees, in a sequence of n keys. */
CTRL_MASK_FN int ctrl_attention_key_end(int causal, int q_end, int n) {
    return causal && q_end < n ? q_end : n;
}

/* The first query that sees key k (and so any key >= k). */
CTRL_MASK_FN int ctrl_attention_first_query(int causal, int k) { return causal ? k : 0; }

/* One past the last query that sees a key < k_end, in a sequence of n queries. */
CTRL_MASK_FN int ctrl_attention_query_end(int window, int k_end, int n) {
    return window > 0 && k_end - 1 + window < n ? k_end - 1 + window : n;
}

#undef CTRL_MASK_FN
#endif
