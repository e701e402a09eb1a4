/* ctrl serve's life cycle: the model, tokenizer, chat template, engine and batcher; the daemon;
 * and the drain after a stop: /health answers 503 and new generations are refused (503) while the
 * requests in flight run on for at most drain_s; then every generation still queued or running is
 * aborted (its client gets a 503), and the server returns once the connections have answered. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ctrl/log.h>

#include "device/cuda_backend.h"
#include "interrupt.h"
#include "serve/serve_internal.h"

void ctrl_serve_options_default(ctrl_serve_options *o) {
    *o = (ctrl_serve_options){.host = "127.0.0.1",
                              .port = 8000,
                              .kv_cache_bytes = (size_t)256 << 20,
                              .kv_cache_dtype = -1,
                              .max_body = (size_t)1 << 20,
                              .max_seqs = 4096,
                              .max_queued = 16384,
                              .prefill_chunk = 512,
                              .timeout_s = 30,
                              .max_connections = 512,
                              .max_per_ip = 256,
                              .drain_s = 60,
                              .device = "cpu",
                              .weight_transfer_timeout_s = 300};
}

static int in_flight(ctrl_server *s) {
    pthread_mutex_lock(&s->lock);
    const int n = s->in_flight;
    pthread_mutex_unlock(&s->lock);
    return n;
}

/* Waits up to `seconds` for the requests in flight to answer; whether they all did. */
static int wait_idle(ctrl_server *s, double seconds) {
    for (long i = 0; i < (long)(seconds * 20); i++) {
        if (!in_flight(s)) return 1;
        usleep(50 * 1000);
    }
    return !in_flight(s);
}

/* Long work in flight (tokenizing a long prompt) is interrupted only once the drain's deadline has
 * passed, not by the signal that started the drain (core/interrupt.h). One server per process. */
static volatile sig_atomic_t past_deadline;
static int drain_interrupted(void) { return past_deadline; }

static void drain(ctrl_server *s, struct MHD_Daemon *d) {
    pthread_mutex_lock(&s->lock);
    s->draining = 1; /* the daemon still accepts: /health says 503, generations are refused */
    pthread_mutex_unlock(&s->lock);
    CTRL_INFO("serve: draining (at most %d s, --drain-s)", s->opt->drain_s);
    past_deadline = 0;
    ctrl_interrupt_set_source(drain_interrupted);
    if (!wait_idle(s, s->opt->drain_s)) {
        past_deadline = 1;
        CTRL_WARN("serve: %d request(s) still running after the %d s drain: aborting them", in_flight(s),
                  s->opt->drain_s);
        pthread_mutex_lock(&s->lock);
        s->shutting_down = 1;
        pthread_mutex_unlock(&s->lock);
        ctrl_batcher_abort(s->batch, "the server is shutting down (drain deadline passed)");
        wait_idle(s, 5); /* their answers go out; MHD_stop_daemon closes whatever is left */
    }
    MHD_stop_daemon(d);
    ctrl_interrupt_set_source(NULL);
}

/* The longest sequence the server accepts: the model's context, or the KV pool if smaller. */
static void context_limit(ctrl_server *s) {
    const ctrl_model_config *c = ctrl_model_cfg(s->model);
    const long pool = ctrl_engine_capacity_tokens(s->eng);
    s->context = c->max_position_embeddings;
    s->context_from_kv = pool > 0 && pool < s->context;
    if (s->context_from_kv) s->context = (int)pool;
}

/* --device: the model (and so the engine's KV pool) on the CUDA device, or left on the CPU. */
static ctrl_status place(ctrl_server *s, ctrl_device dev) {
    if (dev.type == CTRL_DEVICE_CPU) return CTRL_OK;
    if (dev.index != 0)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "--device %s: ctrl serve runs on device 0 (choose the GPU with CUDA_VISIBLE_DEVICES)",
            s->opt->device);
    CTRL_INFO("serve: the model on %s", s->opt->device);
    return ctrl_model_to_device(s->model, s->cuda->ops, dev);
}

ctrl_status ctrl_serve_run(const ctrl_serve_options *o, const ctrl_registry *reg, int (*stop)(void)) {
    ctrl_server s = {.opt = o};
    pthread_mutex_init(&s.lock, NULL);
    pthread_mutex_init(&s.lora_lock, NULL);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    s.rng = (uint64_t)now.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)now.tv_sec ^ ((uint64_t)getpid() << 32);
    FILE *ur = fopen("/dev/urandom", "rb"); /* better, where there is one */
    if (ur) {
        uint64_t r = 0;
        if (fread(&r, sizeof r, 1, ur) == 1) s.rng ^= r;
        fclose(ur);
    }
    ctrl_device dev;
    ctrl_status st = ctrl_device_select(o->device, &dev, &s.cuda);
    /* bf16 on the CPU: frozen and held as the bf16 GEMM's panels as it loads, as ctrl generate --dtype
     * bf16 holds it (where no bf16 kernel runs, decoding packs the weights at its first step instead);
     * /update_weights packs again what it changes (ctrl_model_write_view) */
    const int held = o->bf16 && dev.type == CTRL_DEVICE_CPU;
    if (st == CTRL_OK)
        st = held ? ctrl_model_load_frozen_bf16(o->model_dir, NULL, &s.model)
                  : ctrl_model_load(o->model_dir, NULL, &s.model);
    if (st == CTRL_OK) st = place(&s, dev);
    if (st == CTRL_OK && o->bf16) st = ctrl_model_set_compute_dtype(s.model, CTRL_BF16);
    char summary[256];
    if (st == CTRL_OK && held) ctrl_model_held_summary(s.model, summary, sizeof summary);
    if (st == CTRL_OK && held)
        CTRL_INFO("serve: %s (%s)",
                  ctrl_model_base_in_panels(s.model)
                      ? "the weights held as bf16 GEMM panels"
                      : "not held as bf16 GEMM panels (no bf16 GEMM kernel here: decoding packs its own)",
                  summary);
    if (st == CTRL_OK) st = serve_lora_start(&s); /* --lora's adapters */
    if (st == CTRL_OK) st = ctrl_tokenizer_load(o->model_dir, &s.tok);
    if (st == CTRL_OK && ctrl_tokenizer_chat_template(s.tok)) st = ctrl_chat_template_load(s.tok, &s.chat);
    const ctrl_engine_config ec = {.kv_cache_bytes = o->kv_cache_bytes,
                                   .block_size = 16,
                                   .max_num_seqs = 256,
                                   .max_num_batched_tokens = 8192,
                                   .prefix_cache = 1,
                                   .kv_cache_dtype = o->kv_cache_dtype};
    const ctrl_plugin *paged = NULL;
    if (st == CTRL_OK) st = ctrl_registry_require(reg, CTRL_KIND_ATTENTION, "paged", &paged);
    if (st == CTRL_OK) st = ctrl_engine_attach_attention(s.model, paged);
    if (st == CTRL_OK) st = ctrl_engine_create(s.model, &ec, &s.eng);
    if (st == CTRL_OK) {
        ctrl_engine_set_prefill_chunk(s.eng, o->prefill_chunk);
        s.n_stop = ctrl_generation_stop_ids(o->model_dir, s.tok, s.stops, 16);
        size_t n_params = 0;
        ctrl_model_params(s.model, &n_params);
        s.weights_body = n_params * 4 + ((size_t)16 << 20); /* all of it in f32, and the header */
        context_limit(&s);
        st = ctrl_batcher_start(s.eng, &s.batch);
    }
    if (st == CTRL_OK && !(s.deadline = serve_deadline_start(o->timeout_s)))
        st = ctrl_error_set(CTRL_ERR_RUNTIME, "serve: cannot start the connection watchdog");
    struct MHD_Daemon *d = NULL;
    if (st == CTRL_OK && !(d = serve_daemon_start(&s)))
        st = ctrl_error_set(CTRL_ERR_IO, "serve: cannot listen on %s:%d", o->host, o->port);
    if (st == CTRL_OK) {
        char routes[512];
        serve_route_list(routes, sizeof routes);
        CTRL_INFO("serving %s on http://%s:%d (%s)%s; context %d tokens", o->model_dir, o->host, o->port,
                  routes, o->api_key ? "; API key required" : "", s.context);
        while (!stop()) usleep(100 * 1000);
        drain(&s, d);
        CTRL_INFO("serve: stopped");
    }
    serve_deadline_stop(s.deadline);
    serve_wt_free(&s); /* the NCCL group, if any */
    ctrl_batcher_stop(s.batch);
    ctrl_engine_free(s.eng);
    ctrl_template_free(s.chat);
    ctrl_tokenizer_free(s.tok);
    ctrl_model_free(s.model);
    serve_lora_stop(&s);
    pthread_mutex_destroy(&s.lora_lock);
    pthread_mutex_destroy(&s.lock);
    return st;
}
