/* Data parallel without a launcher (core/collective/, train/data_parallel.c): a process that no
 * launcher started is rank 0 of 1 and its collectives change nothing; the share layout gives each
 * of N ranks its block of every micro-batch so that, micro-batch by micro-batch, the ranks' rows
 * are one process's batch of N·bs in the same order, across the end of the epoch's order too. */
#include <stdlib.h>

#include "collective/collective.h"
#include "test.h"
#include "train/data_parallel.h"

TEST(single_process_is_rank_0_of_1) {
    unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("PMI_SIZE");
    setenv("SLURM_PROCID", "0", 1), setenv("SLURM_NTASKS", "1", 1); /* one task: still no MPI */
    CHECK(ctrl_collective_init() == CTRL_OK);
    CHECK_EQ_INT(ctrl_collective_size(), 1);
    CHECK_EQ_INT(ctrl_collective_rank(), 0);
    CHECK(ctrl_collective_is_root());
    CHECK_STR(ctrl_collective_info_get()->backend, "none");
    float g[3] = {1.5f, -2, 3};
    double d[2] = {4, 5};
    CHECK(ctrl_collective_allreduce_mean_f32(g, 3) == CTRL_OK);
    CHECK(ctrl_collective_allreduce_sum_f64(d, 2) == CTRL_OK);
    CHECK(ctrl_collective_broadcast(g, sizeof g, 0) == CTRL_OK && ctrl_collective_barrier() == CTRL_OK);
    CHECK(g[0] == 1.5f && g[1] == -2 && g[2] == 3 && d[0] == 4 && d[1] == 5);
    CHECK(train_dp_items(17) == 17);
}

/* N ranks of a step of ga micro-batches of bs rows over an order of n rows starting at cursor: the
 * rows rank r's kind reads (view[(cursor + j) % n], j < bs·ga) are its block of each micro-batch. */
static void check_share(int N, int bs, int ga, int n, long cursor) {
    int *order = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) order[i] = (i * 7 + 3) % n; /* a permutation (n coprime to 7) */
    for (int r = 0; r < N; r++) {
        train_dp dp = {.rank = r, .size = N, .rows_per_rank = (long)bs * ga, .chunk = bs, .n_rows = n};
        dp.view = malloc(sizeof(int) * (size_t)n);
        const int *v = train_dp_share(&dp, order, cursor);
        for (int g = 0; g < ga; g++)
            for (int i = 0; i < bs; i++) {
                const long mine = cursor + (long)g * bs + i,
                           one_process = cursor + (long)g * N * bs + (long)r * bs + i;
                CHECK_MSG(v[mine % n] == order[one_process % n], "N %d rank %d micro-batch %d row %d", N, r,
                          g, i);
            }
        CHECK_EQ_INT(train_dp_advance(&dp, cursor, cursor + (long)bs * ga), cursor + (long)N * bs * ga);
        free(dp.view);
    }
    free(order);
}

TEST(share_is_one_process_batch_in_order) {
    check_share(2, 2, 2, 23, 0);
    check_share(2, 2, 2, 23, 20); /* the step runs past the end of the order: it wraps, as one process's */
    check_share(3, 4, 1, 13, 5);
    check_share(4, 1, 3, 19, 17);
    train_dp one = {.rank = 0, .size = 1};
    int order[3] = {2, 0, 1};
    CHECK(train_dp_share(&one, order, 1) == order); /* one rank: the order itself */
    CHECK_EQ_INT(train_dp_advance(&one, 4, 9), 9);
}
