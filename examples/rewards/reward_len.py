"""TRL's quickstart reward function (docs: "GRPO Trainer", reward_len), as a TRL user writes it."""


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]
