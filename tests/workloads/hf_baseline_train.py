"""A transformers.Trainer script as its docs write it, plain or with spotrun added (test workload).

--mode plain: Trainer with `seed` and `data_seed`; --mode spotrun: the same plus
SpotrunCallback and resume_from_checkpoint(trainer), as docs/integrations.md says.
Writes the final state_dict to --out.
"""
import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["plain", "spotrun"], required=True)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--out", default="final.pt")
a = p.parse_args()


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        self.x = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


torch.set_num_threads(1)
set_seed(0)   # the model's initial weights
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))
args = TrainingArguments(output_dir="out", max_steps=a.steps, per_device_train_batch_size=8,
                         eval_strategy="steps", eval_steps=10, save_steps=10, seed=0, data_seed=1,
                         report_to=[], use_cpu=True, disable_tqdm=True)
callbacks, start = [], None
if a.mode == "spotrun":
    from spotrun.integrations.hf import SpotrunCallback, resume_from_checkpoint
    callbacks = [SpotrunCallback()]
trainer = Trainer(model=model, args=args, train_dataset=Tokens(128, 1),
                  eval_dataset=Tokens(32, 2), callbacks=callbacks)
if a.mode == "spotrun":
    start = resume_from_checkpoint(trainer)
print(f"start {start or 'fresh'}", flush=True)
trainer.train(resume_from_checkpoint=start)
torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.out)
print("done", flush=True)
