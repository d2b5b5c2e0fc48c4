"""A Hugging Face `Trainer` script with spotrun added as docs/integrations.md says.

The docs' example grown into what Trainer users run: a tiny GPT-2 (random init, dropout
on), `dataloader_num_workers=2`, evaluation every few steps, `save_steps` with
`save_total_limit`, `load_best_model_at_end` on `eval_loss`, seeded (`seed`,
`data_seed`), `output_dir` inside the job directory. spotrun: `SpotrunCallback()` and
`resume_from_checkpoint(trainer)`. Prints the final weights, the best metric and step, the
best model's weights and `log_history` (less the `*_runtime` and `*_per_second` figures,
which the docs list as the last attempt's). Sizes from `HFT_*` variables.

    python tests/loops/hf_trainer.py
"""

from __future__ import annotations

import json
import os

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

from digest import report
from points import point
from spotrun.integrations.hf import SpotrunCallback, resume_from_checkpoint

MAX_STEPS = int(os.environ.get("HFT_STEPS", "24"))   # whole epochs: 96 items / batch 8
RUNTIME_KEYS = ("_runtime", "_per_second")   # wall-clock time: differs between any two runs


class Tokens(torch.utils.data.Dataset):
    """Fixed random token blocks, labels = inputs."""

    def __init__(self, n: int, seed: int) -> None:
        self.x = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        point("data", hold=False)
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Points(TrainerCallback):
    """Where the conformance cases may interrupt this run (tests/loops/points.py)."""

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        point("train", state.global_step)

    def on_prediction_step(self, args, state, control, **kwargs):
        point("validation", state.global_step, hold=False)

    def on_log(self, args, state, control, **kwargs):
        point("log", state.global_step, hold=False)

    def on_save(self, args, state, control, **kwargs):
        point("save", state.global_step, hold=False)


def main() -> None:
    """Train; print the digests of the final and the best state and of the log history."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    set_seed(0)
    job_dir = os.environ.get("SPOTRUN_JOB_DIR", ".")
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2,
                                       n_head=2))
    args = TrainingArguments(output_dir=os.path.join(job_dir, "out"), max_steps=MAX_STEPS,
                             per_device_train_batch_size=8, per_device_eval_batch_size=8,
                             eval_strategy="steps", eval_steps=6, save_steps=6,
                             save_total_limit=2, load_best_model_at_end=True,
                             metric_for_best_model="eval_loss", logging_steps=2,
                             dataloader_num_workers=2, seed=0, data_seed=0, report_to=[],
                             use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(96, 1),
                      eval_dataset=Tokens(48, 2), callbacks=[SpotrunCallback(), Points()])
    start = resume_from_checkpoint(trainer)
    print(f"resumed-at: {int(start.rsplit('-', 1)[1]) if start else 0}", flush=True)
    trainer.train(resume_from_checkpoint=start)
    state = trainer.state
    best = GPT2LMHeadModel.from_pretrained(state.best_model_checkpoint)
    history = [{k: v for k, v in row.items() if not any(r in k for r in RUNTIME_KEYS)}
               for row in state.log_history]
    with open(os.path.join(job_dir, "log_history.jsonl"), "w") as f:   # to read a difference
        f.write("".join(json.dumps(row, sort_keys=True) + "\n" for row in history))
    report(model=trainer.model, best_metric=state.best_metric,
           best_global_step=state.best_global_step, best_model=best,
           best_checkpoint=os.path.basename(state.best_model_checkpoint), log_history=history)


if __name__ == "__main__":
    main()
