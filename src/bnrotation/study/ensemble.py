"""Several seeds of one row as one batched model: grouped layers, one member per group.

S models of one architecture (the seeds of a row, each with its own initial
weights) become one model whose every layer holds the S members side by side
along the channel dim: a convolution becomes a grouped convolution with S
times the groups, a BatchNorm over C channels one over S·C channels (so each
member keeps its own running statistics), a GroupNorm with G groups one with
S·G groups, and a linear layer a :class:`GroupedLinear`. The inputs are the
members' batches stacked along the channel dim, (N, S·C_in, ...); the output
is (N, S·K), member s in columns s·K to (s+1)·K. Element-wise layers (ReLU,
pooling, the residual addition, the global average) act on each channel
alone, so no member sees another's data, and the gradient of each member's
loss, summed over members, reaches only that member's weights: the batched
model trains each member as it would train alone, up to the order of
floating-point sums inside the grouped kernels. This is the runner's
``batch_seeds`` option (:func:`bnrotation.study.runner.run_seeds`), whose training
step is :class:`BatchedTrainer` (:class:`Trainer` for one seed alone). The
batch-norm patching utilities of ``torch.func`` drop the running statistics,
which the study is about, so they are not used.

Every tensor of the batched model (parameters, buffers, gradients, optimizer
state) holds member s in its dim-0 chunk s of S (:func:`member_slice`), except
the shared scalars (BatchNorm's ``num_batches_tracked``, an optimizer's step
count).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .config import OptimizerConfig, ScheduleConfig
from .optim import build_optimizer, build_schedule


class GroupedLinear(nn.Module):
    """S linear layers side by side: input (N, S·in) -> output (N, S·out), member s on its own slice.

    Attributes:
        weight: (S·out, in), member s in rows s·out to (s+1)·out (a ``nn.Linear`` weight per member).
        bias: (S·out,) or None.
    """

    def __init__(self, members: int, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.members, self.in_features, self.out_features = members, in_features, out_features
        self.weight = nn.Parameter(torch.empty(members * out_features, in_features))
        self.bias = nn.Parameter(torch.empty(members * out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        w = self.weight.view(self.members, self.out_features, self.in_features)  # (S, out, in)
        out = torch.einsum("nsi,soi->nso", x.reshape(n, self.members, self.in_features), w)  # (N, S, out)
        if self.bias is not None:
            out = out + self.bias.view(self.members, self.out_features)
        return out.reshape(n, self.members * self.out_features)


def _grouped(module: nn.Module, members: int) -> nn.Module | None:
    """The batched counterpart of one layer (parameters uninitialised), or None for a layer without state."""
    if isinstance(module, nn.Conv2d | nn.Conv1d | nn.Conv3d):
        if module.padding_mode != "zeros":
            raise ValueError(f"batched seeds: padding_mode {module.padding_mode!r} is not supported")
        return type(module)(members * module.in_channels, members * module.out_channels, module.kernel_size,
                            module.stride, module.padding, module.dilation, members * module.groups,
                            module.bias is not None)
    if isinstance(module, _BatchNorm):
        return type(module)(members * module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats)
    if isinstance(module, nn.GroupNorm):
        return nn.GroupNorm(members * module.num_groups, members * module.num_channels, module.eps, module.affine)
    if isinstance(module, nn.Linear):
        return GroupedLinear(members, module.in_features, module.out_features, module.bias is not None)
    if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
        raise ValueError(f"batched seeds: no batched form of {type(module).__name__}")
    return None


def stack_models(models: list[nn.Module]) -> nn.Module:
    """One batched model holding ``models`` (same architecture, any weights) as its members, in order.

    The members' parameters and buffers are copied in; the batched model lives on the first member's
    device and in its floating-point type and memory format.

    Raises:
        ValueError: for fewer than one model, models of different structure, or a layer without a batched
            form (:func:`_grouped`).
    """
    if not models:
        raise ValueError("stack_models: no models")
    names = [(n, type(m)) for n, m in models[0].named_modules()]
    if any([(n, type(m)) for n, m in other.named_modules()] != names for other in models[1:]):
        raise ValueError("stack_models: the models differ in structure")
    s = len(models)
    batched = copy.deepcopy(models[0])
    for name, module in list(batched.named_modules()):
        replacement = _grouped(module, s) if name else None
        if replacement is None:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = batched.get_submodule(parent_name) if parent_name else batched
        setattr(parent, attr, replacement)
    first = next(models[0].parameters())
    batched = batched.to(device=first.device, dtype=first.dtype)  # the grouped layers are built in float32
    if any(p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
           for p in models[0].parameters()):
        batched = batched.to(memory_format=torch.channels_last)
    load_members(batched, [m.state_dict() for m in models])
    return batched


def member_slice(tensor: torch.Tensor, member: int, members: int) -> torch.Tensor:
    """Member ``member``'s part of a batched tensor: its dim-0 chunk (a view); a scalar is shared."""
    if tensor.dim() == 0:
        return tensor
    return tensor.chunk(members, dim=0)[member]


@torch.no_grad()
def load_members(batched: nn.Module, states: list[dict[str, torch.Tensor]]) -> None:
    """Copy one state dict per member into the batched model (parameters and buffers; the shared
    ``num_batches_tracked`` from the first member)."""
    s = len(states)
    for name, tensor in batched.state_dict(keep_vars=True).items():
        for m, state in enumerate(states):
            member_slice(tensor.data if isinstance(tensor, nn.Parameter) else tensor, m, s).copy_(
                state[name].reshape(member_slice(tensor, m, s).shape))
            if tensor.dim() == 0:
                break


@torch.no_grad()
def copy_member(batched: nn.Module, member: int, members: int, into: nn.Module, grads: bool = False) -> None:
    """Copy member ``member``'s parameters and buffers (and gradients, with ``grads``) into the plain
    model ``into``, so that every measurement runs on a model of the suite's own kind."""
    mine = into.state_dict(keep_vars=True)
    for name, tensor in batched.state_dict(keep_vars=True).items():
        mine[name].data.copy_(member_slice(tensor.data, member, members).reshape(mine[name].shape))
    if grads:
        params = dict(into.named_parameters())
        for name, p in batched.named_parameters():
            if p.grad is None:
                params[name].grad = None
                continue
            g = member_slice(p.grad, member, members).reshape(params[name].shape)
            if params[name].grad is None:
                params[name].grad = g.clone()
            else:
                params[name].grad.copy_(g)


def member_optimizer_state(batched_opt: torch.optim.Optimizer, batched: nn.Module, member: int, members: int,
                           into_opt: torch.optim.Optimizer, into: nn.Module) -> None:
    """Fill the plain optimizer ``into_opt`` (built for ``into``, the member's own model) with member
    ``member``'s part of the batched optimizer's state, so that its ``state_dict()`` is what a run of that
    seed alone would have saved; the learning rates follow the batched optimizer's param groups."""
    params = dict(into.named_parameters())
    for name, p in batched.named_parameters():
        state = batched_opt.state.get(p)
        if not state:
            continue
        target = params[name]
        into_opt.state[target] = {k: (member_slice(v, member, members).reshape(target.shape).clone()
                                      if torch.is_tensor(v) and v.dim() > 0 else copy.deepcopy(v))
                                  for k, v in state.items()}
    for g_into, g in zip(into_opt.param_groups, batched_opt.param_groups, strict=True):
        g_into["lr"] = g["lr"]
        if "initial_lr" in g:
            g_into["initial_lr"] = g["initial_lr"]


def load_optimizer_members(batched_opt: torch.optim.Optimizer, batched: nn.Module,
                           opts: list[torch.optim.Optimizer], models: list[nn.Module]) -> None:
    """The reverse of :func:`member_optimizer_state`: the batched optimizer's state from each member's plain
    optimizer (all members at the same step).

    Raises:
        ValueError: when the members' optimizers are at different steps.
    """
    s = len(models)
    named = [dict(m.named_parameters()) for m in models]
    for name, p in batched.named_parameters():
        states = [o.state.get(n[name]) for o, n in zip(opts, named)]
        if not any(states):
            continue
        if not all(states):
            raise ValueError(f"batched seeds: {name} has optimizer state in some members only")
        merged = {}
        for key, value in states[0].items():
            if torch.is_tensor(value) and value.dim() > 0:
                merged[key] = torch.cat([st[key].reshape(member_slice(p, 0, s).shape) for st in states])
                merged[key] = merged[key].reshape(p.shape).contiguous(
                    memory_format=torch.channels_last if p.dim() == 4 and not p.is_contiguous() else
                    torch.contiguous_format)
            else:
                if any((st[key] != value) if not torch.is_tensor(value) else not torch.equal(st[key], value)
                       for st in states[1:]):
                    raise ValueError(f"batched seeds: the members' optimizers differ in {key!r} of {name}")
                merged[key] = copy.deepcopy(value)
        batched_opt.state[p] = merged
    for g, g_member in zip(batched_opt.param_groups, opts[0].param_groups, strict=True):
        g["lr"] = g_member["lr"]


def stacked_inputs(batches: list[torch.Tensor]) -> torch.Tensor:
    """The members' batches (N, C, ...) each, as one (N, S·C, ...) input, member s in channels s·C..(s+1)·C."""
    return torch.cat(batches, dim=1)


def member_losses(logits: torch.Tensor, targets: list[torch.Tensor]) -> torch.Tensor:
    """Each member's mean cross-entropy, (S,), from the batched logits (N, S·K) and one (N,) target per member.

    Their sum is the batched model's loss: its gradient with respect to member s's weights is that of
    member s's own loss, as in a run of that seed alone.
    """
    s = len(targets)
    n = logits.shape[0]
    per = logits.reshape(n, s, -1)  # (N, S, K)
    return torch.stack([F.cross_entropy(per[:, m], y) for m, y in enumerate(targets)])


# ----------------------------------------------------------------------------- the training step
class Trainer:
    """The training step of one seed alone: the seed's own model, optimizer and schedule.

    Args:
        model, optimizer: the seed's own; ``schedule``: its learning-rate schedule, or None.
        memory_format: the inputs' (``torch.channels_last`` or ``torch.contiguous_format``).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 schedule: torch.optim.lr_scheduler.LRScheduler | None, memory_format: torch.memory_format):
        self.model, self.optimizer, self.schedule, self.fmt = model, optimizer, schedule, memory_format

    def losses(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """The mean cross-entropy of the one batch ``[(x (N, ...), y (N,))]``, as ``[() tensor]``, with the
        gradients of the model set from it (no host synchronisation)."""
        (x, y), = batches
        loss = F.cross_entropy(self.model(x.contiguous(memory_format=self.fmt)), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return [loss]

    def step(self) -> None:
        """One optimizer step, then one schedule step."""
        self.optimizer.step()
        if self.schedule is not None:
            self.schedule.step()

    def sync(self, grads: bool = False) -> None:
        """Nothing to do: the seed's model is the one that trains."""

    def sync_optimizer(self) -> None:
        """Nothing to do: the seed's optimizer is the one that steps."""


class BatchedTrainer(Trainer):
    """The training step of several seeds as one batched model (:func:`stack_models`), with one batched
    optimizer and schedule built from the same config as each seed's own; :meth:`sync` copies each seed's
    part back into its own plain model, where everything is measured.

    Args:
        models, optimizers, schedules: each seed's own, in member order (the schedules all None or none).
        optimizer_cfg, schedule_cfg, steps: what the seeds' own optimizers and schedules were built from.
        memory_format: the inputs'.
        resumed: the seeds' optimizers and schedules hold a resumed state (all at the same step), which the
            batched ones take.
    """

    def __init__(self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer],
                 schedules: list[torch.optim.lr_scheduler.LRScheduler | None], optimizer_cfg: OptimizerConfig,
                 schedule_cfg: ScheduleConfig, steps: int, memory_format: torch.memory_format, resumed: bool):
        self.models, self.optimizers, self.schedules = models, optimizers, schedules
        self.n = len(models)
        batched = stack_models(models)
        optimizer = build_optimizer(optimizer_cfg, batched, members=self.n)
        super().__init__(batched, optimizer, build_schedule(schedule_cfg, optimizer, steps), memory_format)
        if resumed:
            load_optimizer_members(self.optimizer, self.model, optimizers, models)
            if self.schedule is not None:
                self.schedule.load_state_dict(schedules[0].state_dict())

    def losses(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Each seed's mean cross-entropy on its own batch, ``[() tensor]`` in member order; the gradients of
        the batched model are those of their sum (:func:`member_losses`)."""
        x = stacked_inputs([xb for xb, _ in batches]).contiguous(memory_format=self.fmt)
        losses = member_losses(self.model(x), [yb for _, yb in batches])
        self.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        return list(losses.detach())

    def sync(self, grads: bool = False) -> None:
        """Each seed's plain model takes its part of the batched one (its gradients too, with ``grads``), and
        each seed's optimizer the learning rates the batched schedule set (the checks log them)."""
        for i, (model, optimizer) in enumerate(zip(self.models, self.optimizers, strict=True)):
            copy_member(self.model, i, self.n, model, grads=grads)
            for g_member, g in zip(optimizer.param_groups, self.optimizer.param_groups, strict=True):
                g_member["lr"] = g["lr"]

    def sync_optimizer(self) -> None:
        """Each seed's own optimizer and schedule take its part of the batched state (to save it)."""
        for i, (model, optimizer, schedule) in enumerate(zip(self.models, self.optimizers, self.schedules,
                                                             strict=True)):
            member_optimizer_state(self.optimizer, self.model, i, self.n, optimizer, model)
            if self.schedule is not None:
                schedule.load_state_dict(self.schedule.state_dict())
