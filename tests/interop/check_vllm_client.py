#!/usr/bin/env python3
"""By-hand interop check: `ctrl serve` driven by clients nobody on the project wrote.

Starts `ctrl serve` on a tiny random model (ctrl model init + the tiny_bpe fixture tokenizer, which
has a ChatML chat template) and drives TRL 1.16's own VLLMClient (trl/generation/vllm_client.py)
and the official `openai` client through every call they make, and TRL's GRPOTrainer with
use_vllm=True, vllm_mode="server" for 3 steps (examples/trl/grpo_with_ctrl_serve.py: the weight
sync over POST /update_weights), then prints a result table
(markdown) and exits 1 if any check failed. Not run by CI (CI never runs Python): the C test
tests/serve/test_serve_clients.c replays the TRL client's recorded requests instead.

usage: check_vllm_client.py [BUILD_DIR]   (default: build; uses torch, trl, openai, requests,
                                           safetensors: what is missing is reported skipped)

TRL's client refuses to start without vLLM installed (it imports vLLM only for the NCCL weight
sync); this script tells it vLLM is there (trl.generation.vllm_client.is_vllm_available) so that
every HTTP call can be checked on a machine without vLLM. Weight sync: the server here runs on the
CPU, where ctrl serve has no NCCL weight-transfer engine (its /server_info says
weight_transfer_config null, so init_communicator refuses with TRL's own message); the check pushes
weights through ctrl's POST /update_weights (safetensors) instead. The NCCL engine (`ctrl serve
--device cuda --weight-transfer-config '{"backend": "nccl"}'`) is driven by TRL's GRPOTrainer in
tests/e2e/gpu_trl_grpo_nccl.py where a GPU exists.
"""
import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

try:
    import requests
except ImportError:
    print("check_vllm_client.py: skipped: the requests package is not installed")
    sys.exit(0)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
CTRL = os.path.join(BUILD, "ctrl")
PLUGINS = os.path.join(BUILD, "plugins")
results = []


def check(name, fn):
    t0 = time.time()
    try:
        detail = fn() or ""
        results.append((name, "pass", detail, time.time() - t0))
    except ImportError as e:
        results.append((name, "skipped", f"not installed here: {e}", time.time() - t0))
    except Exception as e:  # noqa: BLE001 - every failure goes into the table
        results.append((name, "FAIL", f"{type(e).__name__}: {e}"[:300], time.time() - t0))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model, port, *flags):
    log = open(os.path.join(os.path.dirname(model), f"serve-{port}.log"), "w")
    p = subprocess.Popen([CTRL, "--plugin-dir", PLUGINS, "serve", "--model", model, "--port", str(port), *flags],
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return p
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError("ctrl serve did not start")


def main():
    tmp = tempfile.mkdtemp(prefix="ctrl-interop-")
    model = os.path.join(tmp, "m")
    subprocess.run([CTRL, "model", "init", "--arch", "qwen3", "--hidden", "64", "--layers", "2", "--heads", "4",
                    "--kv-heads", "2", "--tokenizer", os.path.join(ROOT, "tests/fixtures/tokenizer/tiny_bpe"),
                    "--out", model], check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(model, port, "--drain-s", "5")
    try:
        for name, fn, args in (("trl", trl_checks, (base,)), ("trl", grpo_check, (base, model)),
                               ("openai", openai_checks, (base,))):
            try:
                fn(*args)
            except ImportError as e:  # where the package is not installed: said, not failed
                results.append((f"{name}: (all calls)", "skipped", f"not installed here: {e}", 0.0))
        server_checks(base, model)
        drain_check(server, base)
    finally:
        if server.poll() is None:
            server.kill()
    print("| client | call | result | detail | s |")
    print("|---|---|---|---|---|")
    for name, res, detail, dt in results:
        client, _, call = name.partition(": ")
        print(f"| {client} | {call} | {res} | {detail.replace('|', '/')} | {dt:.2f} |")
    failed = sum(r[1] == "FAIL" for r in results)
    skipped = sum(r[1] == "skipped" for r in results)
    print(f"\n{len(results) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def trl_checks(base):
    import trl
    import trl.generation.vllm_client as vc

    vc.is_vllm_available = lambda *a, **k: True  # vLLM itself is needed only for the NCCL weight sync
    client = vc.VLLMClient(base_url=base, connection_timeout=10)
    T = f"TRL {trl.__version__} VLLMClient"

    check(f"{T}: check_server", lambda: client.check_server(5) or "health 200")

    def server_info():
        info = client.get_server_info()
        assert info["weight_transfer_config"] is None
        return f"max_model_len {info['model_config']['max_model_len']}, weight_transfer_config null"
    check(f"{T}: get_server_info", server_info)
    check(f"{T}: get_world_size", lambda: f"world_size {client.get_world_size()}")

    def generate():
        out = client.generate(["1+2=", "Hello"], n=2, max_tokens=5, temperature=1.0, top_p=0.9, top_k=50, min_p=0.01,
                              repetition_penalty=1.1, logprobs=0)
        assert len(out["prompt_ids"]) == 2 and len(out["completion_ids"]) == 4
        assert all(len(l) == len(c) for l, c in zip(out["logprobs"], out["completion_ids"]))
        assert all(ids[0] == t for ids_seq, c in zip(out["logprob_token_ids"], out["completion_ids"])
                   for ids, t in zip(ids_seq, c))
        return f"4 completions, per-token logprobs {out['logprobs'][0][:2]}"
    check(f"{T}: generate (text, n=2, logprobs=0)", generate)

    def generate_top():
        out = client.generate([[5, 6, 7, 8]], max_tokens=4, logprobs=3, temperature=0.8,
                              generation_kwargs={"seed": 7, "frequency_penalty": 0.5, "presence_penalty": 0.2})
        assert out["prompt_ids"] == [[5, 6, 7, 8]]
        assert all(3 <= len(p) <= 4 for p in out["logprobs"][0])
        assert all(p == sorted(p, reverse=True) for p in out["logprobs"][0])
        again = client.generate([[5, 6, 7, 8]], max_tokens=4, logprobs=3, temperature=0.8,
                                generation_kwargs={"seed": 7, "frequency_penalty": 0.5, "presence_penalty": 0.2})
        assert again["completion_ids"] == out["completion_ids"], "same seed, other tokens"
        return f"token ids, logprobs=3 -> {len(out['logprobs'][0][0])} per token, seeded repeatable"
    check(f"{T}: generate (token ids, logprobs=3, seed, penalties)", generate_top)

    def unseeded():
        outs = {tuple(client.generate(["1+2="], max_tokens=8)["completion_ids"][0]) for _ in range(4)}
        assert len(outs) > 1, "4 unseeded requests gave the same tokens"
        return f"{len(outs)} different samples of 4"
    check(f"{T}: generate without seed differs", unseeded)

    def chat():
        msgs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": [{"type": "text", "text": "2+2"}]}]]
        out = client.chat(msgs, n=1, max_tokens=4, logprobs=2)
        assert len(out["prompt_ids"]) == 2 and len(out["completion_ids"]) == 2
        assert all(2 <= len(p) <= 3 for p in out["logprobs"][0])
        out0 = client.chat(msgs[:1], max_tokens=3, logprobs=None)
        assert out0["logprobs"] is None
        return f"prompt {len(out['prompt_ids'][0])} tokens, logprobs=2 -> {len(out['logprobs'][0][0])} per token"
    check(f"{T}: chat (logprobs 2, None; content parts)", chat)

    def seq_logprobs():
        seqs = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14]]
        out = client.get_sequence_logprobs(seqs, prompt_lengths=[3, 2], top_logprobs=5, temperature=1.0)
        assert [len(x) for x in out["logprobs"]] == [3, 2]
        assert all(len(p) == 5 for x in out["logprobs"] for p in x)
        assert all(a[0] <= 0 for x in out["actual_logprobs"] for a in x)
        return f"completion positions {[len(x) for x in out['logprobs']]}, top 5 each"
    check(f"{T}: get_sequence_logprobs (prompt_logprobs)", seq_logprobs)
    check(f"{T}: reset_prefix_cache", lambda: client.reset_prefix_cache() or "200")

    def init_communicator():
        try:
            client.init_communicator(device="cuda")
        except RuntimeError as e:
            assert "weight-transfer" in str(e) or "weight_transfer" in str(e), str(e)
            return "refused before any rendezvous: " + str(e)[:90]
        raise AssertionError("init_communicator did not refuse")
    check(f"{T}: init_communicator (NCCL)", init_communicator)

    def weight_bracket():
        client._start_weight_update()
        client._finish_weight_update()
        r = requests.post(f"{base}/update_weights", json={"update_info": {"names": ["x"]}})
        assert r.status_code == 501 and "/update_weights" in r.json()["error"]["message"]
        return "start/finish 200; JSON update_info 501 naming POST /update_weights (safetensors)"
    check(f"{T}: start/finish_weight_update, update_weights(update_info)", weight_bracket)


def grpo_check(base, model):
    sys.path.insert(0, os.path.join(ROOT, "examples", "trl"))
    import grpo_with_ctrl_serve

    def grpo():
        trainer = grpo_with_ctrl_serve.train(model, base, 3)
        logs = [l for l in trainer.state.log_history if "sampling/sampling_logp_difference/max" in l]
        diffs = [float(l["sampling/sampling_logp_difference/max"]) for l in logs]
        assert trainer.state.global_step == 3 and len(diffs) == 3, trainer.state.log_history
        # the server's log-probabilities equal transformers' on the trainer's weights, before and
        # after each weight sync (a sync that did not land would leave them apart)
        assert max(diffs) < 1e-4, diffs
        return f"3 steps; max |server logprob - transformers logprob| per step: {', '.join(f'{d:.1e}' for d in diffs)}"
    check("TRL GRPOTrainer: use_vllm=True, vllm_mode='server' (weights over POST /update_weights)", grpo)


def openai_checks(base):
    import openai

    c = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    O = f"openai {openai.__version__}"
    model = c.models.list().data[0].id

    def completions():
        r = c.completions.create(model=model, prompt="1+2=", max_tokens=6, stop=["\n", "zz"], logprobs=2, echo=True,
                                 presence_penalty=0.5, frequency_penalty=0.5, seed=3, user="me", n=2)
        assert len(r.choices) == 2 and r.usage.total_tokens > 0 and r.choices[0].text.startswith("1+2=")
        lp = r.choices[0].logprobs
        assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
        return f"echo+logprobs: {len(lp.tokens)} tokens; usage {r.usage.total_tokens}"
    check(f"{O}: completions (stop list, logprobs, echo, penalties, seed, user, n)", completions)

    def stop_string():
        free = c.completions.create(model=model, prompt="a", max_tokens=12, temperature=0).choices[0].text
        if len(free) < 3:
            return "skipped: greedy text too short"
        stop = free[1:3]
        r = c.completions.create(model=model, prompt="a", max_tokens=12, temperature=0, stop=stop)
        assert r.choices[0].text == free[:free.index(stop)] and r.choices[0].finish_reason == "stop", (free, r)
        return f"{free!r} stopped at {stop!r} -> {r.choices[0].text!r}"
    check(f"{O}: completions stop string cuts the text", stop_string)

    def chat():
        r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                      max_completion_tokens=4, logprobs=True, top_logprobs=3, seed=1)
        e = r.choices[0].logprobs.content[0]
        assert len(e.top_logprobs) == 3 and e.bytes is not None
        return f"content parts, max_completion_tokens, top_logprobs 3; finish {r.choices[0].finish_reason}"
    check(f"{O}: chat (content parts, logprobs/top_logprobs, max_completion_tokens)", chat)

    def chat_stream():
        chunks = list(c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                                stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage is not None and chunks[-1].choices == []
        assert len({ch.id for ch in chunks}) == 1
        return f"{len(chunks)} chunks, one id, usage {chunks[-1].usage.total_tokens} in the last"
    check(f"{O}: chat stream with stream_options.include_usage", chat_stream)

    def completion_stream():
        chunks = list(c.completions.create(model=model, prompt="1+2=", max_tokens=5, stream=True, logprobs=1))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        return f"{len(chunks)} chunks, text {text!r}"
    check(f"{O}: completions stream with logprobs", completion_stream)

    def errors():
        seen = []
        for kw, field in (({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"),
                          ({"presence_penalty": 3}, "presence_penalty"), ({"n": 0}, "n"),
                          ({"extra_body": {"tools": [{"type": "function"}]}}, "tools"), ({"logprobs": -1}, "logprobs")):
            try:
                c.completions.create(model=model, prompt="x", max_tokens=2, **kw)
            except openai.BadRequestError as e:
                assert e.status_code == 400 and field in e.message and e.body["param"] == field, (field, e.body)
                seen.append(field)
            else:
                raise AssertionError(f"{kw} accepted")
        return "400 with message and param: " + ", ".join(seen)
    check(f"{O}: invalid values -> 400 naming the field", errors)

    def too_long():
        try:
            c.completions.create(model=model, prompt=[i % 1000 + 1 for i in range(3999)], max_tokens=200)
        except openai.BadRequestError as e:
            assert "3999 prompt tokens + max_tokens 200" in e.message, e.message
            return e.message[:100]
        raise AssertionError("accepted")
    check(f"{O}: prompt + max_tokens beyond the context -> 400", too_long)

    def unseeded():
        texts = {c.completions.create(model=model, prompt="x", max_tokens=8).choices[0].text for _ in range(4)}
        seeded = {c.completions.create(model=model, prompt="x", max_tokens=8, seed=5).choices[0].text for _ in range(3)}
        assert len(texts) > 1 and len(seeded) == 1, (texts, seeded)
        return f"unseeded: {len(texts)} of 4 differ; seeded: 1 of 3"
    check(f"{O}: fresh randomness without seed, repeatable with one", unseeded)


def server_checks(base, model):
    S = "HTTP"

    def disconnect():
        t0 = time.time()
        try:
            requests.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 4000, "n": 64}, timeout=1.0)
        except requests.exceptions.Timeout:
            pass
        for _ in range(100):
            h = requests.get(f"{base}/health").json()
            if h["requests_in_flight"] == 0:
                return f"non-streamed request cancelled {time.time() - t0 - 1:.2f} s after the client left"
            time.sleep(0.05)
        raise AssertionError("the generation still runs")
    check(f"{S}: a non-streaming client that disconnects cancels its generation", disconnect)

    def weights():
        import torch
        from safetensors.torch import save
        body = {"prompt": "1+2=", "max_tokens": 6, "temperature": 0}
        before = requests.post(f"{base}/v1/completions", json=body).json()["choices"][0]["text"]
        st = save({"model.norm.weight": torch.randn(64, generator=torch.Generator().manual_seed(0))})
        r = requests.post(f"{base}/update_weights", data=st, headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 200 and r.json()["updated"] == 1, r.text
        after = requests.post(f"{base}/v1/completions", json=body).json()["choices"][0]["text"]
        assert after != before
        return "safetensors body applied; greedy output changed"
    check(f"{S}: weight update over POST /update_weights", weights)


def drain_check(server, base):
    def drain():
        box = {}
        def long():
            box["r"] = requests.post(f"{base}/generate", json={"prompts": ["x"], "n": 64, "max_tokens": 4000})
        t = threading.Thread(target=long)
        t.start()
        time.sleep(0.5)
        t0 = time.time()
        server.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        h = requests.get(f"{base}/health", timeout=2)
        refused = requests.post(f"{base}/v1/completions", json={"prompt": "x"}, timeout=2)
        server.wait(timeout=30)
        t.join()
        dt = time.time() - t0
        assert h.status_code == 503 and refused.status_code == 503 and box["r"].status_code == 503
        assert dt < 5 + 3, dt
        return f"/health 503 while draining, new request 503, exit {server.returncode} after {dt:.1f} s (--drain-s 5)"
    check("HTTP: SIGTERM drains within --drain-s while /health answers", drain)


if __name__ == "__main__":
    sys.exit(main())
