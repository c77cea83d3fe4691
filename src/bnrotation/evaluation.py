"""How evaluation-mode forward passes run: in chunks on a CPU, and compiled when the caller hands them a
:class:`CompiledEvaluation` (no switch that reaches a pass it was not given to).

An evaluation-mode output is per sample (running statistics, no batch statistics), so neither the chunking
nor the compiled graph changes what a pass computes beyond the order of floating-point sums; the accuracy
(:func:`bnrotation.probes.accuracy`), the monitor's mode check, the interventions and the averaged models
all evaluate through here. Whether a run compiles is :func:`bnrotation.study.runtime.evaluation_compiled`'s
decision, and the runner passes its :class:`CompiledEvaluation` to each of them.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
import torch.nn as nn

__all__ = ["without_autocast", "EVAL_CHUNK", "EVAL_CHUNK_BYTES", "eval_chunk", "CompiledEvaluation",
           "compiled_evaluation", "evaluation_call", "evaluation_mode", "evaluation_forward", "LOGITS_KEY",
           "read_logits", "model_logits", "logits_note"]

# The entry of a model's output that holds its logits: what Hugging Face models return them under, in a ModelOutput
LOGITS_KEY = "logits"


# Held-out samples per evaluation-mode forward pass on a CPU (checks, interventions, averaging): small chunks
# keep the activations in cache, where 1,000 at a time do not; `make bench` times the chunk sizes on both
# networks (results/bench.md, "chunk size"). On a GPU the whole set goes in one pass.
EVAL_CHUNK = 64

# The most bytes a chunk's largest activation may take when a chunk grows past EVAL_CHUNK (:func:`eval_chunk`): the
# study's network's at EVAL_CHUNK (its first convolution's output, 32 channels of 32x32 float32 per sample), the
# chunk `make bench`, section (c), found fastest for it.
EVAL_CHUNK_BYTES = 8 << 20


def eval_chunk(device: torch.device, n: int, weight_bytes: int = 0, sample_bytes: int = 0) -> int:
    """Samples per evaluation-mode forward pass: all ``n`` at once on a GPU; on a CPU ``EVAL_CHUNK``, doubled
    while the model's weights (``weight_bytes``: every chunk reads them once) outweigh the chunk's largest
    activation (``sample_bytes`` per sample) and the doubled chunk's largest activation stays within
    :data:`EVAL_CHUNK_BYTES`. Without those facts (the default), ``EVAL_CHUNK``.

    On the suite's two networks (0.2 and 1 MiB of weights, largest activations of 128 and 64 KiB per sample) the
    chunk stays ``EVAL_CHUNK``; on timm's ``resnet18`` at 32x32 (43 MiB, 64 KiB) it is 128, which `make bench`
    measured faster than 64 (and than 256 or one pass) on a CPU, where every chunk of 64 read the weights again.
    Evaluation-mode outputs are per sample, so the accuracy does not depend on it.
    """
    if device.type == "cuda":
        return n
    chunk = EVAL_CHUNK
    if sample_bytes > 0:
        while chunk < n and weight_bytes > chunk * sample_bytes and 2 * chunk * sample_bytes <= EVAL_CHUNK_BYTES:
            chunk *= 2
    return min(chunk, n)


# ----------------------------------------------------------------------------- what a model returns
def read_logits(output) -> torch.Tensor:
    """The logits (N, classes, ...) in a model's output: the output itself when it is a tensor, else its
    :data:`LOGITS_KEY` entry when it is a mapping that holds a tensor there (a transformers ``ModelOutput``, such
    as ``ImageClassifierOutputWithNoAttention``, is one). Every pass that reads a model's predictions (the
    monitor's mode check in both modes, the checkpoint check, :func:`.probes.accuracy`) reads them through here.

    Raises:
        TypeError: for any other output (a tuple, a mapping without ``'logits'``, ...), in one line naming the
            fix: a wrapper that returns the logits, such as
            :class:`bnrotation.integrations.transformers.ModelLogits`.
    """
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get(LOGITS_KEY), torch.Tensor):
        return output[LOGITS_KEY]
    got = _a(type(output).__name__)
    if isinstance(output, Mapping):
        got += f" without a tensor under {LOGITS_KEY!r} (keys: {', '.join(map(repr, output))})"
    raise TypeError(f"the model returns {got}; the predictions are read from a tensor (N, classes, ...) or from the "
                    f"{LOGITS_KEY!r} of a mapping or transformers ModelOutput. Wrap the model so that it returns its "
                    "logits: bnrotation.integrations.transformers.ModelLogits(model, input_key, logits_key) calls "
                    "model(**{input_key: x}) and returns output[logits_key], or output[0] of a tuple")


def logits_note(output) -> str:
    """``""`` for a tensor output; else one line saying that its logits were read (:func:`read_logits`), naming
    the output's type: what the monitor and the check tell the user once."""
    if isinstance(output, torch.Tensor):
        return ""
    return f"the model returns {_a(type(output).__name__)}: its {LOGITS_KEY!r} (N, classes) are read as its predictions"


def _a(name: str) -> str:
    """``name`` after its indefinite article: ``a tuple``, ``an ImageClassifierOutput``."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def model_logits(model: Callable, x) -> torch.Tensor:
    """``model(x)``'s logits (:func:`read_logits`): a mapping ``x`` is passed whole as the one argument.

    Raises:
        TypeError: as :func:`read_logits`.
    """
    return read_logits(model(x))


class CompiledEvaluation:
    """Evaluation-mode forward passes through one ``torch.compile``d graph per network structure.

    The graph is of ``torch.func.functional_call(template, state, x)``: the network's parameters and buffers
    are its inputs, so every model of the same structure and memory format (the live model, its averaged
    copies, a copy with fresh statistics swapped in) runs through the same compiled graph, with no
    recompilation; each chunk size compiles once (``dynamic=False``). The template is a copy of the first
    such model in evaluation mode, kept per ``repr`` (which holds every layer's shape, ε and momentum).

    `make bench`, section (d) (``results/bench.md``), times a chunked evaluation pass compiled against eager
    execution, the compile itself, and how far the outputs differ. If the compiler fails, it warns once and
    runs eagerly from then on.
    """

    def __init__(self) -> None:
        self.templates: dict[str, nn.Module] = {}
        self.failed: str | None = None
        self.fn = torch.compile(self._forward, dynamic=False)

    @staticmethod
    def _forward(template: nn.Module, state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(template, state, (x,))

    def forward(self, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x (N, ...) -> model's output`` in evaluation mode, for a model already in evaluation mode."""
        if self.failed:
            return model
        key = repr(model)
        if key not in self.templates:
            self.templates[key] = copy.deepcopy(model).eval()
        template = self.templates[key]
        state = {**dict(model.named_parameters()), **dict(model.named_buffers())}

        def call(x: torch.Tensor) -> torch.Tensor:
            if self.failed:
                return model(x)
            try:
                return self.fn(template, state, x)
            except Exception as err:  # noqa: BLE001 - a compiler that cannot run here: eager from now on
                self.failed = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
                warnings.warn(f"compiled evaluation failed ({self.failed}); evaluating eagerly from now on",
                              RuntimeWarning, stacklevel=2)
                return model(x)

        return call


@contextmanager
def compiled_evaluation(enabled: bool = True) -> Iterator[CompiledEvaluation | None]:
    """A :class:`CompiledEvaluation` for the block (None when not ``enabled``), handed by the caller to each pass
    that is to run compiled (:func:`evaluation_forward`'s and :func:`.probes.accuracy`'s ``compiled``,
    :class:`.monitor.StalenessMonitor`'s); no pass is compiled unless given it. On exit the compiled graphs are
    dropped (``torch.compiler.reset``), so that a process running many runs never reaches the recompile limit.
    Where torch caches compiled code on disk is the caller's choice (the study's runner:
    :func:`bnrotation.study.provenance.compile_cache_per_kernel_path`)."""
    compiled = CompiledEvaluation() if enabled else None
    try:
        yield compiled
    finally:
        if compiled is not None:
            torch.compiler.reset()


def evaluation_call(model: nn.Module, compiled: CompiledEvaluation | None = None
                    ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The callable an evaluation-mode pass uses: through ``compiled`` when given, else the model."""
    return compiled.forward(model) if compiled is not None else model


@contextmanager
def without_autocast(model: nn.Module) -> Iterator[None]:
    """Autocast off inside the block, on the CPU and on every device type ``model``'s parameters live on, so that a
    measurement called inside a caller's ``torch.autocast(...)`` (mixed-precision training) runs in the model's
    own dtype (float32 for a float32 model) rather than in bfloat16 or float16, whose rounding moves a lag by a
    sizeable share of its threshold. A model whose parameters are themselves half precision stays so."""
    types = {"cpu"} | {p.device.type for p in model.parameters()}
    # a device type without autocast (meta, an older torch's mps) has no context to leave
    available = getattr(torch.amp.autocast_mode, "is_autocast_available", lambda t: t in ("cpu", "cuda"))
    with contextlib.ExitStack() as stack:
        for t in sorted(types):
            if not available(t) or (t == "cuda" and not torch.cuda.is_available()):
                continue
            stack.enter_context(torch.autocast(device_type=t, enabled=False))
        yield


@contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model.eval()`` inside the block; every module's training flag is restored after, also on an error."""
    flags = {m: m.training for m in model.modules()}
    try:
        yield model.eval()
    finally:
        for m, f in flags.items():
            m.training = f


def evaluation_forward(model: nn.Module, x: torch.Tensor, chunk: int | None = None,
                       compiled: CompiledEvaluation | None = None) -> torch.Tensor:
    """The model's logits on ``x`` (N, ...) in evaluation mode (running statistics), flags restored after
    (:func:`evaluation_mode`). In chunks of ``chunk`` samples, by default :func:`eval_chunk`'s (on a CPU
    :data:`EVAL_CHUNK`): each sample's output is its own in evaluation mode, and small chunks stay in cache
    (`make bench`, section (c)). Through ``compiled`` when given (:class:`CompiledEvaluation`), else eagerly. A
    mapping ``x`` (a model that reads its input's keys) goes through in one pass. What the model returns is read as
    its logits (:func:`read_logits`), chunk by chunk.

    Raises:
        TypeError: as :func:`read_logits`.
    """
    with evaluation_mode(model):
        forward = evaluation_call(model, compiled)
        if not isinstance(x, torch.Tensor):
            return model_logits(forward, x)  # a mapping the model reads whole: one pass
        chunk = eval_chunk(x.device, len(x)) if chunk is None else max(1, min(chunk, len(x)))
        if chunk >= len(x):
            return model_logits(forward, x)
        return torch.cat([model_logits(forward, c) for c in x.split(chunk)])
