"""A tiny GPT-2 trained with transformers.Trainer, plain or with spotrun added (test workload).

Everything is built here from a config and seeded random tokens: no download. --mode plain:
Trainer with `seed` and `data_seed`, seeded before the model is built (as the transformers
docs say, for the script itself to repeat); --mode spotrun: the same plus SpotrunCallback and
resume_from_checkpoint(trainer), as docs/integrations.md says. Evaluation every 10 steps, a
Trainer checkpoint every 25 (so a notice in the evaluation after step 10 saves a step Trainer
would not have). Writes the final state_dict to --out.
Spotrun mode: WORKLOAD_GATE_STEP=N makes the evaluation after step N wait (up to a minute)
until the interruption notice has arrived, so a notice lands during evaluation;
WORKLOAD_TRAIN_GATE_STEP=N does the same after training step N (the notice then lands between
steps). 'A:N' limits a gate to attempt A (SPOTRUN_ATTEMPT).
"""
import argparse
import json
import os
import time
from pathlib import Path

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["plain", "spotrun"], required=True)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--out", default="final.pt")
a = p.parse_args()


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 64, (n, 16), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Gate(TrainerCallback):
    """Holds the job at a chosen point until the notice has come (a slow evaluation or step)."""

    def __init__(self, spot):
        self.spot = spot
        self.eval_gate = self._gate("WORKLOAD_GATE_STEP")
        self.train_gate = self._gate("WORKLOAD_TRAIN_GATE_STEP")

    @staticmethod
    def _gate(name):
        """'N' (step N), or 'A:N' (step N in attempt A only)."""
        raw = os.environ.get(name) or "0"
        attempt, _, step = raw.rpartition(":")
        if attempt and attempt != os.environ.get("SPOTRUN_ATTEMPT"):
            return 0
        return int(step)

    def _hold(self, state, marker):
        if self.spot.emergency_steps:
            return
        self.held = True
        self.spot.progress.step(state.global_step, force=True)
        Path(marker).write_text(str(state.global_step))
        deadline = time.monotonic() + 60
        while not self.spot.notice.pending and time.monotonic() < deadline:
            time.sleep(0.01)

    def _tail(self):
        # After the emergency save the job would go on until the reclaim; here it waits for it.
        if getattr(self, "held", False) and self.spot.emergency_steps:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.05)

    def on_prediction_step(self, args, state, control, **kw):
        self._tail()
        if self.eval_gate and state.global_step == self.eval_gate:
            self._hold(state, "gate-eval")

    def on_step_end(self, args, state, control, **kw):
        self._tail()
        if self.train_gate and state.global_step == self.train_gate:
            self._hold(state, "gate-train")


torch.set_num_threads(1)
set_seed(0)   # the model's initial weights
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))
args = TrainingArguments(
    output_dir="out", max_steps=a.steps, per_device_train_batch_size=8,
    per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=10,
    save_strategy="steps", save_steps=25, save_total_limit=2, logging_steps=5,
    learning_rate=1e-3, report_to=[], use_cpu=True, seed=0, data_seed=1,
    dataloader_num_workers=0, disable_tqdm=True)
callbacks, start, spot = [], None, None
if a.mode == "spotrun":
    from spotrun.integrations.hf import SpotrunCallback, resume_from_checkpoint
    spot = SpotrunCallback()
    callbacks = [spot, Gate(spot)]
trainer = Trainer(model=model, args=args, train_dataset=Tokens(96, 1),
                  eval_dataset=Tokens(48, 2), callbacks=callbacks)
if spot is not None:
    start = resume_from_checkpoint(trainer)
print(f"start {start or 'fresh'}", flush=True)
trainer.train(resume_from_checkpoint=start)
torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.out)
if spot is not None:
    print("emergency", json.dumps(spot.emergency_steps), flush=True)
print("done", flush=True)
