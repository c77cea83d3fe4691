"""A staleness monitor for any ``nn.Module``: the rotation study's three early-warning measurements.

The study (Pradeep 2026, "Batch norm's running statistics describe a network
that has already moved") ends with what would have caught its failure early:

1. accuracy on one fixed batch in training mode and in evaluation mode, side by side;
2. the angle each output channel of each convolution turns per 100 steps;
3. how far each normalisation layer's stored running mean sits from the mean
   the current weights produce, in that channel's standard deviations.

:class:`StalenessMonitor` measures all three on any model, at any step, from a
fixed probe batch. It finds each normalisation layer and the weight whose
output it normalises (:func:`find_pairs`: ``torch.fx`` where the model traces,
the order of execution on two probe samples for every layer fx cannot place;
``docs/pairing.md``) and returns tidy
records with the column names of the suite's ``checks``, ``layers`` and
``channels`` tables (:mod:`bnrotation.records`). A call leaves every buffer,
parameter, gradient, optimizer state, random stream and module training flag
as it found them. The suite's runner measures through it; so can a plain
PyTorch training loop::

    monitor = StalenessMonitor(model, (x_probe, y_probe))
    ...
    if step % 100 == 0:
        record = monitor(step)
        progress.set_postfix_str(record.summary)

Nothing here imports the suite's task or network.
"""

from __future__ import annotations

import io
import math
import numbers
import sys
import warnings
from collections.abc import Mapping
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.overrides import TorchFunctionMode

from .batches import sample_count, split_batch
from .bnstats import (NORM_LAYER_KINDS, NonFinite, batch_statistics, nonfinite_state, norm_layers,
                      running_stat_layers)
from .evaluation import evaluation_forward, evaluation_mode
from .probes import (batch_statistics_pass, channel_cosines, channel_norms, cosine, drift_sigma_per_step, lag_sigma,
                     predicted_lag_sigma, rotation_deg)

__all__ = ["StalenessMonitor", "MonitorRecord", "Thresholds", "StaleStatisticsWarning", "MonitorSetupWarning",
           "find_pairs", "Pairing", "NormPair", "NormLeafTracer", "channel_axis_after", "split_probe", "mode_check",
           "uncompiled", "default_warmup_steps", "smallest_probe", "WEIGHT_LAYERS"]

# Layers whose weight rows are output channels: what a normalisation layer directly downstream normalises.
WEIGHT_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


class StaleStatisticsWarning(UserWarning):
    """The running statistics describe other weights: the mode gap and the lag crossed the monitor's thresholds."""


class MonitorSetupWarning(UserWarning):
    """At construction: what the monitor cannot measure as asked (layers left unpaired, a probe too small for the
    mode-gap threshold)."""


@contextmanager
def _buffers_kept(model: nn.Module):
    """Every buffer of ``model`` (running statistics, ``num_batches_tracked``, any other) is put back as it was
    on exit, whatever ran inside: a trace or a pass through third-party layers that write their buffers."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)


def _probe_head(x, n: int):
    """The first ``n`` samples of probe inputs: of a tensor, or of every tensor of a mapping that has one
    value per sample (other values as they are)."""
    if isinstance(x, torch.Tensor):
        return x[:n]
    total = sample_count(x)
    return {k: v[:n] if isinstance(v, torch.Tensor) and v.dim() > 0 and len(v) == total else v
            for k, v in x.items()}


def _call(model: nn.Module, x):
    """The model on probe inputs: ``model(x)``, a mapping passed whole as the one argument."""
    return model(x)


# ----------------------------------------------------------------------------- pairing
@dataclass(frozen=True)
class Segment:
    """Channels ``[start, stop)`` of a normalisation layer are output channels ``[offset, offset + stop - start)``
    of the weight layer ``weight``, in order.

    Attributes:
        start, stop: the norm layer's channels (``stop`` excluded).
        weight: the convolution or linear layer's name.
        offset: the first of its output channels.
    """

    start: int
    stop: int
    weight: str
    offset: int = 0


@dataclass(frozen=True)
class NormPair:
    """A normalisation layer and the layer, or the layers, whose output channels it normalises.

    A layer fed by one weight layer has ``weight`` its name and one segment (or, paired without shapes, none:
    :meth:`spans` fills it in). A layer fed by a concatenation of several weight layers' outputs along its
    channel dim has one :class:`Segment` per concatenated piece, and ``weight`` is ``"cat(a, b, ...)"``, the
    segments' weight layers in channel order: each channel still has exactly one weight layer, so its rotation
    is that layer's output channel's.

    Attributes:
        norm: the normalisation layer's name (``model.named_modules()``).
        weight: the upstream convolution or linear layer's name, ``cat(...)`` of several; ``None`` when unpaired.
        reason: why it is unpaired ("" when paired).
        segments: which weight layer's output channels each range of the norm layer's channels holds, in
            channel order (empty when unpaired).
    """

    norm: str
    weight: str | None
    reason: str = ""
    segments: tuple[Segment, ...] = ()

    @property
    def weights(self) -> tuple[str, ...]:
        """The weight layers of the segments, each once, in channel order (``(weight,)`` for one)."""
        if not self.segments:
            return (self.weight,) if self.weight else ()
        return tuple(dict.fromkeys(s.weight for s in self.segments))

    def spans(self, channels: int) -> tuple[Segment, ...]:
        """:attr:`segments`, or for a pair without them, one segment of all ``channels`` channels.

        Raises:
            ValueError: when the segments do not cover ``channels`` channels, in order.
        """
        if self.weight is None:
            return ()
        segments = self.segments or (Segment(0, channels, self.weight),)
        if segments[0].start != 0 or segments[-1].stop != channels or any(
                a.stop != b.start for a, b in zip(segments, segments[1:])):
            raise ValueError(f"{self.weight} -> {self.norm}: the segments cover "
                             f"{', '.join(f'[{s.start}, {s.stop})' for s in segments)}, not the {channels} "
                             "channels normalised")
        return segments


@dataclass
class Pairing:
    """What :func:`find_pairs` found.

    Attributes:
        pairs: the paired layers, in forward order.
        unpaired: the layers left unpaired, each with the reason.
        method: ``fx``, ``execution order``, or ``fx and execution order`` when some layers were placed by each.
        methods: ``{norm layer: "fx" or "execution order"}``, how each layer was placed.
        via: ``{norm layer: (operation, ...)}``, the see-through operations between a paired weight layer
            and its norm layer, in forward order (absent for a direct pair).
    """

    pairs: list[NormPair]
    unpaired: list[NormPair]
    method: str
    methods: dict[str, str] = field(default_factory=dict)
    via: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def describe(self) -> str:
        """One line per layer: ``weight -> norm`` (with ``via`` operations and a placement other than
        :attr:`method`'s where they apply), then ``unpaired: norm (reason)``."""
        def placed(norm: str) -> str:
            how = self.methods.get(norm, self.method)
            return f" [{how}]" if " and " in self.method else ""

        def through(norm: str) -> str:
            return f" (via {', '.join(self.via[norm])})" if self.via.get(norm) else ""

        lines = [f"{len(self.pairs)} normalisation layer(s) paired by {self.method}:"]
        lines += [f"  {p.weight} -> {p.norm}{through(p.norm)}{placed(p.norm)}" for p in self.pairs]
        lines += [f"  unpaired: {p.norm} ({p.reason}){placed(p.norm)}" for p in self.unpaired]
        return "\n".join(lines)


# The see-through rule. Between a weight layer and a norm layer, an operation is seen through when it keeps each
# output channel apart (channel c of its output is a function of channel c of its input alone) and is positively
# homogeneous in it (scaling channel c by a > 0 scales the result's channel c by a): then the norm layer stays
# invariant to the scale of that weight's output channel, which is what makes the weight scale-invariant.
ELEMENTWISE_OPS = frozenset({"relu", "relu_", "leaky_relu", "leaky_relu_", "identity", "dropout", "dropout_",
                             "dropout1d", "dropout2d", "dropout3d", "contiguous", "clone"})
POOLING_OPS = frozenset({f"{kind}_pool{d}d" for kind in ("max", "avg", "adaptive_max", "adaptive_avg")
                         for d in (1, 2, 3)})
RESHAPE_OPS = frozenset({"flatten", "unflatten", "reshape", "view", "reshape_as", "view_as", "squeeze", "unsqueeze"})
PERMUTE_OPS = frozenset({"permute", "transpose", "swapaxes", "swapdims", "t"})
SEE_THROUGH_OPS = ELEMENTWISE_OPS | POOLING_OPS | RESHAPE_OPS | PERMUTE_OPS
# Modules that are one see-through operation (fx keeps torch.nn modules as leaves).
_SEE_THROUGH_MODULES = ((nn.ReLU, "relu"), (nn.LeakyReLU, "leaky_relu"), (nn.Identity, "identity"),
                        (nn.Dropout, "dropout"), (nn.Dropout1d, "dropout1d"), (nn.Dropout2d, "dropout2d"),
                        (nn.Dropout3d, "dropout3d"), (nn.Flatten, "flatten"), (nn.Unflatten, "unflatten"),
                        *((getattr(nn, f"{k}Pool{d}d"), f"{s}_pool{d}d") for d in (1, 2, 3)
                          for k, s in (("Max", "max"), ("Avg", "avg"), ("AdaptiveMax", "adaptive_max"),
                                       ("AdaptiveAvg", "adaptive_avg"))))


def _op_name(target) -> str:
    """The see-through rule's name of an operation: a function or method (``F.relu``, ``Tensor.view``), a method
    name (fx ``call_method``) or a module (fx ``call_module``)."""
    if isinstance(target, str):
        name = target
    elif isinstance(target, nn.Module):
        return next((op for kind, op in _SEE_THROUGH_MODULES if isinstance(target, kind)), type(target).__name__)
    else:
        name = getattr(target, "__name__", type(target).__name__)
    if name.startswith("__") and name.endswith("__"):  # Tensor.__add__, __iadd__, __radd__: add, add_, add
        core = name[2:-2]
        if core in _ARITHMETIC:
            return core
        if core[:1] in ("i", "r") and core[1:] in _ARITHMETIC:
            return core[1:] + ("_" if core[0] == "i" else "")
        return name
    return name.lstrip("_")


_ARITHMETIC = frozenset({"add", "sub", "mul", "truediv", "floordiv", "matmul", "pow", "mod", "and", "or", "xor"})


def _prod(dims) -> int:
    return math.prod(int(d) for d in dims)


def _permutation(op: str, args, ndim: int) -> list[int] | None:
    """``p`` with output dim k = input dim ``p[k]``, for a permute or transpose called with ``args`` (the tensor
    first); None when the arguments cannot be read."""
    rest = [a for a in args[1:]]
    try:
        if op == "permute":
            dims = list(rest[0]) if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else list(rest)
            p = [int(d) % ndim for d in dims]
            return p if sorted(p) == list(range(ndim)) else None
        d0, d1 = (0, 1) if op == "t" else (int(rest[0]) % ndim, int(rest[1]) % ndim)
    except (IndexError, TypeError, ValueError):
        return None
    p = list(range(ndim))
    p[d0], p[d1] = p[d1], p[d0]
    return p


def channel_axis_after(op: str, args, in_shape, out_shape, axis: int) -> int | None:
    """Where the channel dim ``axis`` of an operation's input lies in its output, or None when the operation is
    not seen through (the see-through rule, stated in ``docs/pairing.md``).

    Seen through: the elementwise :data:`ELEMENTWISE_OPS` (ReLU, LeakyReLU, identity, dropout) on an unchanged
    shape; max, average and adaptive pooling (:data:`POOLING_OPS`) over the dims after a channel dim 1;
    reshapes (flatten, view, squeeze, ...) that keep the channel dim whole: a dim of the same size whose
    preceding dims hold as many elements as before (row-major order then keeps every channel's values
    together); permutes and transposes, which move it (a concatenation is followed piece by piece by
    :func:`find_pairs` itself). Anything else, an addition, a concatenation, a product
    with another tensor, SiLU, GELU or a sigmoid, is not seen through.

    Args:
        op: :func:`_op_name` of the operation.
        args: its positional arguments, the input tensor first (for permute and transpose).
        in_shape, out_shape: the input's and the output's shapes.
        axis: the channel dim of the input.
    """
    if op not in SEE_THROUGH_OPS or in_shape is None or out_shape is None:
        return None
    in_shape, out_shape = tuple(in_shape), tuple(out_shape)
    if not 0 <= axis < len(in_shape):
        return None
    if op in ELEMENTWISE_OPS:
        return axis if in_shape == out_shape else None
    if op in POOLING_OPS:
        keeps = axis == 1 and len(in_shape) >= 3 and len(out_shape) == len(in_shape) and out_shape[:2] == in_shape[:2]
        return axis if keeps else None
    if op in PERMUTE_OPS:
        p = _permutation(op, args, len(in_shape))
        return p.index(axis) if p is not None and len(out_shape) == len(in_shape) else None
    c, before, after = in_shape[axis], _prod(in_shape[:axis]), _prod(in_shape[axis + 1:])
    return next((k for k, size in enumerate(out_shape)
                 if size == c and _prod(out_shape[:k]) == before and _prod(out_shape[k + 1:]) == after), None)


def _output_channel_axis(weight: nn.Module, ndim: int) -> int:
    """The dim of a weight layer's output that holds its output channels: 1 for a convolution, the last for a
    linear layer."""
    return ndim - 1 if isinstance(weight, nn.Linear) else 1


# Concatenations: the channels of the result are the pieces' channels, one input after the other.
CAT_OPS = frozenset({"cat", "concat", "concatenate"})


class _Piece:
    """``size`` consecutive channels of one origin: the weight layer ``weight``'s output channels from ``offset``
    on, seen through ``via``; or (``weight`` None) channels of what ``source`` names. ``size`` is None only for a
    weight layer's whole output placed without shapes."""

    __slots__ = ("size", "weight", "offset", "via", "source")

    def __init__(self, size: int | None, weight: str | None, offset: int, via: tuple[str, ...], source: str):
        self.size, self.weight, self.offset, self.via, self.source = size, weight, offset, via, source

    def key(self) -> tuple:
        return self.size, self.weight, self.offset


class _Placement:
    """What a tensor holds along its dim ``axis``: :class:`_Piece` after :class:`_Piece` of channels kept apart.
    With ``axis`` None no dim holds a weight layer's channels kept apart: ``source`` names what mixed them (and
    ``pieces`` the weight layers it mixed) or, without pieces, what produced the tensor."""

    __slots__ = ("axis", "pieces", "source")

    def __init__(self, axis: int | None, pieces: tuple[_Piece, ...], source: str):
        self.axis, self.pieces, self.source = axis, pieces, source

    @classmethod
    def of_weight(cls, name: str, axis: int, size: int | None) -> "_Placement":
        return cls(axis, (_Piece(size, name, 0, (), name),), name)

    @classmethod
    def nothing(cls, source: str) -> "_Placement":
        return cls(None, (), source)

    @property
    def weighted(self) -> bool:
        """Whether some of its channels are a weight layer's, kept apart along :attr:`axis`."""
        return self.axis is not None and any(p.weight for p in self.pieces)

    def seen_through(self, op: str, args, in_shape, out_shape) -> "_Placement":
        """The placement of a see-through operation's result (:func:`channel_axis_after`); a tensor without
        weight channels keeps its ``source``."""
        if not self.weighted:
            return self
        axis = channel_axis_after(op, args, in_shape, out_shape, self.axis)
        if axis is None:
            return _Placement(None, self.pieces, op)
        return _Placement(axis, tuple(_Piece(p.size, p.weight, p.offset, p.via + (op,), p.source)
                                      for p in self.pieces), self.source)

    def label(self) -> str:
        """The weight layer, ``cat(a, b, ...)`` of several, or ``(source)`` without any."""
        names = list(dict.fromkeys(p.weight for p in self.pieces if p.weight))
        if not names:
            return f"({self.source})"
        return names[0] if len(self.pieces) == 1 else f"cat({', '.join(names)})"


def _concatenated(parts: list[_Placement], sizes: list[int], dim: int) -> _Placement:
    """The placement of ``torch.cat`` of tensors placed at ``parts``, of ``sizes`` along the concatenated dim
    ``dim`` (>= 0): where every part holds its channels along ``dim``, the parts' pieces one after the other
    (a part without weight channels is one piece of its ``source``); else nothing pairable (``cat``)."""
    pieces: list[_Piece] = []
    for part, size in zip(parts, sizes):
        if part.weighted and part.axis == dim:
            whole = len(part.pieces) == 1 and part.pieces[0].size is None
            own = (_Piece(size, part.pieces[0].weight, 0, part.pieces[0].via, part.source),) if whole else part.pieces
            pieces += [_Piece(p.size, p.weight, p.offset, p.via + ("cat",), p.source) for p in own]
        elif part.weighted:  # a weight's channels in another dim: several weights would share a channel
            return _Placement.nothing("cat")
        else:
            pieces.append(_Piece(size, None, 0, (), part.source))
    if not any(p.weight for p in pieces):
        return parts[0] if len(parts) == 1 else _Placement.nothing("cat")  # a cat of one tensor is that tensor
    return _Placement(dim, tuple(pieces), "cat")


def _cat_dim(args, kwargs) -> int:
    """The dim argument of ``torch.cat(tensors, dim)`` (also ``dim=`` or numpy's ``axis=``; default 0)."""
    if len(args) > 1:
        return args[1]
    return kwargs.get("dim", kwargs.get("axis", 0))


_UNPAIRED = "not from a convolution or linear layer through operations that keep each channel apart"


def _decide(norm: str, calls: list[_Placement]) -> tuple[NormPair, tuple[str, ...]]:
    """One norm layer's pair from the placements of its calls: paired when every call takes the same channels
    of the same weight layers in its channel dim 1 and each channel has one weight layer (one segment per
    concatenated piece); else unpaired with the reason."""
    labels = {c.label() for c in calls}
    if len(labels) > 1:
        return NormPair(norm, None, f"called {len(calls)} times on the outputs of different layers "
                                    f"({', '.join(sorted(labels))})"), ()
    call = calls[0]
    if not any(p.weight for p in call.pieces):
        return NormPair(norm, None, f"its input comes from {call.source}, {_UNPAIRED}"), ()
    bad_axis = next((c for c in calls if c.axis != 1), None)
    if bad_axis is not None:
        how = (f"{bad_axis.source} does not keep each channel apart" if bad_axis.axis is None
               else f"its channel dim holds dim {bad_axis.axis}'s channels")
        return NormPair(norm, None, f"its input comes from {call.label()}, but {how}"), ()
    if len({tuple(p.key() for p in c.pieces) for c in calls}) > 1:
        return NormPair(norm, None, f"called {len(calls)} times on different channels of {call.label()}"), ()
    via = tuple(dict.fromkeys(op for p in call.pieces for op in p.via))
    if len(call.pieces) == 1:
        return NormPair(norm, call.pieces[0].weight), via
    segments, start, loose = [], 0, []
    for p in call.pieces:
        if p.weight is None:
            loose.append(f"[{start}, {start + p.size}) come from {p.source}")
        else:
            segments.append(Segment(start, start + p.size, p.weight, p.offset))
        start += p.size
    if loose:
        more = f" (and {len(loose) - 1} more channel ranges)" if len(loose) > 1 else ""
        return NormPair(norm, None, f"its channels {loose[0]}, {_UNPAIRED}{more}"), ()
    return NormPair(norm, call.label(), "", tuple(segments)), via


class NormLeafTracer(torch.fx.Tracer):
    """A ``torch.fx`` tracer that keeps every normalisation layer (any subclass of ``_BatchNorm``, GroupNorm,
    LayerNorm or InstanceNorm, from any package) and every weight layer (Conv1d/2d/3d, Linear and their
    subclasses) as one ``call_module`` node, so that a third-party layer such as timm's ``BatchNormAct2d`` or a
    user's Conv2d subclass is placed in the graph instead of traced into."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, NORM_LAYER_KINDS + WEIGHT_LAYERS) or super().is_leaf_module(m, module_qualified_name)


def _fx_placements(model: nn.Module, norms: dict[str, nn.Module], x) -> tuple[dict[str, list[_Placement]], list]:
    """``{norm layer: placements of its calls}`` read off a trace (:class:`NormLeafTracer`) whose shapes come
    from running two probe samples through the graph with batch statistics (``ShapeProp``), and the graph's
    norm layers in forward order. Empty when the model does not trace; where the graph does not run (or no
    ``x``), only a convolution directly upstream is placed without shapes, every other layer is left out."""
    from torch.fx.passes.shape_prop import ShapeProp
    try:
        graph = NormLeafTracer().trace(model)
        module = torch.fx.GraphModule(model, graph)
    except Exception:  # noqa: BLE001 - any model fx cannot trace falls back to execution order
        return {}, []
    if x is not None:
        try:
            # ShapeProp prints the traceback of a node that fails before it raises: kept off the user's stderr
            with torch.no_grad(), batch_statistics(model), redirect_stderr(io.StringIO()):
                ShapeProp(module).propagate(_probe_head(x, 2))
        except Exception:  # noqa: BLE001 - a graph that does not run: the layers that need shapes fall back
            for node in graph.nodes:
                node.meta.pop("tensor_meta", None)
    modules = dict(model.named_modules())

    def shape(node) -> tuple | None:
        meta = node.meta.get("tensor_meta") if isinstance(node, torch.fx.Node) else None
        return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None

    flows: dict[torch.fx.Node, _Placement] = {}

    def flow(src) -> _Placement:
        """The placement of a node's output; LookupError where it needs shapes the graph lacks."""
        if not isinstance(src, torch.fx.Node):
            return _Placement.nothing(f"a {type(src).__name__}")
        if src not in flows:
            flows[src] = _flow(src)
        return flows[src]

    def _flow(src: torch.fx.Node) -> _Placement:
        target = modules.get(src.target) if src.op == "call_module" else src.target
        out = shape(src)
        if src.op == "call_module" and isinstance(target, WEIGHT_LAYERS):
            if out is None and isinstance(target, nn.Linear):
                raise LookupError(src.target)  # its channels are its last dim: placed by execution order
            axis = 1 if out is None else _output_channel_axis(target, len(out))
            return _Placement.of_weight(src.target, axis, None if out is None else out[axis])
        op = _op_name(target) if src.op in ("call_module", "call_function", "call_method") else src.op
        first = src.args[0] if src.args else None
        if op in CAT_OPS and isinstance(first, (list, tuple)) and first:
            shapes, dim = [shape(n) for n in first], _cat_dim(src.args, src.kwargs)
            if out is None or any(s is None for s in shapes) or not isinstance(dim, int):
                if x is None:  # no probe, no shapes: a concatenation is not followed, as without this rule
                    return _Placement.nothing("cat")
                raise LookupError(src.name)  # the graph did not run: placed by execution order
            dim %= len(out)
            return _concatenated([flow(n) for n in first], [s[dim] for s in shapes], dim)
        if op not in SEE_THROUGH_OPS or not isinstance(first, torch.fx.Node):
            return _Placement.nothing("the model's input" if src.op == "placeholder" else op)
        inner = flow(first)
        if inner.weighted and (out is None or shape(first) is None):
            raise LookupError(src.name)
        return inner.seen_through(op, src.args, shape(first), out)

    placements: dict[str, list[_Placement]] = {}
    order: list[str] = []
    failed: set[str] = set()
    for node in graph.nodes:
        if node.op != "call_module" or node.target not in norms:
            continue
        if node.target not in order:
            order.append(node.target)
        try:
            placements.setdefault(node.target, []).append(flow(node.args[0] if node.args else None))
        except LookupError:
            failed.add(node.target)
    for name in failed:
        placements.pop(name, None)
    return placements, [n for n in order if n in placements]


class _ChannelProvenance(TorchFunctionMode):
    """Which weight layer's output channels each tensor of a forward pass holds, and in which dim.

    Every torch function and tensor method passes through :meth:`__torch_function__`: a result of a
    see-through operation (:func:`channel_axis_after`) on a tensor that holds a weight layer's channels holds
    them too; any other result, and the tensor an in-place operation other than a see-through one writes
    into (``y += z``, ``y.mul_(z)``, ``y[...] = z``), holds none. The weight layers' forward hooks mark their
    outputs. Every tensor seen is kept alive until the pass ends, so that no ``id`` is reused.
    """

    def __init__(self):
        super().__init__()
        self.tensors: dict[int, tuple[torch.Tensor, _Placement]] = {}

    def mark(self, t: torch.Tensor, placement: _Placement) -> None:
        self.tensors[id(t)] = (t, placement)

    def of(self, t) -> _Placement:
        found = self.tensors.get(id(t)) if isinstance(t, torch.Tensor) else None
        if found is not None and found[0] is t:
            return found[1]
        return _Placement.nothing("the model's input" if isinstance(t, torch.Tensor) else type(t).__name__)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = _op_name(func)
        if op in ("__get__", "__set__", "dim", "size", "numel", "__len__", "is_floating_point"):
            return out  # attribute reads and sizes: no tensor computed
        first = args[0] if args else None
        if not isinstance(out, torch.Tensor):
            placement = None
        elif (op in CAT_OPS and isinstance(first, (list, tuple)) and first
              and all(isinstance(t, torch.Tensor) and t.dim() == out.dim() for t in first)):
            dim = _cat_dim(args, kwargs) % out.dim()
            placement = _concatenated([self.of(t) for t in first], [t.shape[dim] for t in first], dim)
        elif isinstance(first, torch.Tensor) and op in SEE_THROUGH_OPS:
            placement = self.of(first).seen_through(op, args, first.shape, out.shape)
        else:
            placement = _Placement.nothing(op)
        if placement is not None:
            self.mark(out, placement)
        writes = op.endswith("_") or op == "__setitem__" or "out" in kwargs
        if writes and op not in SEE_THROUGH_OPS:
            for t in (first, kwargs.get("out")):
                if isinstance(t, torch.Tensor):
                    self.mark(t, _Placement.nothing(op))
        return out


def _execution_placements(model: nn.Module, norms: dict[str, nn.Module], x) -> tuple[dict[str, list[_Placement]],
                                                                                  list[str]]:
    """``{norm layer: placements of its calls}`` found by running two probe samples through the model with batch
    statistics and no gradient (no buffer changes; :class:`_ChannelProvenance`), and the norm layers in the
    order of their first call."""
    mode = _ChannelProvenance()
    found: dict[str, list[_Placement]] = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, WEIGHT_LAYERS):
            def post(mod, inp, out, name=name):
                if isinstance(out, torch.Tensor):
                    axis = _output_channel_axis(mod, out.dim())
                    mode.mark(out, _Placement.of_weight(name, axis, out.shape[axis]))
            hooks.append(m.register_forward_hook(post))
        if name in norms:
            hooks.append(m.register_forward_pre_hook(
                lambda mod, inp, name=name: found.setdefault(name, []).append(mode.of(inp[0] if inp else None))))
    head = _probe_head(x, 2)  # outside the mode: the model's input, not a slice it saw made
    try:
        with torch.no_grad(), batch_statistics(model), mode:
            _call(model, head)
    finally:
        for h in hooks:
            h.remove()
        mode.tensors.clear()
    return found, list(found)


def find_pairs(model: nn.Module, x=None, running_statistics_only: bool = True) -> Pairing:
    """Each normalisation layer and the convolution or linear layer whose output channels it normalises.

    Each layer is placed by a ``torch.fx`` trace (:class:`NormLeafTracer`, the shapes from two probe samples)
    where the model traces and the layer is in the graph; every other layer by the order of execution on two
    probe samples (:class:`_ChannelProvenance`), layer by layer, not model by model. A norm layer is paired
    with a weight layer when its input is that layer's output seen through operations that keep each channel
    apart and are positively homogeneous in it (:func:`channel_axis_after`: ReLU, LeakyReLU, dropout, identity,
    pooling, and reshapes and permutes that keep the channel dim whole), and the weight's output channels land
    in the norm layer's channel dim 1. After a concatenation along the channel dim (``torch.cat``: DenseNet,
    MixNet) it is paired per channel segment (:attr:`NormPair.segments`) when every piece is a weight layer's
    output so seen through; a piece that is not names its channels in the reason. Anything else, an addition,
    a concatenation along another dim, a product with another tensor, SiLU, GELU, a sigmoid, and a norm layer
    called on the outputs of different layers, leaves it unpaired with the reason, never guessed.
    ``docs/pairing.md`` explains how to read the result.

    Args:
        x: probe inputs (N >= 2, ...), a tensor or, for a model that takes a mapping, the mapping; two samples
            give the fx graph its shapes and run the execution-order pass. Without it, a model that traces is
            paired on the graph alone, where only reshapes and permutes need shapes, and a concatenation, whose
            segments need them, leaves its norm layers unpaired.
        running_statistics_only: only BatchNorm layers that keep running statistics (the monitor's
            default); else every BatchNorm, GroupNorm, LayerNorm and InstanceNorm layer.

    Raises:
        ValueError: when the model has no such layer, or a layer is not placed by fx and no ``x`` is given or
            the model cannot run on it.
    """
    layers = running_stat_layers(model) if running_statistics_only else norm_layers(model)
    if not layers:
        what = "BatchNorm layer with running statistics" if running_statistics_only else "normalisation layer"
        raise ValueError(f"the model has no {what} (BatchNorm1d/2d/3d, SyncBatchNorm or a subclass with "
                         "track_running_stats=True): there are no running statistics to go stale")
    norms = dict(layers)
    with _buffers_kept(model), torch.random.fork_rng(devices=_rng_devices(model)):
        placements, order = _fx_placements(model, norms, x)
        methods = {name: "fx" for name in placements}
        rest = [n for n in norms if n not in placements]
        if rest:
            if x is None:
                raise ValueError("the model does not trace with torch.fx (or some normalisation layers are not in "
                                 f"its graph: {', '.join(rest)}); pass a probe input to pair its layers by "
                                 "execution order")
            try:
                found, called = _execution_placements(model, {n: norms[n] for n in rest}, x)
            except Exception as e:  # the model's own error on these inputs, named as the probe's
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else "(a mapping)"
                raise ValueError(f"probe: the model cannot run on the probe inputs {shape} to pair "
                                 f"{', '.join(rest)} by execution order ({type(e).__name__}: {e})") from e
            placements |= found
            order += called
            methods |= {name: "execution order" for name in found}
    pairs, unpaired, via = [], [], {}
    for name in order:
        pair, through = _decide(name, placements[name])
        (pairs if pair.weight else unpaired).append(pair)
        if through:
            via[name] = through
    missing = [n for n in norms if n not in placements]
    unpaired += [NormPair(n, None, "not called on the probe batch") for n in missing]
    methods |= {n: "execution order" for n in missing}
    kinds = set(methods.values())
    method = "fx and execution order" if len(kinds) > 1 else kinds.pop()
    return Pairing(pairs, unpaired, method, methods, via)


# ----------------------------------------------------------------------------- the probe batch
def split_probe(probe, input_key: str | None = "input", target_key: str = "target") -> tuple[torch.Tensor,
                                                                                            torch.Tensor | None]:
    """``(x, y)`` from a probe batch, read as :func:`bnrotation.batches.split_batch` reads any batch (a tensor,
    an ``(x, y)`` or ``(x,)`` tuple or list, or a mapping), labels checked.

    Raises:
        TypeError, ValueError: as :func:`bnrotation.batches.split_batch`, naming the probe.
    """
    return split_batch(probe, input_key, target_key, what="probe")


def _check_probe(model: nn.Module, x, y: torch.Tensor | None) -> None:
    """Fail at construction, naming the probe, on what would fail or mislead at the first call: non-finite or
    non-floating inputs (of a mapping: non-finite floating tensors), inputs the model cannot run on (tried on
    two samples in evaluation mode; flags, random streams and buffers restored), outputs without a class dim,
    and labels that are not class indices of the output.

    Raises:
        ValueError: naming the probe and what was expected.
    """
    if isinstance(x, torch.Tensor) and not x.is_floating_point():
        raise ValueError(f"probe: expected floating-point inputs, got {x.dtype}")
    tensors = {"": x} if isinstance(x, torch.Tensor) else {f"[{k!r}]": v for k, v in x.items()
                                                           if isinstance(v, torch.Tensor) and v.is_floating_point()}
    for key, t in tensors.items():
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise ValueError(f"probe{key}: {bad} of {t.numel()} input values are NaN or infinite")
    try:
        with (torch.no_grad(), torch.random.fork_rng(devices=_rng_devices(model)), evaluation_mode(model),
              _buffers_kept(model)):
            out = _call(model, _probe_head(x, 2))  # eagerly: a compiled evaluation would compile a graph for 2
    except Exception as e:  # any error the model raises on these inputs, reported as the probe's
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else f"(a mapping with keys {sorted(map(str, x))})"
        raise ValueError(f"probe: the model cannot run on the probe inputs {shape} "
                         f"({type(e).__name__}: {e})") from e
    if not isinstance(out, torch.Tensor) or out.dim() < 2:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"probe: the model's output on the probe must be (N, classes, ...) for the mode check, "
                         f"got {got}")
    if y is not None:
        if y.is_floating_point() or y.is_complex():
            raise ValueError(f"probe: labels must be class indices (an integer tensor), got {y.dtype}")
        k = out.shape[1]
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= k):
            raise ValueError(f"probe: labels must lie in [0, {k}) for a model with {k} outputs, got "
                             f"[{int(y.min())}, {int(y.max())}]")


# ----------------------------------------------------------------------------- thresholds
@dataclass(frozen=True)
class Thresholds:
    """When :class:`StalenessMonitor` warns: both the mode gap and the lag at or above their threshold.

    Attributes:
        mode_gap: training-mode minus evaluation-mode accuracy on the probe batch (with labels), or the
            share of probe samples whose predicted class differs between the two modes (without), as a
            fraction. Default 0.05. The share of changed predictions is at least the accuracy gap, and much
            larger where both modes are often wrong (an untrained model): without labels the rule is
            stricter, and on the same model can warn where it would not with labels.
        lag_sigma: the largest, over layers, median |running-mean lag| in σ. Default 0.1σ.

    The defaults were chosen on the suite's reference runs by how often the rule fires at checks that fail
    (evaluation-mode accuracy below 90%) and at checks that pass; the counts on the committed runs, for these
    and other thresholds, are in ``results/reference/monitor.md``
    (:func:`bnrotation.analysis.tables.monitor_report.threshold_table`, ``make table``).
    """

    mode_gap: float = 0.05
    lag_sigma: float = 0.1

    def __post_init__(self) -> None:
        for key in ("mode_gap", "lag_sigma"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Thresholds.{key}: expected a finite number >= 0, got {value!r}")

    def crossed(self, mode_gap: float, lag_sigma: float) -> bool:
        """The rule: ``mode_gap`` (fraction) at least :attr:`mode_gap` and ``lag_sigma`` (the worst layer's median
        |lag|, σ) at least :attr:`lag_sigma`. NaN never crosses."""
        return bool(mode_gap >= self.mode_gap and lag_sigma >= self.lag_sigma)


# ----------------------------------------------------------------------------- the mode check
def mode_check(step: int, out_train: torch.Tensor, out_eval: torch.Tensor | None,
               y: torch.Tensor | None) -> pd.DataFrame:
    """One ``checks`` line (see :class:`MonitorRecord`) from the outputs (N, classes) of the same N inputs in
    training mode (batch statistics) and in evaluation mode, and their labels (N,) if any.

    The mode gap is training- minus evaluation-mode accuracy with labels, else the share of samples whose
    predicted class (argmax over dim 1) differs between the modes; all fractions. Without ``out_eval``
    every measure is NaN.
    """
    nan = math.nan
    acc_train = acc_eval = agreement = nan
    if out_eval is not None:
        pred_train, pred_eval = out_train.argmax(1), out_eval.argmax(1)
        agreement = float((pred_train == pred_eval).double().mean())
        if y is not None:
            acc_train = float((pred_train == y).double().mean())
            acc_eval = float((pred_eval == y).double().mean())
    gap = acc_train - acc_eval if y is not None else 1.0 - agreement
    return pd.DataFrame({"step": [step], "acc_train_mode": [acc_train], "acc_eval_mode": [acc_eval],
                         "mode_agreement": [agreement], "mode_gap": [gap], "probe_size": [len(out_train)]})


# ----------------------------------------------------------------------------- one call's records
@dataclass
class MonitorRecord:
    """What one :meth:`StalenessMonitor.measure` call measured.

    Attributes:
        step: the optimizer step.
        checks: one line: ``step``, ``acc_train_mode``, ``acc_eval_mode`` (fractions; NaN without labels),
            ``mode_agreement`` (share of probe samples predicted alike in both modes), ``mode_gap``
            (training- minus evaluation-mode accuracy, or 1 - agreement without labels), ``probe_size``.
        layers: one line per normalisation layer: ``step``, ``layer`` (the upstream weight layer, "" if
            unpaired; ``cat(a, b, ...)`` for one paired per segment, whose weight norm and cosines are those of
            its segments' weight rows taken together), ``norm_layer``, ``weight_norm``, ``update_cos``, ``grad_cos``,
            ``rotation_deg_per_100`` (median over channels), ``lag_median_abs_sigma``,
            ``lag_max_abs_sigma``, ``worst_channel``, ``channels_above_1_sigma``.
        channels: one line per channel, the suite's ``channels`` columns: ``step``, ``layer`` (the weight
            layer of the channel's segment), ``norm_layer``, ``channel``, ``rotation_deg`` (since the previous call), ``rotation_deg_per_100``,
            ``weight_norm``, ``update_cos``, ``running_mean``, ``running_var``, ``fresh_mean``, ``fresh_var``,
            ``lag_sigma``, ``drift_sigma_per_step``, ``predicted_lag_sigma``, ``abs_mean_over_std``.
        stale: whether the thresholds were crossed, or a running statistic holds NaN or infinite values.
        summary: one line for a progress bar.
        nonfinite: the parameters and running statistics that hold NaN or infinite values
            (:class:`.bnstats.NonFinite`; false when there are none). Their layers' measures are NaN and left
            out of the summary's medians, which name them instead.
    """

    step: int
    checks: pd.DataFrame
    layers: pd.DataFrame
    channels: pd.DataFrame
    stale: bool
    summary: str
    nonfinite: NonFinite = field(default_factory=NonFinite)

    @property
    def mode_gap(self) -> float:
        """The probe's training- minus evaluation-mode accuracy (1 - agreement without labels), a fraction."""
        return float(self.checks["mode_gap"].iloc[0])

    @property
    def acc_eval_mode(self) -> float:
        """The probe's evaluation-mode accuracy, a fraction; NaN without labels."""
        return float(self.checks["acc_eval_mode"].iloc[0])

    @property
    def worst_median_lag_sigma(self) -> float:
        """The largest, over layers, median |running-mean lag| in σ: the lag the rule reads (NaN when none)."""
        lag = self.layers["lag_median_abs_sigma"]
        return float(lag.max()) if lag.notna().any() else math.nan

    def worst(self) -> tuple[str, int, float] | None:
        """(norm layer, channel, signed lag in σ) of the channel with the largest |lag|; None without lag."""
        ch = self.channels[np.isfinite(self.channels["lag_sigma"])]
        if ch.empty:
            return None
        line = ch.loc[ch["lag_sigma"].abs().idxmax()]
        return str(line["norm_layer"]), int(line["channel"]), float(line["lag_sigma"])


@dataclass
class _Previous:
    step: int
    weights: dict[str, torch.Tensor]
    fresh_mean: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class _Rows:
    """One weight layer's measures per output channel (all (C_out,) float64 on the CPU; None where not
    measured): ``norm`` |w_c|, ``rotation`` (degrees since the previous call), and for the update and gradient
    cosines the dot products with the weights before the step and the squared norms, which a norm layer's
    segments add up over the rows they take (the cosine of the rows taken together, as :func:`.probes.cosine`
    of one weight layer's whole weight)."""

    norm: torch.Tensor
    rotation: torch.Tensor | None = None
    update_cos: torch.Tensor | None = None
    update: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (u·wb, |u|², |wb|²) per row
    grad: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (g·wb, |g|², |wb|²) per row

    @classmethod
    def of(cls, w: torch.Tensor, then: torch.Tensor | None, before: torch.Tensor | None,
           grad: torch.Tensor | None) -> "_Rows":
        """From the weight ``w`` (C_out, ...), the previous call's ``then``, the weight ``before`` this step
        and the gradient ``grad`` (each None when absent)."""
        rows = cls(channel_norms(w).cpu())
        if then is not None and then.shape == w.shape:
            rows.rotation = rotation_deg(then, w).cpu()
        if before is not None:
            u, wb = _flat_rows(w) - _flat_rows(before), _flat_rows(before)
            rows.update_cos = channel_cosines(u, wb).cpu()
            wb_sq = wb.square().sum(1)
            rows.update = ((u * wb).sum(1).cpu(), u.square().sum(1).cpu(), wb_sq.cpu())
            if grad is not None:
                g = _flat_rows(grad)
                rows.grad = ((g * wb).sum(1).cpu(), g.square().sum(1).cpu(), wb_sq.cpu())
        return rows

    @staticmethod
    def whole_norm(parts: list[tuple["_Rows", slice]]) -> float:
        """|w| of the rows ``parts`` take, together; NaN without rows."""
        if not parts:
            return math.nan
        return float(torch.cat([r.norm[s] for r, s in parts]).square().sum().sqrt())

    @staticmethod
    def whole_cosine(parts: list[tuple["_Rows", slice]], which: str) -> float:
        """The cosine ``"update"`` (of w(t+1) - w(t) with w(t)) or ``"grad"`` (of the gradient with w(t)) over
        the rows ``parts`` take, together; NaN where not measured or a norm is 0."""
        terms = [getattr(r, which) for r, _ in parts]
        if not parts or any(t is None for t in terms):
            return math.nan
        dot, a, b = (sum(float(t[k][s].sum()) for t, (_, s) in zip(terms, parts)) for k in range(3))
        return dot / math.sqrt(a * b) if a > 0 and b > 0 else math.nan


def _flat_rows(w: torch.Tensor) -> torch.Tensor:
    """(C_out, ...) -> (C_out, D) float64."""
    return w.detach().reshape(w.shape[0], -1).double()


def _gathered(parts: list[tuple[_Rows, slice]], key: str, missing: torch.Tensor) -> torch.Tensor:
    """A norm layer's (C,) column of the weight rows its segments take (``missing`` where a segment's weight
    layer lacks it, or without segments)."""
    if not parts:
        return missing
    pieces, start = [], 0
    for rows, s in parts:
        values = getattr(rows, key)
        n = s.stop - s.start
        pieces.append(values[s] if values is not None else missing[start:start + n])
        start += n
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]


def _caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel, from :meth:`StalenessMonitor.measure`, that names the first line outside
    this module and torch's decorators: the user's ``monitor(step)`` or ``monitor.measure(step)``, not
    ``torch.no_grad``'s wrapper."""
    frame, level = sys._getframe(1), 1  # level 1: the function that warns
    while frame.f_back is not None and (frame.f_code.co_filename == __file__
                                        or frame.f_globals.get("__name__", "").startswith("torch.")):
        frame, level = frame.f_back, level + 1
    return level


def uncompiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile``d model wraps (``OptimizedModule._orig_mod``: the same parameters and
    buffers), else ``model``. The monitor measures it eagerly: compiling graphs for the probe batch would cost
    more than the measurements."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # never imported: nothing was compiled
    if eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
        return model._orig_mod
    return model


def default_warmup_steps(layers: list[nn.Module], remaining: float = 0.01) -> int:
    """Steps until every BatchNorm layer's running statistics hold less than ``remaining`` of their initial
    values: ``ceil(ln(remaining) / ln(1 - m))`` for the smallest momentum m (an exponential average keeps
    ``(1 - m)**t`` of its start after t updates); 1 for ``momentum=None`` (the cumulative average replaces
    them at the first batch); 0 without BatchNorm layers. 44 at PyTorch's default m = 0.1."""
    momenta = [m.momentum for m in layers if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not momenta:
        return 0
    steps = [1 if m is None else (math.ceil(math.log(remaining) / math.log1p(-m)) if 0 < m < 1 else 1)
             for m in momenta]
    return max(steps)


def smallest_probe(mode_gap: float) -> int:
    """The fewest probe samples for which one sample moves the mode gap (a fraction) by no more than
    ``mode_gap``: ``ceil(1 / mode_gap)``; 0 (any size) for a threshold of 0."""
    return math.ceil(1.0 / mode_gap - 1e-9) if mode_gap > 0 else 0


def _rng_devices(model: nn.Module) -> list[int]:
    return sorted({t.device.index or 0 for t in model.parameters() if t.device.type == "cuda"})


class StalenessMonitor:
    """The study's three early-warning measurements on any model, from a fixed probe batch.

    Args:
        model: any ``nn.Module`` with BatchNorm layers that keep running statistics (with
            ``running_statistics_only=False`` also GroupNorm, LayerNorm and InstanceNorm layers, whose
            rotation and input moments are measured and whose lag is NaN). A ``torch.compile``d model
            (``OptimizedModule``) is measured through the module it wraps (``_orig_mod``, which holds the same
            parameters and buffers), eagerly: no graph is compiled for the probe, and ``monitor.model`` is
            that module.
        probe: a tensor, an ``(x, y)`` tuple, or a mapping holding the input under ``input_key`` and the
            labels under ``target_key``; labels are optional. With ``input_key=None`` the mapping goes to the
            model whole (``model(batch)``), labels still read from ``target_key``. Keep it fixed across
            calls: the drift and the lag compare statistics of the same inputs. Inputs (N, ...) on the
            model's device. The mode gap moves by 1/N per sample: warns at construction
            (:class:`MonitorSetupWarning`) when that is above ``thresholds.mode_gap``, naming the smallest
            probe for it; ``docs/pairing.md`` advises on the size.
        thresholds: when to warn (:class:`Thresholds`).
        warn: raise a :class:`StaleStatisticsWarning` when the thresholds are crossed.
        modes: measure the training- against evaluation-mode check on the probe batch (one extra
            evaluation-mode forward pass per call).
        warmup_steps: no staleness warning, and no ``STALE`` in the summary, at a step below it (the record's
            ``stale`` is still the rule's verdict; non-finite statistics always warn). Default (None): :func:`default_warmup_steps` of the
            monitored layers' momenta, the steps until their running statistics hold less than 1% of
            their initial values (44 at PyTorch's default momentum of 0.1); before that, a lag measures the
            initialisation, and an untrained model's two modes differ by chance alone.

    Unpaired layers (:attr:`pairing`, :func:`find_pairs`) are named, with the reason, in one
    :class:`MonitorSetupWarning` at construction: their lag is measured, their rotation is not.
    BatchNorm settings that break the running statistics (:func:`bnrotation.lint.lint_batchnorm`, kept in
    :attr:`findings`) are named in one more.

    A call costs one forward pass in training mode with batch statistics (it gives the fresh statistics
    and the training-mode predictions at once), one in evaluation mode, and a pass over the paired
    weights. It changes no buffer, parameter, gradient, optimizer state, random stream or module flag.
    Layers frozen in evaluation mode while the model trains keep their running statistics in the
    training-mode pass, as they do in the model's own training steps.

    Raises:
        ValueError: for a model without such layers, a probe of fewer than 2 samples, with non-finite
            values, of a shape the model cannot run on, or with labels that are not the output's class
            indices; for a ``warmup_steps`` that is not an int >= 0 or None.
        TypeError: for a model that is not an ``nn.Module``, a probe it cannot read, or ``thresholds`` that are
            not a :class:`Thresholds`.
    """

    def __init__(self, model: nn.Module, probe, *, input_key: str | None = "input", target_key: str = "target",
                 thresholds: Thresholds = Thresholds(), warn: bool = True, modes: bool = True,
                 running_statistics_only: bool = True, warmup_steps: int | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        model = uncompiled(model)
        self.model = model
        self.x, self.y = split_probe(probe, input_key, target_key)
        n = sample_count(self.x)
        if n < 2:
            raise ValueError(f"probe: BatchNorm needs at least 2 samples for batch statistics, got {n}")
        if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int)
                                         or warmup_steps < 0):
            raise ValueError(f"warmup_steps: expected an int >= 0 or None, got {warmup_steps!r}")
        for name, m in model.named_modules():
            if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
                raise ValueError(f"{name or 'model'}: an uninitialised lazy module; run one forward pass before "
                                 "attaching the monitor")
        if not isinstance(thresholds, Thresholds):
            raise TypeError(f"thresholds: expected a bnrotation.monitor.Thresholds, got {type(thresholds).__name__}"
                            " (write Thresholds(mode_gap=..., lag_sigma=...))")
        _check_probe(model, self.x, self.y)
        self.pairing = find_pairs(model, self.x, running_statistics_only)
        modules = dict(model.named_modules())
        self.layers = [(p, modules[p.norm]) for p in self.pairing.pairs + self.pairing.unpaired]
        # every weight layer of a paired layer's segments, once: the weight pass measures each once per call
        self.weight_layers = {w: modules[w] for p in self.pairing.pairs for w in p.weights}
        self.thresholds, self.warn, self.modes = thresholds, warn, modes
        self.warmup_steps = (default_warmup_steps([m for _, m in self.layers]) if warmup_steps is None
                             else warmup_steps)
        if self.pairing.unpaired:
            warnings.warn(f"{len(self.pairing.unpaired)} of {len(self.layers)} normalisation layer(s) left unpaired "
                          "(their lag is measured, their rotation is not): "
                          + "; ".join(f"{p.norm}: {p.reason}" for p in self.pairing.unpaired)
                          + " (monitor.pairing; docs/pairing.md)", MonitorSetupWarning, stacklevel=2)
        from .lint import findings_line, lint_batchnorm  # lint builds on find_pairs: imported here, not above
        self.findings = lint_batchnorm(model, pairing=self.pairing)  # BatchNorm settings that break the statistics
        if self.findings:
            warnings.warn(findings_line(self.findings), MonitorSetupWarning, stacklevel=2)
        smallest = smallest_probe(thresholds.mode_gap)
        if modes and n < smallest:  # without the mode check no gap is measured
            warnings.warn(f"probe: one of its {n} samples moves the mode gap by {1 / n:.2%}, more than the "
                          f"threshold of {thresholds.mode_gap:.2%}: one sample alone can cross it; use at least "
                          f"{smallest} samples (docs/pairing.md, 'Probe size')", MonitorSetupWarning, stacklevel=2)
        self.previous: _Previous | None = None
        self.last_fresh: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # the last call's, float64

    def state_dict(self) -> dict:
        """What the next call compares with (the previous call's step, weights and fresh means), for a
        resumable run."""
        if self.previous is None:
            return {}
        return {"step": self.previous.step, "weights": dict(self.previous.weights),
                "fresh_mean": dict(self.previous.fresh_mean),
                "last_fresh": {k: list(v) for k, v in (self.last_fresh or {}).items()}}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output (weights moved to their layers' devices).

        Raises:
            ValueError: when its weights are not this model's paired weight layers, of their shapes.
        """
        if not state:
            self.previous, self.last_fresh = None, None
            return
        weights = {}
        for name, w in state["weights"].items():
            layer = self.weight_layers.get(name)
            if layer is None or tuple(w.shape) != tuple(layer.weight.shape):
                want = f"{tuple(layer.weight.shape)}" if layer is not None else "no paired weight layer of that name"
                raise ValueError(f"monitor state: weights[{name!r}] of shape {tuple(w.shape)}, but this model has "
                                 f"{want}: a state of another model?")
            weights[name] = w.to(layer.weight.device)
        self.previous = _Previous(int(state["step"]), weights, dict(state["fresh_mean"]))
        self.last_fresh = {k: (v[0], v[1]) for k, v in state["last_fresh"].items()}

    @property
    def unpaired(self) -> list[NormPair]:
        return self.pairing.unpaired

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Clones of the paired weights, ``{weight layer: (C_out, ...)}`` (each weight layer of a segment once):
        take one just before
        ``optimizer.step()`` and pass it to :meth:`measure` to get the update and gradient cosines of
        that step."""
        return {name: w.weight.detach().clone() for name, w in self.weight_layers.items()}

    def __call__(self, step: int, weights_before_step: Mapping[str, torch.Tensor] | None = None) -> MonitorRecord:
        return self.measure(step, weights_before_step)

    @torch.no_grad()
    def measure(self, step: int, weights_before_step: Mapping[str, torch.Tensor] | None = None) -> MonitorRecord:
        """Measure at ``step``: the mode check on the probe batch, each channel's rotation since the previous
        call, and each channel's running-mean lag, drift and |mean|/σ.

        Args:
            step: the optimizer step (for the rotation and drift per step, and the records).
            weights_before_step: :meth:`snapshot` taken before this step's ``optimizer.step()``; gives the
                update cosine cos(w(t+1) - w(t), w(t)) and the gradient cosine cos(∇L, w(t)), else NaN.

        Returns:
            A :class:`MonitorRecord`. Warns with :class:`StaleStatisticsWarning` when the thresholds are crossed or a
            running statistic holds NaN or infinite values, and with ``RuntimeWarning`` when a parameter does.

        Raises:
            TypeError: when ``step`` is not an int >= 0.
            ValueError: when ``step`` is not after the previous call's.
        """
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise TypeError(f"step: expected the optimizer step as an int >= 0, got {step!r}")
        step = int(step)
        if self.previous is not None and step <= self.previous.step:
            raise ValueError(f"step {step} is not after the previous call's step {self.previous.step}")
        with torch.random.fork_rng(devices=_rng_devices(self.model)):
            out_train, fresh = batch_statistics_pass(self.model, self.x, [(p.norm, m) for p, m in self.layers],
                                                     keep_frozen=True)
            out_eval = self._eval_forward() if self.modes else None
        checks = self._checks(step, out_train, out_eval)
        interval = step - self.previous.step if self.previous is not None else None
        rows = self._weight_pass(weights_before_step)
        layer_rows, channel_columns = [], []
        for pair, norm in self.layers:
            layer_line, channels = self._layer(step, interval, pair, norm, fresh[pair.norm], rows)
            layer_rows.append(layer_line)
            channel_columns.append(channels)
        self.previous = _Previous(step, {name: w.weight.detach().clone() for name, w in self.weight_layers.items()},
                                  {name: mean.cpu() for name, (mean, _) in fresh.items()})
        self.last_fresh = fresh
        channels = pd.DataFrame({k: np.concatenate([c[k] for c in channel_columns]) for k in channel_columns[0]})
        record = MonitorRecord(step, checks, pd.DataFrame(layer_rows), channels, False, "",
                               nonfinite_state(self.model))
        record.stale = self._stale(record)
        record.summary = self._summary(record)
        if record.nonfinite.parameters and self.warn:
            warnings.warn(f"step {step}: the model has diverged: NaN or infinite values in "
                          f"{', '.join(record.nonfinite.parameters)}; the measures of their layers are NaN",
                          RuntimeWarning, stacklevel=_caller_stacklevel())
        if record.nonfinite.running_statistics and self.warn:
            warnings.warn(f"step {step}: running statistics hold NaN or infinite values "
                          f"({', '.join(record.nonfinite.running_statistics)}): evaluation mode is unusable. "
                          "Re-estimate them (bnrotation.bnstats.reestimate) before evaluating or saving this model",
                          StaleStatisticsWarning, stacklevel=_caller_stacklevel())
        elif record.stale and self.warn and step >= self.warmup_steps:
            worst = record.worst()
            where = f"{worst[0]} channel {worst[1]} ({worst[2]:+.2f}σ)" if worst else "?"
            warnings.warn(f"step {step}: running statistics are stale: {record.summary}; worst channel {where}. "
                          "Re-estimate them (bnrotation.bnstats.reestimate) before evaluating or saving this "
                          "model", StaleStatisticsWarning, stacklevel=_caller_stacklevel())
        return record

    # ------------------------------------------------------------------------- parts of a call
    def _eval_forward(self) -> torch.Tensor:
        return evaluation_forward(self.model, self.x)

    def _checks(self, step: int, out_train: torch.Tensor, out_eval: torch.Tensor | None) -> pd.DataFrame:
        return mode_check(step, out_train, out_eval, self.y)

    def _weight_pass(self, before: Mapping[str, torch.Tensor] | None) -> dict[str, "_Rows"]:
        """Each weight layer's per-output-channel measures, once per call however many segments use it."""
        prev = self.previous
        rows = {}
        for name, layer in self.weight_layers.items():
            w = layer.weight.detach()
            wb = before.get(name) if before is not None else None
            then = prev.weights.get(name) if prev is not None else None
            rows[name] = _Rows.of(w, then, wb, layer.weight.grad)
        return rows

    def _layer(self, step: int, interval: int | None, pair: NormPair, norm: nn.Module,
               moments: tuple[torch.Tensor, torch.Tensor], weights: dict[str, "_Rows"]):
        f_mean, f_var = (t.cpu() for t in moments)  # (C,) float64
        c = f_mean.numel()
        nan = torch.full((c,), math.nan, dtype=torch.float64)
        has_running = isinstance(norm, _BatchNorm) and norm.running_mean is not None
        r_mean = norm.running_mean.double().cpu() if has_running else nan
        r_var = norm.running_var.double().cpu() if has_running else nan
        prev = self.previous
        prev_mean = prev.fresh_mean.get(pair.norm) if prev is not None else None
        drift = drift_sigma_per_step(f_mean, prev_mean, f_var, interval) if prev_mean is not None else nan
        momentum = norm.momentum if has_running and norm.momentum is not None else math.nan
        lag = lag_sigma(r_mean, f_mean, f_var)  # (C,)
        spans = pair.spans(c)
        for s in spans:
            have = weights[s.weight].norm.numel()
            fits = have == c if not pair.segments else s.offset + s.stop - s.start <= have
            if not fits:
                raise ValueError(f"{s.weight} -> {pair.norm}: {have} output channels but {c} normalised"
                                 + (f" (channels [{s.start}, {s.stop}) from {s.offset} on)" if pair.segments else ""))
        parts = [(weights[s.weight], slice(s.offset, s.offset + s.stop - s.start)) for s in spans]
        rot = _gathered(parts, "rotation", nan)
        per_100 = rot * 100.0 / interval if interval else nan
        names = (np.concatenate([np.full(s.stop - s.start, s.weight, dtype=object) for s in spans]) if spans
                 else np.full(c, "", dtype=object))
        channels = {  # columns of (C,) arrays; measure() makes one frame of every layer's
            "step": np.full(c, step), "layer": names, "norm_layer": np.full(c, pair.norm, dtype=object),
            "channel": np.arange(c), "rotation_deg": rot.numpy(), "rotation_deg_per_100": per_100.numpy(),
            "weight_norm": _gathered(parts, "norm", nan).numpy(),
            "update_cos": _gathered(parts, "update_cos", nan).numpy(),
            "running_mean": r_mean.numpy(), "running_var": r_var.numpy(),
            "fresh_mean": f_mean.numpy(), "fresh_var": f_var.numpy(), "lag_sigma": lag.numpy(),
            "drift_sigma_per_step": drift.numpy(), "predicted_lag_sigma": predicted_lag_sigma(drift, momentum).numpy(),
            "abs_mean_over_std": (f_mean.abs() / f_var.sqrt()).numpy(),
        }
        abs_lag = lag.abs()
        finite = torch.isfinite(abs_lag)
        line = {
            "step": step, "layer": pair.weight or "", "norm_layer": pair.norm,
            "weight_norm": _Rows.whole_norm(parts), "update_cos": _Rows.whole_cosine(parts, "update"),
            "grad_cos": _Rows.whole_cosine(parts, "grad"),
            "rotation_deg_per_100": float(per_100.median()) if torch.isfinite(per_100).any() else math.nan,
            "lag_median_abs_sigma": float(abs_lag[finite].median()) if finite.any() else math.nan,
            "lag_max_abs_sigma": float(abs_lag[finite].max()) if finite.any() else math.nan,
            "worst_channel": int(torch.where(finite, abs_lag, -1.0).argmax()) if finite.any() else -1,
            "channels_above_1_sigma": int((abs_lag[finite] > 1.0).sum()),
        }
        return line, channels

    def _stale(self, record: MonitorRecord) -> bool:
        return (self.thresholds.crossed(record.mode_gap, record.worst_median_lag_sigma)
                or bool(record.nonfinite.running_statistics))

    def _rotation_text(self, record: MonitorRecord) -> str:
        """The summary's rotation: the median over paired layers, how many of the layers they are when some are
        unpaired, and that nothing is measured when none is."""
        paired, total = len(self.pairing.pairs), len(self.layers)
        if not paired:
            return "rotation: no layer paired (monitor.pairing)"
        rot = record.layers["rotation_deg_per_100"]
        if not rot.notna().any():
            return ""
        share = f" ({paired} of {total} layers paired)" if paired < total else ""
        return f"rotation {rot.median():.2f}°/100 steps{share}"

    def _summary(self, record: MonitorRecord) -> str:
        c = record.checks.iloc[0]
        if not math.isnan(c["acc_train_mode"]):
            modes = f"train {c['acc_train_mode']:.1%} / eval {c['acc_eval_mode']:.1%}"
        elif not math.isnan(c["mode_agreement"]):
            modes = f"modes agree {c['mode_agreement']:.1%}"
        else:
            modes = ""
        rot_text = self._rotation_text(record)
        lag = record.layers.dropna(subset=["lag_median_abs_sigma"])
        lag_text = ""
        if len(lag):
            top = lag.loc[lag["lag_median_abs_sigma"].idxmax()]
            lag_text = (f"lag median {top['lag_median_abs_sigma']:.2f}σ in {top['norm_layer']}, "
                        f"max {lag['lag_max_abs_sigma'].max():.2f}σ")
        bad = f"NON-FINITE {record.nonfinite}" if record.nonfinite else ""
        text = " | ".join(t for t in (bad, modes, rot_text, lag_text) if t)
        warming_up = record.step < self.warmup_steps and not record.nonfinite
        return ("STALE " if record.stale and not warming_up else "") + text
