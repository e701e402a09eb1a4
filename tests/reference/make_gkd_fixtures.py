"""GKD parity fixtures from TRL 1.16's own generalized_jsd_loss (run by hand, never in CI).

The student is the tiny Llama fixture model (tests/fixtures/models/llama: vocab 128, hidden 64, two
layers); the teacher a smaller random Llama of the same vocabulary (hidden 32, one layer), written
to tests/fixtures/gkd/teacher/. One padded batch of three prompt + completion sequences (labels
-100 on the prompt and the padding, as TRL's collator makes them) runs through both models; the
shifted logits go through trl.experimental.gkd.GKDTrainer.generalized_jsd_loss -- TRL's code --
for several beta / temperature pairs, once with reduction "batchmean" and once with
num_items_in_batch (what GKDTrainer.compute_loss passes under gradient accumulation), and through
the newer DistillationTrainer's chunked loss (trl/trainer/distillation_trainer.py
_chunked_divergence_loss: the final hidden states and both LM heads, temperature in the divergence).
Captured per case: the three losses, the per-token divergence (reduction "none" summed over the vocabulary), and for
two cases the gradient of every student parameter of the batchmean loss (torch autograd through
TRL's loss). Then one optimizer step's worth as the trainer runs it (trainer_*): the same sequences
as two micro-batches (sequences 0-1, then 2, each padded on its own) through
GKDTrainer.compute_loss -- TRL's code, with the HF Trainer's num_items_in_batch (the accumulated
batch's labels[..., 1:] != -100) -- for beta 0.5: each micro-batch's loss, and the gradients of
three student tensors (lm_head, embed_tokens, layer 0 q_proj) summed over both backwards.

In bf16 (--bf16: writes only gkd/jsd_bf16.bin and gkd/jsd05_t1_bf16.grads.safetensors): the student's
fp32 weights under torch.autocast(bfloat16) -- what TRL's bf16 = True runs -- and the teacher loaded
in bfloat16 (teacher_model_init_kwargs dtype = bfloat16, as a bf16 GKD run loads it), the same batch
through generalized_jsd_loss for beta 0.5 at temperature 1: the loss, the per-token divergence and
every student parameter's gradient, with the bf16 logits upcast to fp32 before the divergence (TRL's
run computes the divergence of bf16 logits in bf16, 8% below the fp32 divergence of the same logits
here: recorded as loss_bf16_divergence; ctrl computes every divergence in fp32).

    python tests/reference/make_gkd_fixtures.py          # writes tests/fixtures/gkd/
    python tests/reference/make_gkd_fixtures.py --bf16   # writes the two bf16 files only
"""
import os
import sys
import types

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from fixture_io import randomize_params, write_fixture  # noqa: E402

import trl  # noqa: E402
from trl.experimental.gkd import GKDTrainer  # noqa: E402
from trl.trainer.distillation_trainer import _chunked_divergence_loss  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures")
STUDENT = os.path.join(ROOT, "models", "llama")
OUT = os.path.join(ROOT, "gkd")
TEACHER = os.path.join(OUT, "teacher")
# (name, beta, temperature, with parameter gradients)
CASES = [
    ("fkl_t1", 0.0, 1.0, False),
    ("rkl_t1", 1.0, 1.0, True),
    ("jsd05_t1", 0.5, 1.0, True),
    ("jsd01_t2", 0.1, 2.0, False),
    ("jsd09_t05", 0.9, 0.5, False),
    ("rkl_t07", 1.0, 0.7, False),
]
NUM_ITEMS = 11.0  # as if the accumulated batch held more trained tokens than this micro-batch


def make_teacher():
    os.makedirs(TEACHER, exist_ok=True)
    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    m = LlamaForCausalLM(cfg)
    randomize_params(m, torch)
    m.save_pretrained(TEACHER, safe_serialization=True)


def make_batch():
    """Three sequences (prompt, completion) right-padded with 0; labels -100 on prompt and pad."""
    g = torch.Generator().manual_seed(3)
    lens = [(3, 5), (5, 2), (2, 6)]
    L = max(p + c for p, c in lens)
    ids, att, labels = [], [], []
    for p, c in lens:
        seq = torch.randint(3, 128, (p + c,), generator=g).tolist()
        pad = L - p - c
        ids.append(seq + [0] * pad)
        att.append([1] * (p + c) + [0] * pad)
        labels.append([-100] * p + seq[p:] + [-100] * pad)
    return torch.tensor(ids), torch.tensor(att), torch.tensor(labels)


def main_bf16():
    """generalized_jsd_loss under bf16: autocast student, bf16 teacher."""
    student = AutoModelForCausalLM.from_pretrained(STUDENT, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(TEACHER, dtype=torch.bfloat16)
    student.eval(), teacher.eval()
    ids, att, labels = make_batch()
    shifted = labels[:, 1:]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            t_logits = teacher(input_ids=ids, attention_mask=att).logits[:, :-1, :]
        s_logits = student(input_ids=ids, attention_mask=att).logits[:, :-1, :]
        with torch.no_grad():  # the divergence of the bf16 logits computed in bf16, as TRL's run does it
            native = GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=shifted, beta=0.5, temperature=1.0)
    # the same bf16 logits, the divergence in fp32 (as ctrl computes it: its precision is not the
    # projections'): this is what the C test compares with
    s_logits, t_logits = s_logits.float(), t_logits.float()
    loss = GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=shifted, beta=0.5, temperature=1.0)
    with torch.no_grad():
        terms = GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=shifted, beta=0.5, temperature=1.0,
                                                reduction="none")
    per_tok = torch.zeros(shifted.shape)
    per_tok[shifted != -100] = terms.float().sum(-1)
    loss.backward()
    grads = {n: p.grad.detach().float().contiguous() for n, p in student.named_parameters()}
    save_file(grads, os.path.join(OUT, "jsd05_t1_bf16.grads.safetensors"))
    arrays = [("shape", [float(ids.shape[0]), float(ids.shape[1])]), ("params", [0.5, 1.0]),
              ("loss", [loss.item()]), ("loss_bf16_divergence", [native.item()]),
              ("jsd", per_tok.flatten().tolist())]
    write_fixture(os.path.join(OUT, "jsd_bf16.bin"), arrays,
                  f"trl {trl.__version__} GKDTrainer.generalized_jsd_loss, autocast bf16 student, bf16 teacher")
    print("bf16 jsd05_t1 loss", loss.item(), "(divergence in bf16:", native.item(), ")")


def main():
    if "--bf16" in sys.argv:
        return main_bf16()
    print("trl", trl.__version__, "torch", torch.__version__)
    make_teacher()
    student = AutoModelForCausalLM.from_pretrained(STUDENT, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(TEACHER, dtype=torch.float32)
    student.eval(), teacher.eval()
    ids, att, labels = make_batch()
    arrays = [("shape", [float(ids.shape[0]), float(ids.shape[1])]), ("ids", ids.flatten().float().tolist()),
              ("attention_mask", att.flatten().float().tolist()), ("labels", labels.flatten().float().tolist()),
              ("num_items", [NUM_ITEMS])]
    with torch.no_grad():
        t_out = teacher(input_ids=ids, attention_mask=att, output_hidden_states=True)
        t_logits, t_hidden = t_out.logits[:, :-1, :], t_out.hidden_states[-1][:, :-1]
    shifted = labels[:, 1:]
    for name, beta, temp, with_grads in CASES:
        student.zero_grad()
        s_logits = student(input_ids=ids, attention_mask=att).logits[:, :-1, :]
        loss = GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=shifted, beta=beta, temperature=temp)
        with torch.no_grad():
            loss_items = GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=shifted, beta=beta,
                                                         temperature=temp, num_items_in_batch=NUM_ITEMS)
            # per token: reduction "none" gives the masked [n, V] terms in row-major order of the mask
            terms = GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=shifted, beta=beta,
                                                    temperature=temp, reduction="none")
            per_tok = torch.zeros(shifted.shape)
            per_tok[shifted != -100] = terms.sum(-1)
        loss.backward()
        with torch.no_grad():
            s_hidden = student(input_ids=ids, attention_mask=att, output_hidden_states=True).hidden_states[-1][:, :-1]
            distill, _, _ = _chunked_divergence_loss(s_hidden, t_hidden, student.lm_head.weight,
                                                     teacher.lm_head.weight, (shifted != -100).int(), beta,
                                                     temperature=temp)
        arrays += [(f"{name}_loss_distill", [distill.item()])]
        arrays += [(f"{name}_params", [beta, temp]), (f"{name}_loss", [loss.item()]),
                   (f"{name}_loss_items", [loss_items.item()]), (f"{name}_jsd", per_tok.flatten().tolist())]
        if with_grads:
            grads = {n: p.grad.detach().contiguous() for n, p in student.named_parameters()}
            save_file(grads, os.path.join(OUT, f"{name}.grads.safetensors"))
        print(name, "loss", loss.item(), "loss/num_items", loss_items.item())
    # the trainer's aggregation: GKDTrainer.compute_loss over two micro-batches, num_items_in_batch
    trainer = types.SimpleNamespace(teacher_model=teacher, beta=0.5,
                                    generalized_jsd_loss=GKDTrainer.generalized_jsd_loss)
    student.zero_grad()
    parts = [[0, 1], [2]]
    num_items = sum(int((labels[i, 1:] != -100).sum()) for i in range(ids.shape[0]))
    mb_loss = []
    for rows in parts:
        L = int(att[rows].sum(1).max())
        inputs = {"input_ids": ids[rows, :L], "attention_mask": att[rows, :L], "labels": labels[rows, :L]}
        loss = GKDTrainer.compute_loss(trainer, student, inputs, num_items_in_batch=num_items)
        loss.backward()
        mb_loss.append(loss.item())
    keep = ["lm_head.weight", "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
    save_file({n: p.grad.detach().contiguous() for n, p in student.named_parameters() if n in keep},
              os.path.join(OUT, "trainer.grads.safetensors"))
    arrays += [("trainer_num_items", [float(num_items)]), ("trainer_mb_loss", mb_loss)]
    print("trainer: num_items", num_items, "micro-batch losses", mb_loss)
    write_fixture(os.path.join(OUT, "jsd.bin"), arrays,
                  f"trl {trl.__version__} GKDTrainer.generalized_jsd_loss on models/llama vs gkd/teacher")


if __name__ == "__main__":
    main()
