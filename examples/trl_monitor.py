"""The cancellation monitor in a plain TRL GRPO run.

    python examples/trl_monitor.py                      # tiny policy, 8 steps, CPU is enough
    python examples/trl_monitor.py --model Qwen/Qwen3-1.7B-Base --steps 200 --output-dir runs/qwen

Trains with TRL's own GRPOTrainer on the artifact's arithmetic problems and measures, after
every optimizer step, how that step moved the log-probabilities of its own mini-batch: the
shares of boosted / suppressed tokens in positive and negative rollouts (the paper's Fig. 1
measurement). The shares go to the trainer's logs (TensorBoard under train/cancellation/...
when tensorboard is installed) and to <output-dir>/cancellation.parquet (a directory of part
files; read it with pandas.read_parquet).
"""
import argparse
import importlib.util
from pathlib import Path

import pandas as pd
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from cancellation import engine, sources
from cancellation.engine.monitor import CancellationMonitor


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="data/policies/tiny-s", help="a causal LM (path or hub id)")
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps")
    ap.add_argument("--output-dir", default="runs/trl_monitor")
    ap.add_argument("--n-prompts", type=int, default=4, help="prompts per generation batch")
    ap.add_argument("--G", type=int, default=4, help="rollouts per prompt")
    ap.add_argument("--minibatches", type=int, default=2, help="optimizer steps per generation batch")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=3e-4)
    args = ap.parse_args()

    out = Path(args.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"   # TRL generates from left-padded prompts
    model = AutoModelForCausalLM.from_pretrained(args.model)

    # the artifact's problems and their verifier as a TRL dataset and reward function
    source = sources.ProblemSource(kinds=("add2", "sub2"))
    dataset = engine.problem_dataset(source, tokenizer, n=max(64, 2 * args.n_prompts * args.steps))
    reward = engine.reward_function(source)

    B = args.n_prompts * args.G
    config = GRPOConfig(
        output_dir=str(out), max_steps=args.steps, learning_rate=args.lr,
        num_generations=args.G, per_device_train_batch_size=B // args.minibatches,
        steps_per_generation=args.minibatches, max_completion_length=args.max_new_tokens,
        beta=0.0, logging_steps=1, save_strategy="no", use_cpu=not _cuda(),
        gradient_checkpointing=False,
        report_to=["tensorboard"] if importlib.util.find_spec("tensorboard") else "none",
    )
    monitor = CancellationMonitor(parquet=str(out / "cancellation.parquet"), flush_every=10)
    trainer = GRPOTrainer(model=model, args=config, processing_class=tokenizer, reward_funcs=[reward],
                          train_dataset=dataset, callbacks=[monitor])
    trainer.train()

    shares = pd.read_parquet(out / "cancellation.parquet")
    mean = shares[shares.conf_bin == "all"].groupby(["sign", "status"]).fraction.mean().unstack()
    print(f"{shares.step.nunique()} steps measured; mean shares of response tokens:\n{mean.round(3)}")


def _cuda():
    import torch
    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
