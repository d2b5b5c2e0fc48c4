"""Hugging Face `accelerate` no_trainer loop (run_clm_no_trainer), ported to spotrun.

The example's shape on a tiny GPT-2 built from `GPT2Config` (random init, nothing
downloaded) and a synthetic token set: `Accelerator(gradient_accumulation_steps=2)`,
`accelerator.prepare`, AdamW with weight decay groups, `get_scheduler("linear")`,
`with accelerator.accumulate(model)`, `completed_steps` counted on `sync_gradients`, an
evaluation of perplexity in `eval()` + `no_grad()` each epoch, the best model saved with
`save_pretrained`, a `log.jsonl` row per optimizer step. Written the way
docs/integrations.md ("Hugging Face accelerate (no_trainer loops)") tells a user: a
`Checkpointer` on the prepared model, optimizer and scheduler replaces
`accelerator.save_state` / `load_state`; the data position comes from the step counter,
as the example's own resume does (`train_dataloader.set_epoch(epoch)`, then
`accelerator.skip_first_batches`), over accelerate's seedable sampler and a loader with its
own generator. Sizes from `HF_*` variables.

    python tests/loops/hf_no_trainer.py
"""

from __future__ import annotations

import json
import math
import os

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, default_data_collator, get_scheduler

from digest import report
from points import point
from spotrun.jobfiles import persist
from spotrun.torch import Checkpointer

EPOCHS = int(os.environ.get("HF_EPOCHS", "2"))
N_TRAIN = int(os.environ.get("HF_TRAIN", "96"))
N_EVAL = int(os.environ.get("HF_EVAL", "64"))
BATCH, ACCUM, SEQ, VOCAB = 8, 2, 16, 64
SAVE_EVERY = int(os.environ.get("HF_SAVE_EVERY", "4"))


class Tokens(Dataset):
    """Fixed random token blocks, labels = inputs (the model shifts them)."""

    def __init__(self, n: int, seed: int) -> None:
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        point("data")
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main() -> None:
    """Train and evaluate each epoch; print the final state's digests."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    # The seedable sampler: each epoch's order from (seed, epoch), so a resumed epoch
    # draws the same order; accelerate's documented switch for reproducible sampling.
    accelerator = Accelerator(gradient_accumulation_steps=ACCUM, cpu=True,
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(42)
    job_dir = os.environ.get("SPOTRUN_JOB_DIR", ".")
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    # Its own generator: a new iterator (the resumed epoch's) draws nothing from torch's
    # global RNG, which the dropout masks after the resume come from.
    train_dataloader = DataLoader(Tokens(N_TRAIN, 1), shuffle=True, batch_size=BATCH,
                                  collate_fn=default_data_collator, generator=torch.Generator())
    eval_dataloader = DataLoader(Tokens(N_EVAL, 2), collate_fn=default_data_collator,
                                 batch_size=BATCH)
    no_decay = ["bias", "layer_norm.weight", "ln_"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=5e-3)
    steps_per_epoch = math.ceil(len(train_dataloader) / ACCUM)
    max_train_steps = EPOCHS * steps_per_epoch
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=2,
                                 num_training_steps=max_train_steps * accelerator.num_processes)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    persist("log.jsonl", "best")
    state = {"best_perplexity": None}
    ckpt = Checkpointer(model=model, optimizer=optimizer, scheduler=lr_scheduler, extras=state,
                        every_steps=SAVE_EVERY, total_steps=max_train_steps)
    completed_steps = ckpt.restore()
    print(f"resumed-at: {completed_steps}", flush=True)

    def evaluate(epoch: int) -> None:
        model.eval()
        losses = []
        for batch in eval_dataloader:
            point("validation", completed_steps)
            with torch.no_grad():
                outputs = model(**batch)
            losses.append(accelerator.gather_for_metrics(outputs.loss.repeat(BATCH)))
        model.train()
        perplexity = math.exp(torch.mean(torch.cat(losses)))
        with open(os.path.join(job_dir, "log.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": epoch, "step": completed_steps,
                                "perplexity": perplexity}) + "\n")
        if state["best_perplexity"] is None or perplexity < state["best_perplexity"]:
            state["best_perplexity"] = perplexity
            point("best", completed_steps)
            accelerator.unwrap_model(model).save_pretrained(os.path.join(job_dir, "best"),
                                                            safe_serialization=False)

    # The example's resume: the epoch and the batches to skip from the completed steps;
    # its evaluation belongs to the boundary before the next step (docs/checkpointing.md).
    starting_epoch = completed_steps // steps_per_epoch
    resume_step = (completed_steps % steps_per_epoch) * ACCUM
    if completed_steps > 0 and completed_steps % steps_per_epoch == 0:
        evaluate(starting_epoch - 1)
    for epoch in range(starting_epoch, EPOCHS):
        model.train()
        train_dataloader.set_epoch(epoch)   # the epoch's order, also when resumed into it
        if epoch == starting_epoch and resume_step:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
        else:
            active_dataloader = train_dataloader
        for batch in active_dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    point("train", completed_steps)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                point("log", completed_steps)
                with open(os.path.join(job_dir, "log.jsonl"), "a") as f:
                    f.write(json.dumps({"step": completed_steps, "loss": loss.item()}) + "\n")
                if ckpt.step(completed_steps):
                    point("save", completed_steps)
            if completed_steps >= max_train_steps:
                break
        evaluate(epoch)
    ckpt.finish(completed_steps)
    ckpt.close()
    report(model=accelerator.unwrap_model(model), optimizer=optimizer,
           scheduler=lr_scheduler.state_dict())


if __name__ == "__main__":
    main()
