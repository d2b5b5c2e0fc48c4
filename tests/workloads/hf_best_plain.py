"""A Hugging Face Trainer script as the transformers docs write it, without spotrun (the baseline).

GPT-2 from a config, seeded random tokens (no download), evaluation and a checkpoint every 10
steps, `load_best_model_at_end` on `eval_loss`, `save_total_limit=2`, cosine schedule with
warm-up, gradient accumulation 2. The evaluation set is a wider vocabulary than the training
set, so the evaluation loss falls, then rises as the model narrows to the training tokens: the
best checkpoint is step 20 of 40, not the last. hf_best_train.py is this script with spotrun
added; both print what the test compares as `result {json}` and save the best model and
its hash in `outputs/` (the job's outputs, as docs/integrations.md's example does).
"""
import hashlib
import json
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed, vocab):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, vocab, (n, 16), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


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
trainer = Trainer(model=model, args=args, train_dataset=Tokens(128, 1, 16),
                  eval_dataset=Tokens(32, 2, 24))
trainer.train()
res = result(trainer)
trainer.save_model("outputs/final")   # the best model, for the job's outputs
Path("outputs/metrics.json").write_text(json.dumps({"step": res["global_step"],
                                                     "sha256": res["sha256"]}))
print("result " + json.dumps(res), flush=True)
