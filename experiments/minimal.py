"""The article's experiment in one file of plain PyTorch: Adam at lr 3e-3 behind BatchNorm.

    make minimal                                  # = .venv/bin/python experiments/minimal.py, the defaults below
    python experiments/minimal.py --size 32 --steps 6000 --check-start 2000 --heldout 4000   # the article's protocol

Reproduces the headline of Pradeep (2026), *Batch norm's running statistics describe a network that has
already moved*: on the noisy-template task (ten classes, a sample is 0.6 * its class's N(0, 1) template plus
N(0, 1) noise) a three-block ConvNet trained with Adam at lr 3e-3 stays at or near 100% accuracy in training mode
(BatchNorm normalising with the batch's own statistics), while in evaluation mode (the running statistics)
accuracy on the same held-out images falls at some checks: the weights keep rotating and the running averages
trail them. Each check prints both accuracies, and the last line the lowest.

The setting (``--help`` prints the defaults): the article's network, optimizer, batch size and BatchNorm momentum,
on 16x16 images instead of its 32x32, for 2,500 steps, seed 0, one thread. A step on a quarter of the pixels costs
about a quarter, so the run takes minutes on one core; and at this size the dips come early: at seed 0 the lowest
check, at step 2,400, is below 70% in evaluation mode while training mode stays at 99.9% or above, on each CPU
kernel path CI covers (the AVX-512 kernels of its machine, and AVX2 and no vector kernels as `make test-kernels`
sets them: `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 make minimal`). How far below depends on the path:
each orders the arithmetic differently, and the trajectories part (the printed checks show it).
At 32x32 this loop's first 3,000 steps showed dips only (seed 0: not below 80%); the collapse there comes later,
between steps 2,000 and 3,600 in every reference run of the suite's `adam` row (`make row ROW=adam`), which
measures the same with its probes (this file has none of them). Same data and network as the suite, not the
same random draws: its numbers are not the reference runs'.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CLASSES, SIZE, TEMPLATE_SCALE, BATCH = 10, 32, 0.6, 128  # the article's; SIZE: train()'s (the bench's) default


def block(c_in: int, c_out: int) -> nn.Sequential:
    """Conv2d(3x3, no bias) -> BatchNorm2d (momentum 0.03: a running average over ~33 steps) -> ReLU."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out, momentum=0.03),
                         nn.ReLU())


def train(steps: int, checks: set[int], heldout: int, device: torch.device, seed: int = 0,
          on_check=None, lr: float = 3e-3, batch_size: int = BATCH, size: int = SIZE) -> dict:
    """Train the study's ConvNet with Adam for ``steps`` steps of ``batch_size`` samples (the article's 128) of
    ``size`` x ``size`` images (the article's 32); at
    each step in ``checks``, measure training- and evaluation-mode accuracy on ``heldout`` fixed held-out samples
    and call ``on_check(step, acc_train_mode, acc_eval_mode)`` (accuracies in [0, 1]).

    The training-mode pass runs on a copy of the network, so no running statistic moves at a check.

    Returns:
        ``{"seconds": {"setup", "train", "checks"}, "checks": number run, "accuracies": [(step, train, eval)],
        "model": the trained network}``.
    """
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(seed)
    torch.manual_seed(seed)  # the initial weights
    templates = torch.randn(CLASSES, 3, size, size, device=device, generator=gen)  # (K, 3, S, S)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, CLASSES, (n,), device=device, generator=gen)  # (n,)
        noise = torch.randn(n, 3, size, size, device=device, generator=gen)
        return TEMPLATE_SCALE * templates[y] + noise, y  # (n, 3, S, S), (n,)

    net = nn.Sequential(block(3, 32), nn.MaxPool2d(2), block(32, 64), nn.MaxPool2d(2), block(64, 64),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES)).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    x_val, y_val = batch(heldout)

    @torch.no_grad()
    def accuracy(model: nn.Module, train_mode: bool) -> float:
        model.train(train_mode)
        return (model(x_val).argmax(1) == y_val).float().mean().item()

    sync()
    seconds, accuracies = {"setup": time.perf_counter() - t0, "train": 0.0, "checks": 0.0}, []
    mark = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = batch(batch_size)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in checks:
            sync()
            t1 = time.perf_counter()
            seconds["train"] += t1 - mark
            result = (step, accuracy(copy.deepcopy(net), True), accuracy(net, False))
            net.train()
            accuracies.append(result)
            if on_check is not None:
                on_check(*result)
            mark = time.perf_counter()
            seconds["checks"] += mark - t1
    sync()
    seconds["train"] += time.perf_counter() - mark
    return {"seconds": seconds, "checks": len(accuracies), "accuracies": accuracies, "model": net}


def parser() -> argparse.ArgumentParser:
    """The command's arguments; its defaults are the setting the module's docstring describes."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=16, help="image side in pixels (the article's: 32) [%(default)s]")
    p.add_argument("--steps", type=int, default=2500, help="training steps [%(default)s]")
    p.add_argument("--check-start", type=int, default=500,
                   help="first check step (then every --check-every) [%(default)s]")
    p.add_argument("--check-every", type=int, default=100, help="[%(default)s]")
    p.add_argument("--heldout", type=int, default=1000, help="held-out samples per check [%(default)s]")
    p.add_argument("--seed", type=int, default=0, help="[%(default)s]")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; at 1 the same numbers on every machine with the same CPU kernel path "
                        "(AVX-512, AVX2 and no vector kernels each give their own) [%(default)s]")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if min(args.steps, args.check_every, args.heldout, args.threads) < 1 or args.check_start < 1:
        p.error("--steps, --check-start, --check-every, --heldout and --threads must be at least 1")
    if args.size < 4:  # two 2x2 poolings need a 4x4 image at least
        p.error(f"--size {args.size}: expected at least 4 (pixels; the network pools twice)")
    checks = set(range(args.check_start, args.steps + 1, args.check_every))
    if not checks:
        print(f"error: --check-start {args.check_start} is after --steps {args.steps}: no check would run",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    print(f"{args.size}x{args.size} images, {args.steps:,} steps, seed {args.seed}")
    print("step  training mode  evaluation mode")
    result = train(args.steps, checks, args.heldout, torch.device("cpu"), args.seed, size=args.size,
                   on_check=lambda step, tr, ev: print(f"{step:5d}  {tr:12.1%}  {ev:14.1%}", flush=True))
    step, _, lowest = min(result["accuracies"], key=lambda r: r[2])
    print(f"lowest evaluation-mode accuracy {lowest:.1%} at step {step}; training mode never below "
          f"{min(r[1] for r in result['accuracies']):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
