"""The monitor on timm architectures nobody here wrote (random weights, no downloads): pairing, invariance, lag.

For each model of :data:`ZOO`: every BatchNorm layer with running statistics is paired or unpaired, and the
pairing is checked by an oracle of its own meaning: scaling each paired weight layer's output channel c by a
known factor scales its norm layer's input channel c by that factor and changes nothing else a norm layer
sees (scale invariance, which is why rotation is measured); each unpaired layer's reason names the operation
that really produced its input (recorded by a small function mode of this file). Building the monitor and
each call leave every parameter, buffer (``num_batches_tracked`` included), flag and random stream as they
were; the lag equals one computed from forward hooks on an independent copy.

``python tests/test_zoo.py`` rewrites the per-model table in ``docs/pairing.md`` (:func:`zoo_table`);
``test_the_published_table_is_the_zoos`` fails when it is stale.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))  # as a script: the helpers beside it

from bnrotation.bnstats import NORM_LAYER_KINDS, running_stat_layers  # noqa: E402
from bnrotation.monitor import MonitorSetupWarning, StalenessMonitor  # noqa: E402
from bnrotation.pairing import CAT_OPS, SEE_THROUGH_OPS, WEIGHT_LAYERS, _op_name  # noqa: E402
from bnrotation.probes import rotation_deg  # noqa: E402
from test_monitor import (assert_pairs_by_scaling, assert_unchanged, batch_statistics_copy,  # noqa: E402
                          everything, norm_inputs)
from thirdparty import import_timm  # noqa: E402

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "pairing.md"
BEGIN, END = "<!-- zoo table: python tests/test_zoo.py -->", "<!-- end of zoo table -->"
PAIRED_SHARE = 0.95  # of all the zoo's BatchNorm layers, at least this share is paired (docs/pairing.md says it)

# timm name -> (input size, create_model keywords): small variants at the smallest input they take.
ZOO: dict[str, tuple[int, dict]] = {
    "resnet18": (32, {}),
    "resnet10t": (32, {}),
    "mobilenetv2_050": (32, {}),
    "mobilenetv3_small_100": (32, {}),
    "efficientnet_b0": (32, {}),
    "tinynet_e": (32, {}),
    "regnetx_002": (32, {}),
    "densenet121": (32, {}),
    "ghostnet_050": (32, {}),
    "mnasnet_050": (32, {}),
    "spnasnet_100": (32, {}),
    "mixnet_s": (32, {}),
    "lcnet_050": (32, {}),
    "rexnet_100": (32, {}),
    "dla46_c": (32, {}),
    "cspresnet50": (32, {}),
    "dpn68": (32, {}),
    "hrnet_w18_small": (32, {}),
    "inception_v3": (75, {}),  # its stem needs 75x75
    "xception41": (32, {}),
    "repvgg_a0": (32, {}),
    "vgg11_bn": (32, {"mlp_ratio": 1 / 64}),  # the 7x7 head conv at 64 channels, not 4096; fx cannot trace it
    "levit_128s": (32, {"img_size": 32}),  # attention biases sized for the input
}
# The per-model tests record each model's pairing (PAIRINGS), and the two tests of the whole zoo read them: one
# worker runs the file, so that no model is built and paired twice.
pytestmark = pytest.mark.xdist_group("test_zoo")

SAMPLES = 4
PAIRINGS: dict[str, tuple[int, object]] = {}  # name -> (BatchNorm layers, monitor.pairing), filled by the tests


def build(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model with random weights (seeded), its running statistics moved off their initial values by two
    training-mode passes, in training mode; and a labelled probe of :data:`SAMPLES` samples."""
    timm = import_timm()
    size, kwargs = ZOO[name]
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
    x = torch.randn(SAMPLES, 3, size, size)
    model.train()
    with torch.no_grad():
        for i in range(2):
            model(x * (1 + 0.2 * i) + 0.3 * torch.randn_like(x))
    return model, x, torch.arange(SAMPLES) % 10


class Producers(TorchFunctionMode):
    """What produced each tensor of a forward pass: ``{id: [(operation, id of its first tensor argument), ...]}``,
    latest last (an in-place operation adds to its argument's list); module outputs of fx's leaves (norm and
    weight layers) are recorded as ``(module class, None)`` by forward hooks."""

    def __init__(self):
        super().__init__()
        self.made: dict[int, list[tuple[str, int | None]]] = {}
        self.parts: dict[int, list[tuple[int, int]]] = {}  # a concatenation along dim 1: [(id, channels)]
        self.alive: list[torch.Tensor] = []  # no id reused during the pass

    def record(self, out: torch.Tensor, op: str, first: int | None) -> None:
        self.alive.append(out)
        self.made.setdefault(id(out), []).append((op, first))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            first = args[0] if args and isinstance(args[0], torch.Tensor) else None
            self.record(out, _op_name(func), id(first) if first is not None else None)
            dim = args[1] if len(args) > 1 else (kwargs or {}).get("dim", 0)
            if _op_name(func) in CAT_OPS and isinstance(args[0], (list, tuple)) and dim % out.dim() == 1:
                self.alive += list(args[0])
                self.parts[id(out)] = [(id(t), t.shape[1]) for t in args[0]]
        return out


def producers_of_norm_inputs(model: nn.Module, x: torch.Tensor) -> tuple[dict[str, list[str]],
                                                                         dict[str, dict[int, list[str]]]]:
    """``{BatchNorm layer: [operations and modules upstream of its input, nearest first]}``, walked back while
    the operation is one the pairing sees through; and where that walk ends at a concatenation along the
    channel dim, ``{BatchNorm layer: {first channel of each part: the same walk from that part}}``."""
    mode = Producers()
    chains: dict[str, list[str]] = {}
    parts: dict[str, dict[int, list[str]]] = {}

    def walk(t: int) -> tuple[list[str], int]:
        chain, history = [], list(mode.made.get(t, []))
        while history:
            op, first = history.pop()
            chain.append(op)
            if op in CAT_OPS and len(mode.parts.get(t, ())) == 1:  # a cat of one tensor: that tensor
                t = mode.parts[t][0][0]
                history = list(mode.made.get(t, []))
                continue
            if op not in SEE_THROUGH_OPS or first is None:
                break
            if first != t:  # not in place: continue with the argument's own history
                t, history = first, list(mode.made.get(first, []))
        return chain, t

    def pre(mod, inp, name):
        chains[name], last = walk(id(inp[0]))
        if last in mode.parts and chains[name][-1:] and chains[name][-1] in CAT_OPS:
            start, parts[name] = 0, {}
            for t, size in mode.parts[last]:
                parts[name][start] = walk(t)[0]
                start += size

    hooks = [m.register_forward_pre_hook(lambda mod, inp, n=n: pre(mod, inp, n))
             for n, m in model.named_modules() if isinstance(m, _BatchNorm)]
    hooks += [m.register_forward_hook(lambda mod, inp, out: mode.record(out, type(mod).__name__, None))
              for m in model.modules() if isinstance(m, NORM_LAYER_KINDS + WEIGHT_LAYERS)]  # fx's leaves
    with torch.no_grad(), mode:
        model(x)
    for h in hooks:
        h.remove()
    return chains, parts


@pytest.mark.parametrize("name", list(ZOO))
def test_the_monitor_on_a_timm_model(name):
    model, x, y = build(name)
    bn = [n for n, _ in running_stat_layers(model)]
    before = everything(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = StalenessMonitor(model, (x, y), warn=False, warmup_steps=0)
    assert_unchanged(before, everything(model))  # construction: num_batches_tracked included
    pairing = monitor.pairing
    PAIRINGS[name] = (len(bn), pairing)
    assert sorted(p.norm for p in pairing.pairs + pairing.unpaired) == sorted(bn)  # each layer exactly once
    setup = [str(w.message) for w in caught if issubclass(w.category, MonitorSetupWarning) and "unpaired" in
             str(w.message)]
    if pairing.unpaired:  # one short warning counts the unpaired layers by reason, naming a few of each
        reasons = Counter(p.reason for p in pairing.unpaired)
        assert len(setup) == 1 and setup[0].startswith(f"{len(pairing.unpaired)} of {len(bn)} normalisation layer(s)")
        assert all(f"{n} layer{'s' * (n > 1)}: {reason}"[:150] in setup[0] for reason, n in reasons.items()), setup[0]
        assert max(len(line) for line in setup[0].splitlines()) <= 200, setup[0]
    else:
        assert not setup

    monitor(1)
    then = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, WEIGHT_LAYERS)}
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # the weights move between calls, as in training: each by 5% of its size, at random
        for p in model.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))
    after_move = everything(model)
    record = monitor(2)
    assert_unchanged(after_move, everything(model))

    # The rotation of each paired channel, per segment, against the angle of the weight row that feeds it.
    modules = dict(model.named_modules())
    rotation = record.channels.set_index(["norm_layer", "channel"])[["layer", "rotation_deg"]]
    for pair in pairing.pairs:
        spans = pair.spans(modules[pair.norm].num_features)
        want = torch.cat([rotation_deg(then[s.weight], modules[s.weight].weight)[s.offset:s.offset + s.stop - s.start]
                          for s in spans])
        got = rotation.loc[pair.norm].sort_index()
        assert got["layer"].tolist() == [s.weight for s in spans for _ in range(s.start, s.stop)], pair.norm
        assert torch.equal(torch.tensor(got["rotation_deg"].to_numpy()), want), pair.norm  # the same arithmetic

    # The lag against forward hooks on an independent copy: float64 moments of each layer's float32 input.
    # The monitor reduces in float32 around the mean (1e-6 σ, tests/test_probes.py), so 1e-4 in σ is loose.
    twin = batch_statistics_copy(model)
    inputs = norm_inputs(twin, x)
    lag = record.channels.set_index(["norm_layer", "channel"])["lag_sigma"]
    for n, m in running_stat_layers(model):
        (z,) = inputs[n][-1:]  # a layer called more than once: the statistics of its last call
        z = z.double()
        dims = [0, *range(2, z.dim())]
        want = (m.running_mean.double() - z.mean(dims)) / (z.var(dims, unbiased=True) + m.eps).sqrt()
        got = torch.tensor(lag.loc[n].sort_index().to_numpy())
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True), n

    # Pairs, segment by segment, by scale invariance (exact: see assert_pairs_by_scaling).
    assert_pairs_by_scaling(model, x, pairing.pairs)

    # Unpaired layers: the reason names what produced the input.
    chains, parts = producers_of_norm_inputs(twin, x)
    for p in pairing.unpaired:
        named = re.match(r"its input comes from (\S+?),", p.reason)
        segment = re.match(r"its channels \[(\d+), \d+\) come from (\S+?),", p.reason)
        if named:  # fx reads `y += z` as add, a function mode sees add_: compared without the in-place mark
            assert named.group(1).rstrip("_") in [op.rstrip("_") for op in chains[p.norm]], (p, chains[p.norm])
        elif segment:  # what produced that part of the concatenation
            chain = parts[p.norm][int(segment.group(1))]
            assert segment.group(2).rstrip("_") in [op.rstrip("_") for op in chain], (p, chain)
        else:
            assert p.reason.startswith("called ") and len(inputs[p.norm]) > 1, p


def zoo_rows() -> list[tuple[str, int, int, str]]:
    """``(model, BatchNorm layers, paired, unpaired with reasons)`` per :data:`ZOO` model: the pairings the
    tests recorded, or built here."""
    rows = []
    for name in ZOO:
        if name not in PAIRINGS:
            model, x, y = build(name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MonitorSetupWarning)
                PAIRINGS[name] = (len(running_stat_layers(model)), StalenessMonitor(model, (x, y)).pairing)
        n, pairing = PAIRINGS[name]
        reasons: dict[str, int] = {}
        for p in pairing.unpaired:
            reasons[p.reason] = reasons.get(p.reason, 0) + 1
        text = "; ".join(f"{k} ({v})" for k, v in reasons.items()) or "none"
        via = sum(1 for v in pairing.via.values() if v)
        how = pairing.method + (f", {via} through see-through operations" if via else "")
        rows.append((name, n, len(pairing.pairs), f"{how}; unpaired: {text}"))
    return rows


def zoo_table() -> str:
    """The Markdown table of :func:`zoo_rows`, with the total."""
    rows = zoo_rows()
    lines = ["| model | BatchNorm layers | paired | how, and the unpaired with their reasons (count) |",
             "|---|---:|---:|---|"]
    lines += [f"| `{name}` | {n} | {paired} | {text} |" for name, n, paired, text in rows]
    total, paired = sum(r[1] for r in rows), sum(r[2] for r in rows)
    lines.append(f"| all {len(rows)} | {total} | {paired} ({paired / total:.1%}) | |")
    return "\n".join(lines)


def published_table() -> str:
    text = DOC.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()


def test_the_densenet121_construction_warnings_are_short_and_name_every_reason():
    """timm's densenet121 leaves 7 of its 121 BatchNorm layers unpaired, for 2 reasons; with every momentum set to
    TensorFlow's 0.99 and two to 0, the lint finds a setting on each of them, under 2 rules. Each construction
    warning must stay readable: a short first line with the counts, a few example layers per reason or rule with
    "… and N more", and where the full list is. So: no line over 200 characters, under 2,000 in all, and every
    distinct reason and rule named, with its count."""
    timm = import_timm()
    torch.manual_seed(0)
    model = timm.create_model("densenet121", pretrained=False, num_classes=10)
    norms = [m for _, m in running_stat_layers(model)]
    for m in norms:
        m.momentum = 0.99
    norms[5].momentum = norms[40].momentum = 0.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = StalenessMonitor(model, torch.randn(2, 3, 32, 32), warn=False)
    setup = [str(w.message) for w in caught if issubclass(w.category, MonitorSetupWarning)]
    (unpaired,) = [t for t in setup if "left unpaired" in t]
    (settings,) = [t for t in setup if t.startswith("BatchNorm settings")]
    for text in setup:
        assert max(len(line) for line in text.splitlines()) <= 200, text
        assert len(text) <= 2000, text
    reasons = Counter(p.reason for p in monitor.pairing.unpaired)
    assert len(monitor.pairing.unpaired) == 7 and len(reasons) == 2
    assert unpaired.splitlines()[0].startswith("7 of 121 normalisation layer(s) left unpaired")
    for reason, count in reasons.items():
        assert f"{count} layer{'s' * (count > 1)}: {reason}" in unpaired, (reason, unpaired)
    assert re.search(r"… and \d+ more", unpaired) and "monitor.pairing" in unpaired and "docs/pairing.md" in unpaired
    rules = Counter(f.rule for f in monitor.findings)
    assert rules == {"momentum-inverted": 119, "momentum-zero": 2}
    assert settings.splitlines()[0].startswith("BatchNorm settings: 121 finding(s)"), settings
    for rule, count in rules.items():
        assert f"[{rule}] {count} layer{'s' * (count > 1)}" in settings, (rule, settings)
    assert re.search(r"… and \d+ more", settings) and "monitor.findings" in settings


@pytest.mark.parametrize("_", [None])
def test_the_published_table_is_the_zoos(_):
    """Runs after the per-model tests (which fill PAIRINGS); recomputes any model they did not run."""
    import_timm()
    assert published_table() == zoo_table(), "docs/pairing.md is stale: python tests/test_zoo.py rewrites it"


def test_at_least_95_percent_of_the_zoos_batchnorm_layers_are_paired():
    """Of all the zoo's BatchNorm layers, at least :data:`PAIRED_SHARE` are paired, those after a concatenation of
    several weight layers' outputs (DenseNet, MixNet) per channel segment."""
    zoo_rows()  # fills PAIRINGS for any model the per-model tests did not run
    total = sum(n for n, _ in PAIRINGS.values())
    paired = sum(len(p.pairs) for _, p in PAIRINGS.values())
    assert paired / total >= PAIRED_SHARE, (paired, total)


if __name__ == "__main__":
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + zoo_table() + "\n" + text[end:])
    print(f"wrote the zoo table of {len(ZOO)} models to {DOC}")
