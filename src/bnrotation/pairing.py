"""Which weight layer each normalisation layer normalises the output of: the pairing the staleness monitor
(:mod:`bnrotation.monitor`), the settings lint (:mod:`bnrotation.lint`) and the check build on. ``torch.fx`` traces
with normalisation and weight layers of any package kept as leaves (:class:`NormLeafTracer`); a layer it cannot
place is placed by execution order (a ``TorchFunctionMode`` that follows each channel's provenance); shape-only
operations that keep the channel axis are seen through (:func:`channel_axis_after`); a BatchNorm after a
concatenation is paired per channel segment (:class:`Segment`). Nothing here changes the model: every buffer is
put back after a probe pass."""


from __future__ import annotations

import io
import math
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from .batches import sample_count
from .bnstats import NORM_LAYER_KINDS, batch_statistics, norm_layers, running_stat_layers

__all__ = ["find_pairs", "Pairing", "NormPair", "Segment", "NormLeafTracer", "channel_axis_after", "WEIGHT_LAYERS"]

# Layers whose weight rows are output channels: what a normalisation layer directly downstream normalises.
WEIGHT_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)

# A construction warning stays short however large the model: a few example layers per reason, lines of at most
# about this many characters, at most this many reasons (the full list is in Pairing.describe()).
EXAMPLE_LAYERS, TEXT_WIDTH, SHOWN_REASONS = 3, 160, 5


def examples(names: list[str], limit: int = EXAMPLE_LAYERS, width: int = TEXT_WIDTH) -> str:
    """``a, b, c … and 4 more``: the first of ``names``, at most ``limit`` of them and as many as fit in about
    ``width`` characters (at least one), for a warning that must stay short whatever the model's size."""
    shown: list[str] = []
    for name in names[:limit]:
        if shown and len(", ".join(shown + [name])) > width - len(" … and 9999 more"):
            break
        shown.append(name)
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" … and {rest} more" if rest else "")


def _cut(text: str, width: int = TEXT_WIDTH) -> str:
    """``text`` cut to ``width`` characters, ending in "…" when cut."""
    return text if len(text) <= width else text[:width - 1] + "…"



def rng_devices(model: nn.Module) -> list[int]:
    """The CUDA devices ``model``'s parameters live on: the random streams a probe pass must leave as it found."""
    return sorted({t.device.index or 0 for t in model.parameters() if t.device.type == "cuda"})


@contextmanager
def buffers_kept(model: nn.Module):
    """Every buffer of ``model`` (running statistics, ``num_batches_tracked``, any other) is put back as it was
    on exit, whatever ran inside: a trace or a pass through third-party layers that write their buffers."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:  # through .data: no version bump (bnstats.batch_statistics says why)
                b.data.copy_(v)


def probe_head(x, n: int):
    """The first ``n`` samples of probe inputs: of a tensor, or of every tensor of a mapping that has one
    value per sample (other values as they are)."""
    if isinstance(x, torch.Tensor):
        return x[:n]
    total = sample_count(x)
    return {k: v[:n] if isinstance(v, torch.Tensor) and v.dim() > 0 and len(v) == total else v
            for k, v in x.items()}


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

    def unpaired_text(self) -> str:
        """The unpaired layers in a few short lines, for a warning or a log ("" when every layer is paired): how many
        of how many layers, for how many reasons; then per reason (in forward order of its first layer, at most
        :data:`SHOWN_REASONS`) its count and text, and a few of its layers ("… and N more"); last, where every layer
        and its reason are (:meth:`describe`) and what each reason means (``docs/pairing.md``). No line is much over
        :data:`TEXT_WIDTH` characters, whatever the model's size."""
        if not self.unpaired:
            return ""
        groups: dict[str, list[str]] = {}
        for p in self.unpaired:
            groups.setdefault(p.reason, []).append(p.norm)
        total = len(self.pairs) + len(self.unpaired)
        lines = [f"{len(self.unpaired)} of {total} normalisation layer(s) left unpaired, for {len(groups)} "
                 f"reason{'s' * (len(groups) > 1)} (their lag is measured, their rotation is not):"]
        for reason, norms in list(groups.items())[:SHOWN_REASONS]:
            lines += [_cut(f"  {len(norms)} layer{'s' * (len(norms) > 1)}: {reason}"), f"    {examples(norms)}"]
        if len(groups) > SHOWN_REASONS:
            hidden = sum(len(n) for n in list(groups.values())[SHOWN_REASONS:])
            lines.append(f"  … and {len(groups) - SHOWN_REASONS} more reasons, {hidden} layers")
        lines.append("Every layer and its reason: monitor.pairing.describe(); what each reason means: docs/pairing.md "
                     "('Reading monitor.pairing').")
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
                ShapeProp(module).propagate(probe_head(x, 2))
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
    head = probe_head(x, 2)  # outside the mode: the model's input, not a slice it saw made
    try:
        with torch.no_grad(), batch_statistics(model), mode:
            model(head)  # a mapping goes whole, as the one argument
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
    with buffers_kept(model), torch.random.fork_rng(devices=rng_devices(model)):
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

