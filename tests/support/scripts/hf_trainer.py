"""A plain Hugging Face ``Trainer`` script, no ddpfaults import: a tiny GPT-2 built from its config (dropout on),
synthetic token data, ``use_cpu=True`` on gloo, a checkpoint every step into ``--output`` and, when one is there,
the stock ``trainer.train(resume_from_checkpoint=True)``. accelerate prepares the DataLoader (its
``DataLoaderShard`` fetches one batch ahead) and wraps the model in DDP from torchrun's worker environment.

``--ignore-data-skip`` resumes with ``TrainingArguments(ignore_data_skip=True)``: the resumed epoch's data starts
over from its first batch (samples replayed). Code on the main process only, as users write it: ``--evaluate-on-main``
runs ``trainer.evaluate()`` after training under ``if trainer.is_world_process_zero():`` (its gather the other
ranks never make), ``--barrier-on-main-at N`` has a callback wait in ``dist.barrier()`` on the main process at
step ``N``.
"""

import argparse
import os

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

SAMPLES, LENGTH, VOCAB = 48, 8, 32


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=generator)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class BarrierOnMain(TrainerCallback):
    def __init__(self, at):
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and state.global_step == self.at:
            dist.barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", default="out")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--ignore-data-skip", action="store_true")
    parser.add_argument("--evaluate-on-main", action="store_true")
    parser.add_argument("--barrier-on-main-at", type=int, default=None)
    args = parser.parse_args()
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output,
        max_steps=args.steps,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=1,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        ignore_data_skip=args.ignore_data_skip,
        seed=0,
        disable_tqdm=True,
    )
    callbacks = [BarrierOnMain(args.barrier_on_main_at)] if args.barrier_on_main_at is not None else []
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(), eval_dataset=Tokens(), callbacks=callbacks)
    last = get_last_checkpoint(args.output) if os.path.isdir(args.output) else None
    trainer.train(resume_from_checkpoint=last)
    if args.evaluate_on_main and trainer.is_world_process_zero():
        trainer.evaluate()


if __name__ == "__main__":
    main()
