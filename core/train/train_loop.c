/* The step loop the core owns for every kind of trainer (DESIGN §7): steps and epochs, the
 * learning-rate schedule, the gradient norm and the health check, global-norm clipping, the
 * optimizer plugin, the logging window (metrics.jsonl), the evaluation cadence, checkpoints and
 * interruption. What a step's gradients are made from -- examples, prompts and generations,
 * preference pairs -- is the trainer kind's (kind.h); where they are computed is compute.h's.
 * Here: the run (resume, the steps, the final save) and the step loop's cadence; the pieces it calls
 * are train_setup.c, train_optimizer.c, train_step.c, train_eval_save.c and train_run_memory.c
 * (train_run.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "collective/collective.h"
#include "file_text.h"
#include "train/metrics_plot.h"
#include "train/offload_overlap.h"
#include "train/train_lora.h"
#include "train/train_run.h"

/* A permutation of 0..n-1, shuffled with a seeded generator (Fisher-Yates). */
static void shuffled(int *order, int n, uint64_t seed, int shuffle) {
    for (int i = 0; i < n; i++) order[i] = i;
    if (!shuffle) return;
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int i = n - 1; i > 0; i--) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((s >> 33) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j], order[j] = t;
    }
}

static void progress(long step, long total, double rate, double eta, double loss) {
    if (isatty(fileno(stderr))) {
        int width = 30, done = (int)(width * step / (total ? total : 1));
        fprintf(stderr, "\r[%.*s%*s] %ld/%ld  %.0f tok/s  ETA %.0fs  loss %.4f ", done,
                "##############################", width - done, "", step, total, rate, eta, loss);
        if (step == total) fputc('\n', stderr);
    }
}

/* The steps: schedule, logging window, evaluation cadence, checkpoints, interruption. */
static ctrl_status run_steps(run_state *r, ctrl_train_state *ts, const char *out_dir,
                             int (*interrupted)(void)) {
    const ctrl_run_settings *s = r->s;
    const int bs = s->train.per_device_train_batch_size;
    const int ga = s->train.gradient_accumulation_steps;
    const int n_rows = r->kind_ops->row_count(r->kind);
    const long rows_per_step = r->kind_ops->rows_per_step(r->kind, bs, ga) * r->dp.size;
    const long per_epoch = (n_rows + rows_per_step - 1) / rows_per_step;
    long total = s->train.max_steps;
    if (total <= 0) total = (long)ceil(s->train.num_train_epochs * per_epoch);
    ts->n_examples = n_rows, ts->max_steps = total;
    long warmup = s->train.warmup_steps;
    if (warmup <= 0) warmup = (long)ceil(s->train.warmup_ratio * total);
    const double lr0 = s->train.learning_rate;
    const double min_lr = s->train.min_lr_rate;
    const char *sched = s->train.lr_scheduler_type;
    const long log_every = s->train.logging_steps;
    const long save_every = s->train.save_steps;
    const char *save_strategy = s->train.save_strategy;
    const int saving = !save_strategy || strcmp(save_strategy, "no") != 0;
    const long eval_every = s->train.eval_steps;
    const int shuffle = s->data.shuffle;
    /* every rank evaluates, its share of the eval set (data_parallel.h: train_dp_eval_mine); rank 0
     * writes the metrics */
    const int has_eval = r->kind_ops->has_eval(r->kind);
    size_t n_params;
    ctrl_model_params(r->model, &n_params);
    r->kind_ops->describe(r->kind, total, bs, ga, n_params);
    if (r->dp.size > 1)
        CTRL_INFO("data parallel: %d ranks x %d x %d (effective batch %ld)", r->dp.size, bs, ga,
                  (long)r->dp.size * bs * ga);
    int *order = malloc(sizeof(int) * (size_t)(n_rows > 0 ? n_rows : 1));
    if (!order) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    long epoch_seen = -1;
    const long start_step = ts->step, start_tokens = ts->num_tokens;
    const double t_start = ctrl_now();
    ctrl_status st = CTRL_OK;
    if (r->kind_ops->eval_at_start && ts->step == 0) st = train_run_evaluate(r, has_eval, 0);
    while (ts->step < total && st == CTRL_OK) {
        const long step = ts->step, epoch = ts->cursor / n_rows;
        if (epoch != epoch_seen) { /* the order is a function of (seed, epoch): resumable */
            shuffled(order, n_rows, ts->seed + (uint64_t)epoch, shuffle);
            epoch_seen = epoch;
        }
        const double lr = ctrl_lr_at(sched ? sched : "linear", lr0, step, total, warmup, min_lr);
        train_step_stats s;
        double grad_norm = 0;
        const double t_step = ctrl_now(), cpu_step = ctrl_clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
        const long cursor0 = ts->cursor;
        st = train_run_step(r, order, &ts->cursor, bs, ga, lr, step, &s, &grad_norm);
        if (r->kind_ops->step_time)
            r->kind_ops->step_time(r->kind, ctrl_now() - t_step,
                                   ctrl_clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu_step);
        if (st == CTRL_ERR_INTERRUPTED) { /* long work inside the step (tokenizing a long row) */
            ts->cursor = cursor0;         /* the step did not happen: the state is the last step's */
            if (ts->step > start_step) {
                st = train_offload_drain(r->ov); /* offload_optimizer: the last step's host step */
                if (st == CTRL_OK) st = train_run_save_interrupted(r, out_dir, ts, "during");
            }
            break;
        }
        if (st != CTRL_OK) {
            if (st == CTRL_ERR_RUNTIME) train_run_name_last_checkpoint(st, out_dir); /* non-finite loss */
            break;
        }
        ts->step++, ts->num_tokens += s.tokens;
        ts->win_loss += s.loss, ts->win_acc += s.accuracy, ts->win_norm += grad_norm,
            ts->win_ent += s.entropy;
        ts->win++;
        const double elapsed = ctrl_now() - t_start, rate = (ts->num_tokens - start_tokens) / elapsed;
        if (r->root)
            progress(ts->step, total, rate, elapsed / (ts->step - start_step) * (total - ts->step), s.loss);
        if (r->root && (ts->step % log_every == 0 || ts->step == total))
            st = train_run_log_window(r, ts, total, lr, rate);
        if (st == CTRL_OK && r->zero.partitioned && ts->step == start_step + 1)
            st = train_run_report_resident(r);
        if (r->root && ts->step == start_step + 1 && ctrl_model_offloaded_bytes(r->model, NULL))
            train_run_report_offload(r);
        /* offload_optimizer's overlapped host step finished before anything but the next step's
         * forward reads the weights or the optimizer state (an evaluation, a save, the end) */
        if (st == CTRL_OK && eval_every > 0 && ts->step % eval_every == 0 && ts->step < total)
            st = train_offload_drain(r->ov);
        if (st == CTRL_OK && eval_every > 0 && ts->step % eval_every == 0 && ts->step < total)
            st = train_run_evaluate(r, has_eval, ts->step);
        /* a checkpoint every save_steps, at the end (as the HF Trainer), and when interrupted */
        const int stop = train_dp_any(&r->dp, ts->step < total && interrupted && interrupted());
        if (st == CTRL_OK && stop) {
            st = train_offload_drain(r->ov);
            if (st == CTRL_OK) st = train_run_save_interrupted(r, out_dir, ts, "after");
            break;
        }
        if (st == CTRL_OK && saving && (ts->step == total || (save_every > 0 && ts->step % save_every == 0)))
            st = train_offload_drain(r->ov);
        if (st == CTRL_OK && saving && (ts->step == total || (save_every > 0 && ts->step % save_every == 0)))
            st = train_run_save_checkpoint(r, out_dir, ts);
    }
    free(order);
    const ctrl_status drained = train_offload_drain(r->ov);
    if (st == CTRL_OK) st = drained;
    if (st == CTRL_OK) st = train_run_evaluate(r, has_eval, ts->step);
    return st;
}

ctrl_status ctrl_train_run(const ctrl_config *cfg, int (*interrupted)(void)) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    run_state r = {.cfg = cfg, .s = s, .root = ctrl_collective_is_root()};
    ctrl_collective_set_timeout(s->train.ddp_timeout);
    const char *out_dir = s->run.output_dir;
    const char *resume = s->train.resume_from_checkpoint;
    char ckpt[4200] = "";
    ctrl_status st = resume ? ctrl_checkpoint_resolve(out_dir, resume, ckpt, sizeof ckpt) : CTRL_OK;
    if (st == CTRL_OK) st = train_run_setup(&r, ckpt[0] ? ckpt : NULL);
    const uint64_t seed = s->run.seed;
    ctrl_train_state ts = {.seed = seed, .world_size = ctrl_collective_size()};
    ts.zero_stage = r.zero.stage, ts.zero_layout = train_zero_layout(&r.zero);
    snprintf(ts.optimizer, sizeof ts.optimizer, "%s", s->train.optimizer);
    if (st == CTRL_OK && ckpt[0]) {
        st = ctrl_checkpoint_load_state(ckpt, s->train.optimizer, r.opt_ops, r.opt, r.zero.stage,
                                        ctrl_collective_rank(), &ts);
        ts.zero_stage = r.zero.stage; /* zero1 <-> a CUDA zero2: the same slices */
        const int rows = st == CTRL_OK ? r.kind_ops->row_count(r.kind) : 0;
        if (st == CTRL_OK && ts.seed != seed)
            CTRL_WARN("resuming with [run] seed = %llu; the checkpoint was made with seed %llu",
                      (unsigned long long)seed, (unsigned long long)ts.seed),
                ts.seed = seed;
        if (st == CTRL_OK && ts.n_examples != rows)
            CTRL_WARN("the checkpoint was made on %ld training examples, this run has %d: the data order "
                      "differs from the interrupted run's",
                      ts.n_examples, rows);
        if (st == CTRL_OK && r.kind_ops->load_state) st = r.kind_ops->load_state(r.kind, ckpt, ts.step);
        if (st == CTRL_OK) CTRL_INFO("resuming from %s at step %ld", ckpt, ts.step);
    }
    if (st == CTRL_OK && r.root)
        st = train_metrics_open(&r.metrics, out_dir, ts.step, s->train.report_tensorboard);
    const long start_step = ts.step;
    if (st == CTRL_OK) st = run_steps(&r, &ts, out_dir, interrupted);
    /* Save on success, and on an interruption once a step was trained (interrupted while loading,
     * or during the first step, the model is what it was: output_dir keeps what it holds); never
     * after a failed step. */
    const int saving = st == CTRL_OK || st == CTRL_ERR_INTERRUPTED;
    /* zero3: each layer gathered to rank 0 alone when the save reaches it (zero_save.c), with LoRA
     * the adapters alone all-gathered (the frozen base never); else the whole model on every rank */
    const int streamed = saving && train_zero_save_streams(&r.zero);
    const int adapters = saving && train_zero_save_adapter_only(&r.zero); /* LoRA: no base gathered */
    if (saving && !streamed) {
        ctrl_status g = adapters ? train_zero_gather_adapters(&r.zero) : train_zero_gather_all(&r.zero);
        st = g != CTRL_OK ? g : st;
    }
    /* never a diverged model (zero3's slices have one owner each: nothing to compare) */
    if (st == CTRL_OK && !streamed && !adapters) st = train_dp_check_weights(&r.dp, r.model, ts.step);
    const int progressed = st == CTRL_OK || (st == CTRL_ERR_INTERRUPTED && ts.step > start_step);
    if (st == CTRL_ERR_INTERRUPTED && !progressed)
        ctrl_error_append(st, "interrupted before a step was trained: nothing saved");
    if (progressed && streamed) train_zero_save_begin(&r.zero);
    if (progressed && streamed && !r.root) { /* rank 0 saves: this rank sends its slices */
        ctrl_status e = train_zero_save_serve(&r.zero);
        st = e != CTRL_OK ? e : st;
    }
    if (progressed && r.root) {
        ctrl_error_saved run; /* an interruption's message, kept across the save */
        ctrl_error_save(&run, st);
        ctrl_status s2 = train_model_export(r.model, out_dir, s);
        if (streamed) { /* the other ranks stop serving, however the save went */
            const ctrl_status e = train_zero_save_end(&r.zero);
            s2 = s2 != CTRL_OK ? s2 : e;
        }
        if (s2 == CTRL_OK) s2 = ctrl_copy_tokenizer_files(s->model.path, out_dir);
        if (s2 == CTRL_OK && s->data.chat_template_path)
            s2 = ctrl_save_chat_template(s->data.chat_template_path, out_dir);
        if (s2 != CTRL_OK)
            st = s2;
        else {
            CTRL_INFO("%s saved to %s", ctrl_model_lora(r.model) ? "LoRA adapter (PEFT format)" : "model",
                      out_dir);
            ctrl_error_restore(&run);
        }
    }
    if (progressed && (streamed || adapters))
        train_zero_save_report(&r.zero, adapters ? "the adapter" : "the model");
    if (progressed) train_zero_whole_report(&r.zero);
    train_run_teardown(&r);
    if (progressed && r.root && s->train.report_png) { /* the plot is a convenience: never fails the run */
        char jsonl[4200], png[4200];
        ctrl_error_saved run;
        ctrl_error_save(&run, st);
        snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", out_dir);
        snprintf(png, sizeof png, "%s/metrics.png", out_dir);
        if (ctrl_metrics_plot(jsonl, png) == CTRL_OK)
            CTRL_INFO("curves plotted to %s", png);
        else
            CTRL_WARN("%s", ctrl_error_message());
        ctrl_error_restore(&run);
    }
    return st;
}
