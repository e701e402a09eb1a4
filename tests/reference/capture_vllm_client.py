#!/usr/bin/env python3
"""Records the HTTP requests TRL's own VLLMClient sends, for tests/unit/test_serve_clients.c.

TRL 1.16's trl/generation/vllm_client.py is driven against a mock of vLLM's server (answers in
vLLM's shapes, just enough for the client to go on); every request it makes (method, path with
query, JSON body) is written to tests/fixtures/serve/trl_vllm_client.json with `reads`: the
response fields that client method reads, transcribed from vllm_client.py (a path per field:
`a.b` an object's member, `a[]` every element of a list, then `:type`). The C test replays each
request against `ctrl serve` over HTTP and checks that every field read is there, with its type.

usage: /work/venv/bin/python tests/reference/capture_vllm_client.py   (needs trl 1.16, torch, requests)
"""
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import trl
import trl.generation.vllm_client as vc

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "serve", "trl_vllm_client.json")
recorded = []

# What each client method reads of the response (vllm_client.py, TRL 1.16).
READS = {
    "__init__": ["data[0].id:string"],
    "check_server": [],
    # (and GRPOTrainer reads model_config.logprobs_mode of it, trl/trainer/grpo_trainer.py)
    "get_server_info": ["vllm_config:object", "vllm_config.weight_transfer_config:null",
                        "vllm_config.model_config.logprobs_mode:string"],
    "get_world_size": ["world_size:number"],
    "generate": ["choices[].prompt_token_ids:ints", "choices[].token_ids:ints", "choices[].logprobs.tokens[]:string",
                 "choices[].logprobs.token_logprobs[]:number", "choices[].logprobs.top_logprobs[]:object"],
    "generate_no_logprobs": ["choices[].prompt_token_ids:ints", "choices[].token_ids:ints", "choices[0].logprobs:null"],
    "chat": ["prompt_token_ids:ints", "choices[].token_ids:ints", "choices[].logprobs.content[].token:string",
             "choices[].logprobs.content[].logprob:number", "choices[].logprobs.content[].top_logprobs[].token:string",
             "choices[].logprobs.content[].top_logprobs[].logprob:number"],
    "get_sequence_logprobs": ["choices[].prompt_logprobs:array", "choices[].prompt_logprobs[0]:null",
                              "choices[].prompt_logprobs[1]:object"],
    "reset_prefix_cache": ["success:bool"],
    "start_weight_update": [],
    "finish_weight_update": [],
}


def completion_choice(body, i):
    lp = body.get("logprobs")
    return {"index": i, "text": "ab", "finish_reason": "length", "prompt_token_ids": [1, 2], "token_ids": [3, 4],
            "prompt_logprobs": [None, {"2": {"logprob": -1.0, "rank": 1, "decoded_token": "token_id:2"}}]
            if body.get("prompt_logprobs") is not None else None,
            "logprobs": None if lp is None else {"text_offset": [0, 1], "tokens": ["token_id:3", "token_id:4"],
                                                 "token_logprobs": [-1.0, -2.0],
                                                 "top_logprobs": [{"token_id:3": -1.0}, {"token_id:4": -2.0}]}}


class Mock(BaseHTTPRequestHandler):
    call = "?"

    def log_message(self, *a):
        pass

    def answer(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def record(self, body):
        recorded.append({"call": Mock.call, "method": self.command, "path": self.path, "body": body,
                         "reads": READS[Mock.call]})

    def do_GET(self):
        self.record(None)
        path = self.path.split("?")[0]
        self.answer({"/v1/models": {"data": [{"id": "m"}]}, "/get_world_size": {"world_size": 1},
                     "/server_info": {"vllm_config": {"weight_transfer_config": None}}}.get(path, {}))

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        self.record(body)
        if self.path == "/v1/completions":
            prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            self.answer({"choices": [completion_choice(body, i) for i in range(len(prompts) * body.get("n", 1))]})
        elif self.path == "/v1/chat/completions":
            self.answer({"prompt_token_ids": [1, 2], "choices": [
                {"index": 0, "token_ids": [3], "logprobs": {"content": [
                    {"token": "token_id:3", "logprob": -1.0, "top_logprobs": [{"token": "token_id:3", "logprob": -1.0}]}]}}]})
        else:
            self.answer({"success": True})


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Mock)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    vc.is_vllm_available = lambda *a, **k: True  # vLLM is needed only for the NCCL weight sync
    Mock.call = "__init__"
    client = vc.VLLMClient(base_url=f"http://127.0.0.1:{server.server_port}")
    recorded[:] = [r for r in recorded if r["path"] != "/health"]  # __init__'s own check_server
    steps = [
        ("check_server", lambda: client.check_server()),
        ("get_server_info", lambda: client.get_server_info()),
        ("get_world_size", lambda: client.get_world_size()),
        ("generate", lambda: client.generate(["1+2=", "Hello"], n=2, max_tokens=5, logprobs=0)),
        ("generate", lambda: client.generate([[5, 6, 7]], max_tokens=4, logprobs=2, temperature=0.7, top_p=0.9,
                                             top_k=20, min_p=0.05, repetition_penalty=1.1,
                                             generation_kwargs={"seed": 3, "frequency_penalty": 0.5})),
        ("generate_no_logprobs", lambda: client.generate(["x"], max_tokens=2, logprobs=None)),
        ("chat", lambda: client.chat([[{"role": "user", "content": "hi"}]], max_tokens=4, logprobs=2,
                                     chat_template_kwargs={"enable_thinking": False})),
        ("get_sequence_logprobs", lambda: client.get_sequence_logprobs([[5, 6, 7, 8], [9, 10, 11]], [2, 1],
                                                                       top_logprobs=3)),
        ("reset_prefix_cache", lambda: client.reset_prefix_cache()),
        ("start_weight_update", lambda: client._start_weight_update()),
        ("finish_weight_update", lambda: client._finish_weight_update()),
    ]
    for name, fn in steps:
        Mock.call = name
        fn()
    server.shutdown()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"source": f"trl {trl.__version__} trl/generation/vllm_client.py, recorded by "
                             "tests/reference/capture_vllm_client.py", "requests": recorded}, f, indent=1)
        f.write("\n")
    print(f"{len(recorded)} requests -> {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
