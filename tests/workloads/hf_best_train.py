"""hf_best_plain.py with spotrun added as docs/integrations.md says (the test's job).

The callback, `resume_from_checkpoint(trainer)`, and a test gate: WORKLOAD_GATE_STEP=N makes
the evaluation after step N wait (up to a minute) until the interruption notice has arrived,
so a notice lands during evaluation; WORKLOAD_TRAIN_GATE_STEP=N does the same after training
step N (the notice then lands between steps). 'A:N' limits a gate to attempt A
(SPOTRUN_ATTEMPT). Without a gate it trains as the plain script does, bitwise.
"""
import hashlib
import json
import os
import time
from pathlib import Path

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments)

from spotrun.integrations.hf import SpotrunCallback, resume_from_checkpoint


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed, vocab):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, vocab, (n, 16), generator=g)

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
        self.spot.progress.step(state.global_step, force=True)
        Path(marker).write_text(str(state.global_step))
        deadline = time.monotonic() + 60
        while not self.spot.notice.pending and time.monotonic() < deadline:
            time.sleep(0.01)

    def _tail(self):
        # After the emergency save the job would go on until the reclaim; a gated one waits for
        # it, also when the notice came before the gate held it (the daemon's test interrupts
        # as soon as the gate's step is reported; under load the notice can overtake the hold).
        if (self.eval_gate or self.train_gate) and self.spot.emergency_steps:
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


def result(trainer):
    """What the test compares: the final weights' SHA256, the best checkpoint, the log."""
    h = hashlib.sha256()
    for k, v in sorted(trainer.model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    s = trainer.state
    return {"sha256": h.hexdigest(), "global_step": s.global_step, "best_metric": s.best_metric,
            "best_global_step": s.best_global_step,
            "best_model_checkpoint": s.best_model_checkpoint, "log_history": s.log_history}


torch.manual_seed(0)
torch.set_num_threads(1)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))
args = TrainingArguments(
    output_dir="out", max_steps=40, per_device_train_batch_size=4, gradient_accumulation_steps=2,
    per_device_eval_batch_size=8, eval_strategy="steps", eval_steps=10, save_strategy="steps",
    save_steps=10, save_total_limit=2, load_best_model_at_end=True,
    metric_for_best_model="eval_loss", logging_steps=5, learning_rate=3e-3,
    lr_scheduler_type="cosine", warmup_steps=4, report_to=[], use_cpu=True, seed=0, data_seed=0,
    dataloader_num_workers=0, disable_tqdm=True)
spot = SpotrunCallback()
trainer = Trainer(model=model, args=args, train_dataset=Tokens(128, 1, 16),
                  eval_dataset=Tokens(32, 2, 24), callbacks=[spot, Gate(spot)])
start = resume_from_checkpoint(trainer)
print(f"start {start or 'fresh'}", flush=True)
trainer.train(resume_from_checkpoint=start)
res = result(trainer)
trainer.save_model("outputs/final")   # the best model, for the job's outputs
Path("outputs/metrics.json").write_text(json.dumps({"step": res["global_step"],
                                                     "sha256": res["sha256"]}))
print("emergency", json.dumps(spot.emergency_steps), flush=True)
print("result " + json.dumps(res), flush=True)
