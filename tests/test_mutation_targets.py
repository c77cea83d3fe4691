"""The second case, beyond issue 40's ten: what the docstrings of the pure-logic modules promise (pairing, lint,
refresh, the claim kinds' judges, the check's input readers) at a boundary, on a second layer or call, in a mode
other than the default, and on the failing side. Properties over many cases are drawn by ``hypothesis``. These are
the tests ``make mutants`` runs (with the others that cover the modules); each is CPU-cheap: toy shapes, no
training."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bnrotation.study.analysis.claims import kinds, registry
from bnrotation.study.analysis.claims.kinds import (FAIL, MEASURED, NOT_JUDGED, NOT_RUN, PASS, Check, Gap, Match,
                                              NotBelowBy, Rank, Share, match_tolerance, withhold_verdicts)
from bnrotation.study.analysis.stats import SeedStat
from bnrotation.study.article import Figure
from bnrotation.bnstats import reestimate
from bnrotation.check import (CheckInputError, load_batches, load_function, load_weights, parse_device,
                              parse_model_kwargs)
from bnrotation.lint import RULES, Finding, findings_line, lint_batchnorm
from bnrotation.pairing import NormPair, Pairing, Segment, channel_axis_after, find_pairs
from bnrotation.refresh import reestimate_if_stale
from test_claims import evidence

torch.set_num_threads(1)
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EPS = 1e-6  # relative step across a boundary; the float64 arithmetic rounds some 1e-16 relative


# ----------------------------------------------------------------------------- pairing: any Sequential of pieces
# The see-through rule (docs/pairing.md): an elementwise ReLU, LeakyReLU, identity or dropout, and pooling, keep each
# channel apart and are positively homogeneous in it; SiLU, GELU and a sigmoid are not; a BatchNorm's output is not
# a weight layer's.
SEEN_THROUGH = {"relu": nn.ReLU, "leaky": lambda: nn.LeakyReLU(0.1), "identity": nn.Identity,
                "dropout": lambda: nn.Dropout(0.0), "maxpool": lambda: nn.MaxPool2d(1), "avgpool": lambda: nn.AvgPool2d(1)}
MIXING = {"silu": nn.SiLU, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}
PIECES = ["conv", "bn", *SEEN_THROUGH, *MIXING]


class Untraceable(nn.Module):
    """``body`` behind data-dependent control flow, which fx cannot trace: paired by execution order."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        if bool(x.sum() > -1e30):
            x = x * 1.0
        return self.body(x)


def _expected(pieces: list[str]) -> tuple[dict[str, str], set[str]]:
    """``{bn: conv}`` and the unpaired BatchNorms, by the rule: the last convolution with only see-through pieces
    between it and the BatchNorm."""
    pairs, unpaired, source = {}, set(), None
    for i, piece in enumerate(pieces):
        if piece == "conv":
            source = str(i)
        elif piece == "bn":
            if source is None:
                unpaired.add(str(i))
            else:
                pairs[str(i)] = source
            source = None
        elif piece in MIXING:
            source = None
    return pairs, unpaired


@FEW
@given(rest=st.lists(st.sampled_from(PIECES), min_size=1, max_size=7), traceable=st.booleans())
def test_any_sequential_of_conv_bn_and_activations_is_paired_by_the_see_through_rule(rest, traceable):
    pieces = ["conv", *rest]
    torch.manual_seed(0)
    layers = [nn.Conv2d(3 if i == 0 else 4, 4, 1) if p == "conv" else nn.BatchNorm2d(4) if p == "bn"
              else (SEEN_THROUGH | MIXING)[p]() for i, p in enumerate(pieces)]
    body = nn.Sequential(*layers)
    model = body if traceable else Untraceable(body)
    prefix = "" if traceable else "body."
    x = torch.randn(2, 3, 3, 3)
    pairs, unpaired = _expected(pieces)
    if not pairs and not unpaired:
        with pytest.raises(ValueError, match="no BatchNorm layer with running statistics"):
            find_pairs(model, x)
        return
    pairing = find_pairs(model, x)
    assert {p.norm: p.weight for p in pairing.pairs} == {prefix + k: prefix + v for k, v in pairs.items()}
    assert {p.norm for p in pairing.unpaired} == {prefix + k for k in unpaired}
    assert all(p.reason for p in pairing.unpaired) and not any(p.reason for p in pairing.pairs)
    assert pairing.method == ("fx" if traceable else "execution order")


# ----------------------------------------------------------------------------- pairing: where the channel dim goes
def _channel_index(shape: tuple[int, ...], axis: int) -> torch.Tensor:
    """A tensor of ``shape`` whose every value is its index along ``axis``."""
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return torch.arange(shape[axis]).view(view).expand(shape).contiguous()


@st.composite
def reshapes(draw):
    """An input shape, its channel dim (of at least 2 channels), and an output shape of the same elements: a
    flatten of a run of dims, or a size-1 dim inserted or removed."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=2, max_size=4)))
    axis = draw(st.integers(0, len(shape) - 1))
    shape = shape[:axis] + (max(2, shape[axis]),) + shape[axis + 1:]
    kind = draw(st.sampled_from(["flatten", "unsqueeze", "squeeze"]))
    if kind == "flatten":
        start = draw(st.integers(0, len(shape) - 1))
        end = draw(st.integers(start, len(shape) - 1))
        out = shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]
    elif kind == "unsqueeze":
        at = draw(st.integers(0, len(shape)))
        out = shape[:at] + (1,) + shape[at:]
    else:
        out = tuple(s for s in shape if s != 1) or (1,)
    return shape, axis, out


@FEW
@given(case=reshapes())
def test_a_reshape_keeps_the_channel_dim_exactly_where_each_channels_values_stay_together(case):
    """Against an oracle: the output dim k holds the channels when the reshaped channel-index tensor is the index
    along k (row-major order kept each channel's values together); the first such dim, or None."""
    shape, axis, out = case
    moved = _channel_index(shape, axis).reshape(out)
    expected = next((k for k in range(len(out)) if out[k] == shape[axis]
                     and torch.equal(moved, _channel_index(out, k))), None)
    for op in ("reshape", "view", "flatten", "squeeze", "unsqueeze"):
        assert channel_axis_after(op, (), shape, out, axis) == expected, op


@FEW
@given(data=st.data(), ndim=st.integers(2, 5))
def test_a_permute_or_transpose_moves_the_channel_dim_where_the_permutation_sends_it(data, ndim):
    shape = tuple(data.draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    axis = data.draw(st.integers(0, ndim - 1))
    perm = data.draw(st.permutations(range(ndim)))
    t = torch.zeros(shape)
    out = tuple(t.permute(perm).shape)
    assert channel_axis_after("permute", (t, *perm), shape, out, axis) == perm.index(axis)
    assert channel_axis_after("permute", (t, perm), shape, out, axis) == perm.index(axis)  # one sequence argument
    d0, d1 = data.draw(st.integers(-ndim, ndim - 1)), data.draw(st.integers(-ndim, ndim - 1))
    swapped = {d0 % ndim: d1 % ndim, d1 % ndim: d0 % ndim}.get(axis, axis)
    for op in ("transpose", "swapaxes", "swapdims"):
        assert channel_axis_after(op, (t, d0, d1), shape, tuple(t.transpose(d0, d1).shape), axis) == swapped
    assert channel_axis_after("permute", (t, *perm[:-1]), shape, out, axis) is None or ndim == 1  # not a permutation
    assert channel_axis_after("permute", (t, *([0] * ndim)), shape, out, axis) is None


@pytest.mark.parametrize("op, in_shape, out_shape, axis, expected", [
    ("relu", (2, 4, 3), (2, 4, 3), 1, 1),
    ("relu", (2, 4, 3), (2, 4, 3), 2, 2),  # elementwise: any dim
    ("dropout", (2, 4), (2, 5), 1, None),  # an elementwise op that changed the shape: not one
    ("max_pool2d", (2, 4, 6, 6), (2, 4, 3, 3), 1, 1),
    ("adaptive_avg_pool1d", (2, 4, 6), (2, 4, 1), 1, 1),
    ("avg_pool2d", (2, 4, 6, 6), (2, 4, 3, 3), 2, None),  # pooling keeps only a channel dim 1
    ("max_pool1d", (4, 6), (4, 3), 1, None),  # ... of an input with dims after it
    ("max_pool2d", (2, 4, 6, 6), (2, 2, 3, 3), 1, None),  # ... and its size
    ("max_pool2d", (2, 4, 6, 6), (2, 4, 3), 1, None),  # ... and the number of dims
    ("silu", (2, 4), (2, 4), 1, None), ("add", (2, 4), (2, 4), 1, None), ("cat", (2, 4), (4, 4), 1, None),
    ("relu", (2, 4), (2, 4), 2, None), ("relu", (2, 4), (2, 4), -1, None),  # no such input dim
    ("relu", None, (2, 4), 1, None), ("relu", (2, 4), None, 1, None),  # no shapes
    ("flatten", (2, 4, 3, 3), (2, 36), 1, None), ("flatten", (2, 4, 1, 1), (2, 4), 1, 1),
    ("t", (3, 4), (4, 3), 0, 1),
])
def test_channel_axis_after_at_each_rule_and_its_failing_side(op, in_shape, out_shape, axis, expected):
    args = (torch.zeros(in_shape),) if op == "t" else ()
    assert channel_axis_after(op, args, in_shape, out_shape, axis) == expected


def test_a_normpair_spans_its_segments_or_says_which_channels_are_not_covered():
    seg = (Segment(0, 3, "a"), Segment(3, 5, "b", 2), Segment(5, 8, "a", 3))
    pair = NormPair("bn", "cat(a, b)", "", seg)
    assert pair.spans(8) == seg and pair.weights == ("a", "b")  # each weight once, in channel order
    assert NormPair("bn", "a").spans(6) == (Segment(0, 6, "a"),) and NormPair("bn", "a").weights == ("a",)
    assert NormPair("bn", None, "why").spans(6) == () and NormPair("bn", None, "why").weights == ()
    for bad, channels in (((Segment(1, 8, "a"),), 8), ((Segment(0, 7, "a"),), 8),
                          ((Segment(0, 3, "a"), Segment(4, 8, "b")), 8), (seg, 9)):
        with pytest.raises(ValueError, match=r"bn: the segments cover .*not the \d+ channels normalised"):
            NormPair("bn", "cat(a, b)", "", bad).spans(channels)


def test_a_torch_cat_along_the_channel_dim_with_a_keyword_or_a_negative_dim_is_paired_by_segments():
    class Cat(nn.Module):
        def __init__(self, how: str):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b, self.how = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 3, 1), how
            self.bn = nn.BatchNorm2d(5)

        def forward(self, x):
            a, b = self.a(x), self.b(x)
            y = {"dim": lambda: torch.cat([a, b], dim=1), "negative": lambda: torch.cat([a, b], -3),
                 "concat": lambda: torch.concat((a, b), 1)}[self.how]()
            return self.bn(y).mean((2, 3))

    for how in ("dim", "negative", "concat"):
        pairing = find_pairs(Cat(how), torch.randn(2, 3, 4, 4))
        (pair,) = pairing.pairs
        assert pair.weight == "cat(a, b)" and pair.segments == (Segment(0, 2, "a"), Segment(2, 5, "b")), how


# ----------------------------------------------------------------------------- lint: boundaries and second cases
def _bn_net(*norms: nn.Module) -> nn.Sequential:
    layers = []
    for i, bn in enumerate(norms):
        layers += [nn.Conv2d(3 if i == 0 else bn.num_features, bn.num_features, 1), bn]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("momentum, rule", [(0.49, None), (0.5, "momentum-inverted"), (1e-9, None),
                                            (0.0, "momentum-zero"), (0.1, None)])
@pytest.mark.parametrize("training", [True, False])
def test_momentum_rules_at_their_boundaries_in_either_mode(momentum, rule, training):
    """The momentum rules read the setting, not the mode: the same finding in training and evaluation mode."""
    net = _bn_net(nn.BatchNorm2d(4, momentum=momentum)).train(training)
    assert [f.rule for f in lint_batchnorm(net, torch.randn(2, 3, 2, 2))] == ([rule] if rule else [])


def test_the_second_layer_is_judged_too_and_findings_follow_named_modules_order():
    net = _bn_net(nn.BatchNorm2d(4), nn.BatchNorm2d(4, momentum=0.9), nn.BatchNorm2d(4, momentum=0.0))
    found = lint_batchnorm(net, torch.randn(2, 3, 2, 2))
    assert [(f.rule, f.layer) for f in found] == [("momentum-inverted", "3"), ("momentum-zero", "5")]
    assert str(found[0]) == f"3: [momentum-inverted] {found[0].message}"
    assert "PyTorch's 0.1" in found[0].message  # 1 - 0.9, TensorFlow's convention named


def test_untracked_layers_alone_give_no_finding_and_kept_buffers_are_told_apart():
    alone = _bn_net(nn.BatchNorm2d(4, track_running_stats=False))
    assert lint_batchnorm(alone) == []  # no layer tracks: nothing to mix with, no buffers kept
    kept = _bn_net(nn.BatchNorm2d(4))
    kept[1].track_running_stats = False  # switched off after construction: buffers kept
    assert [f.rule for f in lint_batchnorm(kept)] == ["untracked-kept-buffers"]
    mixed = _bn_net(nn.BatchNorm2d(4), nn.BatchNorm2d(4, track_running_stats=False))
    assert [(f.rule, f.layer) for f in lint_batchnorm(mixed, torch.randn(2, 3, 2, 2))] == [("untracked-mixed", "3")]


def test_the_frozen_rule_uses_a_given_pairing_and_skips_layers_it_left_unpaired():
    net = _bn_net(nn.BatchNorm2d(4), nn.BatchNorm2d(4)).train()
    for p in net.parameters():
        p.requires_grad_(False)
    given_pairs = Pairing([NormPair("3", "2")], [NormPair("1", None, "left out")], "fx")
    assert [(f.rule, f.layer) for f in lint_batchnorm(net, pairing=given_pairs)] == [
        ("frozen-weights-training-bn", "3")]
    assert [f.layer for f in lint_batchnorm(net.eval())] == []  # every layer in eval(): the rule has nothing
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module, got list"):
        lint_batchnorm([net])


def test_findings_line_groups_by_rule_in_rules_order_and_stays_short():
    assert findings_line([]) == ""
    found = [Finding("momentum-zero", f"l{i}", "momentum=0: never updated") for i in range(5)]
    found.insert(0, Finding("frozen-weights-training-bn", "f", "frozen but training"))
    text = findings_line(found).splitlines()
    assert text[0].startswith("BatchNorm settings: 6 finding(s) under 2 rule(s)")
    assert text[1] == "  [momentum-zero] 5 layers: l0, l1, l2 … and 2 more"  # RULES order, not the list's
    assert text[2] == "    l0: momentum=0: never updated"
    assert text[3] == "  [frozen-weights-training-bn] 1 layer: f"
    assert RULES.index("momentum-zero") < RULES.index("frozen-weights-training-bn")


# ----------------------------------------------------------------------------- refresh: a scope, a type, a summary
def test_reestimate_if_stale_refuses_an_unknown_scope_and_says_when_nothing_was_labelled():
    torch.manual_seed(0)
    net = _bn_net(nn.BatchNorm2d(4))
    head = nn.Sequential(net, nn.Flatten(), nn.Linear(4 * 2 * 2, 3))
    x = torch.randn(8, 3, 2, 2)
    with pytest.raises(ValueError, match=r"scope: expected one of model, layers, got 'all'"):
        reestimate_if_stale(head, [x], x, scope="all")
    result = reestimate_if_stale(head, [x], x)  # no labels: no accuracy in the summary
    assert "accuracy" not in result.summary and math.isnan(result.before.acc_eval_mode)
    # 8 samples cannot decide the gap: undetermined, which re-estimates too (it cannot rule staleness out)
    assert result.fired == (result.before.stale or bool(result.before.undetermined)) and result.scope == "model"


# ----------------------------------------------------------------------------- claim kinds: judged across the boundary
SPREAD = (-1.0, -1.0, 1.0, 1.0)  # 4 seeds at mean ± a: sample sd 2a/√3


def stat(mean: float, a: float, n: int = 4) -> SeedStat:
    return SeedStat.of([mean + d * a for d in SPREAD[:n]] if n == 4 else [mean + (i - (n - 1) / 2) * a
                                                                          for i in range(n)])


@FEW
@given(lower=st.floats(-10, 10), a_up=st.floats(1e-3, 1), a_low=st.floats(1e-3, 1))
def test_a_gap_passes_just_over_two_standard_errors_of_the_difference_and_fails_just_under(lower, a_up, a_low):
    se = math.sqrt((2 * a_up / math.sqrt(3)) ** 2 / 4 + (2 * a_low / math.sqrt(3)) ** 2 / 4)  # Welch, from the text
    for factor, passed in ((1 + EPS, True), (1 - EPS, False)):
        gap = Gap(stat(lower + 2 * se * factor, a_up), stat(lower, a_low))
        assert gap.passed is passed and gap.se == pytest.approx(se, rel=1e-9)
    low = stat(lower, a_low)
    one = Gap(SeedStat.of([low.mean + 1e-3]), low)  # one seed: the sign alone, and it says so
    assert one.passed and math.isnan(one.se) and "the sign alone" in one.words()
    assert not Gap(SeedStat.of([low.mean]), low).passed  # a difference of 0 is not above


@FEW
@given(value=st.floats(0.01, 100), decimals=st.integers(0, 3), a=st.floats(0, 0.5), side=st.sampled_from([1, -1]))
def test_a_match_passes_just_inside_its_tolerance_and_fails_just_outside(value, decimals, a, side):
    fig = Figure(value, decimals)
    tol = max(2 * (2 * a / math.sqrt(3)) * math.sqrt(1 / 4 + 1 / 3), 0.5 * 10.0 ** -decimals)
    assert match_tolerance(stat(value, a), fig) == pytest.approx(tol, rel=1e-9)
    assert Match(stat(value + side * tol * (1 - EPS), a), fig).passed is True
    assert Match(stat(value + side * tol * (1 + EPS), a), fig).passed is False
    assert Match(SeedStat.of([value]), fig).passed is None and math.isnan(match_tolerance(SeedStat.of([value]), fig))
    assert kinds.matches(SeedStat.of([value]), fig) is None


@FEW
# a margin of 0, or one whose EPS step (margin x EPS) stays above the float64 resolution of the means (at most 1):
# at margin 1e-12 the step is 1e-18, under an ulp of 0.25, and the one-seed case below flipped by rounding
@given(than=st.floats(0, 1), a=st.floats(1e-4, 0.05), margin=st.one_of(st.just(0.0), st.floats(1e-6, 0.2)))
def test_not_below_by_has_the_larger_of_two_standard_errors_and_its_margin(than, a, margin):
    se = math.sqrt(2 * (2 * a / math.sqrt(3)) ** 2 / 4)
    tol = max(2 * se, margin)
    assert NotBelowBy(stat(than, a), stat(than, a), margin).tolerance == pytest.approx(tol, rel=1e-9)
    assert NotBelowBy(stat(than - tol * (1 - EPS), a), stat(than, a), margin).passed
    assert not NotBelowBy(stat(than - tol * (1 + EPS) - 1e-12, a), stat(than, a), margin).passed
    assert NotBelowBy(stat(than + 1, a), stat(than, a), margin).passed  # above: always fine
    upper = stat(than, a)  # its mean, as summed: within an ulp of than, which a margin of 0 must not fail on
    single = NotBelowBy(SeedStat.of([upper.mean - margin * (1 - EPS)]), upper, margin)  # one seed: the margin
    assert single.tolerance == margin and single.passed


@FEW
@given(a=st.floats(1e-3, 1.0))
def test_a_share_is_most_above_a_half_and_above_zero_by_two_standard_errors(a):
    for mean in (0.5 * (1 + EPS), 0.5 * (1 - EPS)):  # no spread: the half decides
        assert Share(SeedStat.of([mean] * 4)).passed is (mean > 0.5)
    se = a / math.sqrt(3)  # sd 2a/√3 over √4
    assert Share(stat(max(0.5, 2 * se) * (1 + EPS), a)).passed is True
    if 2 * se * (1 - EPS) > 0.5:  # a mean over the half but within 2 standard errors of 0
        assert Share(stat(2 * se * (1 - EPS), a)).passed is False
    assert Share(SeedStat.of([])).passed is None and Share(SeedStat.of([0.6])).passed is True  # one seed: the mean


def test_a_share_above_a_half_but_within_two_standard_errors_of_zero_fails():
    s = Share(stat(0.6, 0.6))  # se = 0.6/√3 = 0.346: 0.6 − 0.69 < 0
    assert s.share.mean > 0.5 and s.passed is False


@pytest.mark.parametrize("n_rows", [3, 4, 6])
def test_a_rank_has_no_verdict_below_its_rows_and_orders_is_the_mirror_of_not_orders(n_rows):
    for rho in (-1.0, 0.0, 0.5):
        yes, no = Rank(rho, n_rows, True), Rank(rho, n_rows, False)
        if n_rows < 4:
            assert yes.passed is None and no.passed is None and math.isnan(yes.critical)
        else:
            assert yes.passed is (rho == -1.0) and no.passed is (not yes.passed)
    assert Rank(-1.0, 3, True, min_rows=3).passed is False  # 3 rows at 5%: no order is rare enough (critical inf)


def test_withheld_verdicts_keep_what_they_would_have_read_and_leave_not_run_alone():
    checks = [Check("a", "", "", "", "", PASS), Check("b", "", "", "", "", FAIL, note="Seeds 0-2."),
              Check("c", "", "", "", "", NOT_RUN), Check("d", "", "", "", "", MEASURED)]
    withhold_verdicts(checks)
    assert [c.verdict for c in checks] == [NOT_JUDGED, NOT_JUDGED, NOT_RUN, MEASURED]
    assert checks[0].note == "Not at the article's scale: no verdict (at this scale it would read PASS)."
    assert checks[1].note == "Seeds 0-2. Not at the article's scale: no verdict (at this scale it would read FAIL)."
    assert checks[2].note == "" and checks[3].note == ""


def test_an_exploratory_claim_is_measured_never_passed_and_a_missing_row_is_named():
    def outcome(ev):
        return kinds.Outcome("m", "t", ev.per_run["x"].mean() > 0, figures={"x": 1.0})

    declared = kinds.bespoke("c", "p", rows=("adam",), exploratory=True)(outcome)
    strict = kinds.bespoke("c", "p", rows=("adam", "sgd"))(outcome)
    ev = evidence({"adam": {"x": [1.0, 2.0]}})
    got = declared.check(ev)
    assert got.verdict == MEASURED and got.exploratory and got.figures == {"x": 1.0} and got.name == "outcome"
    missing = strict.check(ev)
    assert missing.verdict == NOT_RUN and missing.measured == "missing runs of `sgd`" and missing.tolerance == "–"
    none = kinds.bespoke("c", "p", exploratory=True)(lambda ev: kinds.Outcome("m", "t", None))
    assert none.check(ev).verdict == NOT_RUN
    failing = kinds.bespoke("c", "p", rows=("adam",))(lambda ev: kinds.Outcome("m", "t", False, "why"))
    assert (failing.check(ev).verdict, failing.check(ev).note) == (FAIL, "why")


# ----------------------------------------------------------------------------- the check's input readers
def test_model_kwargs_and_devices_are_read_or_refused_naming_the_option():
    assert parse_model_kwargs(None) == {} and parse_model_kwargs('{"width": 3}') == {"width": 3}
    with pytest.raises(CheckInputError, match=r"--model-kwargs '\[1\]': a JSON list; expected an object"):
        parse_model_kwargs("[1]")
    with pytest.raises(CheckInputError, match=r"--model-kwargs 'w=3': not JSON"):
        parse_model_kwargs("w=3")
    assert parse_device("cpu") == torch.device("cpu")
    with pytest.raises(CheckInputError, match=r"--device cuda:\d+: torch sees \d+ CUDA device\(s\) here"):
        parse_device(f"cuda:{torch.cuda.device_count()}")  # one past the last device
    with pytest.raises(CheckInputError, match="--device gpu"):
        parse_device("gpu")


def test_load_function_reads_a_dotted_attribute_and_refuses_what_is_not_callable():
    assert load_function("os:path.join", "--model") is __import__("os").path.join
    for spec, message in (("os:sep", r"--model os:sep: 'sep' is a str, not a function"),
                          ("os:path.nope", r"--model os:path.nope: module 'os' has no 'path.nope'"),
                          ("a:b:c", r"--model 'a:b:c': expected module:function"),
                          (None, r"--model None: expected module:function")):
        with pytest.raises(CheckInputError, match=message):
            load_function(spec, "--model")


def test_load_batches_at_the_max_batches_and_two_sample_boundaries():
    x = torch.randn(2, 3)
    got, more = load_batches([x] * 3, max_batches=3)
    assert len(got) == 3 and not more and got[0][1] is None  # exactly max_batches: none left over
    got, more = load_batches(iter([x] * 4), max_batches=3)
    assert len(got) == 3 and more  # one more was drawn to tell
    with pytest.raises(CheckInputError, match=r"batch 1 has 1 sample\(s\); training mode .* needs at least 2"):
        load_batches([x, x[:1]])
    with pytest.raises(CheckInputError, match=r"--batches \(given\): no batches"):
        load_batches([])
    with pytest.raises(CheckInputError, match="some batches have labels and some do not .*first without: batch 2"):
        load_batches([(x, torch.zeros(2, dtype=torch.long))] * 2 + [x])
    got, _ = load_batches({"img": x, "lbl": torch.ones(2, dtype=torch.long)}, input_key="img", target_key="lbl")
    assert torch.equal(got[0][0], x) and got[0][1].tolist() == [1, 1]


@pytest.mark.parametrize("batch, message", [
    ({"a": torch.zeros(2)}, r"a dict of 1 entry \(.*\) without a tensor under the input key 'input'"),
    ({"a": torch.zeros(2), "b": 1}, r"a dict of 2 entries"),
    ({"conv.weight": torch.zeros(2), "bn.bias": torch.zeros(2)}, r"it looks like a state dict \(weights\)"),
])
def test_a_dict_batch_without_its_input_key_is_described(batch, message):
    with pytest.raises(CheckInputError, match=r"--batches \(given\): batch 0: (.*; )?" + message):
        load_batches([batch])
    if "looks like" not in message:
        with pytest.raises(CheckInputError) as caught:
            load_batches([batch])
        assert "looks like a state dict" not in str(caught.value)


def test_load_weights_strips_a_prefix_given_or_shared_and_hints_one_that_fits():
    torch.manual_seed(0)
    model = _bn_net(nn.BatchNorm2d(4))
    state = model.state_dict()
    assert load_weights(model, state) == "a state dict"
    assert "the prefix 'module.' stripped" in load_weights(model, {f"module.{k}": v for k, v in state.items()})
    net_and_loss = {**{f"net.{k}": v for k, v in state.items()}, "loss.weight": torch.ones(2)}
    assert load_weights(model, net_and_loss, prefix="net.").endswith(", its keys under 'net.' (1 other keys left out)")
    with pytest.raises(CheckInputError, match=r"; its keys under 'net.' fit the model: --strip-prefix net.$"):
        load_weights(model, net_and_loss)
    with pytest.raises(CheckInputError, match=r"--strip-prefix body.: no key starts with it"):
        load_weights(model, state, prefix="body.")
    with pytest.raises(CheckInputError, match=r"does not fit the model: missing key '1\.running_var'$"):
        load_weights(model, {k: v for k, v in state.items() if k != "1.running_var"})
    two_missing = {k: v for k, v in state.items() if k not in ("1.running_var", "1.running_mean")}
    with pytest.raises(CheckInputError, match=r"missing key '1.running_mean' \(and 1 more\)"):
        load_weights(model, two_missing)
    assert load_weights(model, model) == "a state dict"  # a model: its own state dict


# ----------------------------------------------------------------------------- what the first mutation run left alive
def test_a_checked_claim_carries_every_field_of_its_declaration():
    def outcome(ev):
        return kinds.Outcome("measured", "tolerance", True, "a note", {"x": 2.0})

    c = kinds.bespoke("the claim", "published", rows=("adam",), section=kinds.RESNET)(outcome)
    got = c.check(evidence({"adam": {"x": [1.0]}}))
    assert (got.name, got.claim, got.published, got.measured, got.tolerance, got.verdict, got.note, got.section,
            got.exploratory, got.figures) == ("outcome", "the claim", "published", "measured", "tolerance", PASS,
                                              "a note", kinds.RESNET, False, {"x": 2.0})
    missing = kinds.bespoke("the claim", "published", rows=("adam", "sgd", "adamw"), section=kinds.FROZEN,
                            exploratory=True)(outcome).check(evidence({"adam": {"x": [1.0]}}))
    assert (missing.name, missing.claim, missing.published, missing.measured, missing.tolerance, missing.verdict,
            missing.section, missing.exploratory) == ("outcome", "the claim", "published",
                                                      "missing runs of `sgd`, `adamw`", "–", NOT_RUN, kinds.FROZEN,
                                                      True)


def test_two_seeds_give_a_match_its_spread_and_a_rank_order_of_four_rows_its_verdict():
    fig = Figure(0.5, 3)
    two = SeedStat.of([0.49, 0.51])
    assert match_tolerance(two, fig) == pytest.approx(2 * two.sd * math.sqrt(1 / 2 + 1 / 3), rel=1e-12)
    c = next(c for c in registry.CLAIMS if c.name == "rotation_orders_accuracy")
    rows = registry.PUBLISHED_ROWS[:4]
    ev = evidence({row: {c.column: [float(i), float(i) + 0.5], "acc_eval_mode": [1 - 0.1 * i, 0.9 - 0.1 * i]}
                   for i, row in enumerate(rows)})
    got = c.check(ev)
    assert got.verdict == PASS and "per seed -1.00, -1.00 (seeds 0, 1" in got.measured  # both seeds ran all four


def test_an_ordering_of_three_rows_is_judged_and_needs_the_perfect_order_which_chance_never_beats():
    """Three rows (``min_rows=3``): a verdict, not NOT RUN; at 5% no order of three is rare enough (1 in 6), so it
    fails even in the perfect order, and says so. Per seed over the seeds that ran exactly those rows."""
    c = kinds.Ordering("three", "c", rows=("a", "b", "c"), column="col", published="p")
    ev = evidence({row: {"col": [float(i), float(i)], "acc_eval_mode": [1 - 0.1 * i, 1 - 0.1 * i]}
                   for i, row in enumerate(("a", "b", "c"))})
    got = c.check(ev)
    assert got.verdict == FAIL and "1 of 6 orders" in got.tolerance
    assert got.measured.startswith("rho = ") and "per seed" in got.measured


def test_the_gated_handle_lets_an_exception_through_and_its_lags_table_has_its_columns_in_order():
    from test_reestimate_gated import _batches, _net, _probe
    net = _net()
    with pytest.raises(KeyError, match="inside"):
        with reestimate_if_stale(net, _batches(), _probe()):
            raise KeyError("inside")
    result = reestimate_if_stale(net, _batches(), _probe())
    assert list(result.lags().columns) == ["norm_layer", "reestimated", "lag_median_abs_sigma_before",
                                           "lag_max_abs_sigma_before", "lag_median_abs_sigma_after",
                                           "lag_max_abs_sigma_after"]


def test_load_function_puts_the_current_directory_first_on_the_path_once(tmp_path, monkeypatch):
    import os
    import sys
    (tmp_path / "mynets_second_case.py").write_text("def make():\n    return 7\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    assert load_function("mynets_second_case:make", "--model")() == 7
    assert sys.path[0] == os.getcwd() and sys.path.count(os.getcwd()) == 1
    load_function("mynets_second_case:make", "--model")
    assert sys.path.count(os.getcwd()) == 1


def test_the_readers_messages_name_their_option_and_give_the_example_whole():
    from bnrotation.inputs import _items, model_from_factory
    with pytest.raises(CheckInputError) as caught:
        parse_model_kwargs("[1]")
    assert str(caught.value) == "--model-kwargs '[1]': a JSON list; expected an object such as '{\"num_classes\": 10}'"
    with pytest.raises(CheckInputError) as caught:
        parse_model_kwargs("w")
    assert str(caught.value).endswith("; expected an object such as '{\"num_classes\": 10}'")
    with pytest.raises(CheckInputError, match=r"^--model 'nope': expected module:function"):
        model_from_factory("nope")
    with pytest.raises(CheckInputError) as caught:
        _items(7, "b.pt")
    assert str(caught.value) == ("--batches b.pt: holds a int; expected a tensor (N, ...), an (x, y) tuple, a dict, "
                                 "or a list of them")


def test_a_cuda_device_is_refused_past_the_last_one_this_machine_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parse_device("cuda") == torch.device("cuda") and parse_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(CheckInputError, match=r"^--device cuda:2: torch sees 2 CUDA device\(s\) here$"):
        parse_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CheckInputError, match=r"^--device cuda: torch sees 2 CUDA device\(s\) here$"):
        parse_device("cuda")


def test_findings_line_puts_an_unknown_rule_last_and_wraps_a_long_message():
    long = "word " * 60
    text = findings_line([Finding("custom", "c", "x"), Finding("momentum-zero", "a", long.strip()),
                          Finding("momentum-zero", "b", "y")]).splitlines()
    assert text[0] == ("BatchNorm settings: 3 finding(s) under 2 rule(s), from bnrotation.lint_batchnorm (every one "
                       "in its list, or in monitor.findings):")
    assert text[1] == "  [momentum-zero] 2 layers: a, b"
    wrapped = [line for line in text[2:] if not line.startswith("  [")][:-1]
    assert len(wrapped) > 1 and all(len(line) <= 120 and line.startswith("    ") for line in wrapped)
    assert max(len(line) for line in wrapped) > 110  # filled to its width, not a narrower one
    assert text[-2] == "  [custom] 1 layer: c" and text[-1] == "    c: x"


def test_the_untracked_findings_name_their_layer_and_give_the_whole_fix():
    kept = _bn_net(nn.BatchNorm2d(4))
    kept[1].track_running_stats = False
    (f,) = lint_batchnorm(kept)
    assert f.layer == "1" and "XX" not in f.message
    assert f.message.startswith("track_running_stats=False on a layer that kept its running statistics: training "
                                "normalises with batch statistics")
    assert "put it in eval() after model.train() (or use FrozenBatchNorm2d)" in f.message
    assert f.message.endswith("else set track_running_stats=True again")
    (g,) = lint_batchnorm(_bn_net(nn.BatchNorm2d(4), nn.BatchNorm2d(4, track_running_stats=False)),
                          torch.randn(2, 3, 2, 2))
    assert g.layer == "3" and g.message.startswith("track_running_stats=False while other BatchNorm layers track: "
                                                   "this one normalises with each batch's own statistics")
    assert g.message.endswith("construct it with track_running_stats=True like the others")


def test_reestimate_if_stale_reads_a_dict_probe_by_its_default_keys_and_re_estimates_a_frozen_layer_too():
    import warnings

    from bnrotation.monitor import StaleStatisticsWarning
    from test_reestimate_gated import _batches, _net, _probe
    net = _net().train()
    net[4].eval()  # frozen: in evaluation mode in a model in training mode, parameters fixed
    for p in net[4].parameters():
        p.requires_grad_(False)
    x, y = _probe()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleStatisticsWarning)  # the gate measures quietly
        result = reestimate_if_stale(net, _batches(), {"input": x, "target": y})
    assert result.fired is True and result.layers == ["1", "4", "9"]  # skip_frozen is off by default
    assert not math.isnan(result.before.acc_eval_mode)  # the labels were read under "target"
    result.restore()
    assert reestimate_if_stale(net, _batches(), (x, y), skip_frozen=True).layers == ["1", "9"]
    fitted = _net()
    reestimate(fitted, [x])
    quiet = reestimate_if_stale(fitted, [x], (x, y))
    assert quiet.fired is False and quiet.scope == "model" and quiet.report is None
    quiet.restore()  # the handle works when nothing was re-estimated too


def test_a_permute_of_one_dim_and_permutes_and_a_relu_before_a_concatenation_are_seen_through():
    t = torch.zeros(4)
    assert channel_axis_after("permute", (t, 0), (4,), (4,), 0) == 0

    class Through(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = nn.Conv1d(3, 2, 1), nn.Conv1d(3, 3, 1)
            self.bn, self.bn2 = nn.BatchNorm1d(5), nn.BatchNorm1d(2)

        def forward(self, x):
            a = self.a(x)
            y = self.bn(torch.cat([torch.relu(a), self.b(x)], 1))
            z = self.bn2(a.permute(0, 2, 1).transpose(1, 2))
            return y.mean(-1)[:, :2] + z.mean(-1)

    for model in (Through(), Untraceable(Through())):
        pairing = find_pairs(model, torch.randn(2, 3, 4))
        prefix = "" if isinstance(model, Through) else "body."
        got = {p.norm: (p.weight, p.segments) for p in pairing.pairs}
        assert got == {prefix + "bn": (f"cat({prefix}a, {prefix}b)", (Segment(0, 2, prefix + "a"),
                                                                      Segment(2, 5, prefix + "b"))),
                       prefix + "bn2": (prefix + "a", ())}


def test_the_judges_give_their_numbers_as_well_as_their_verdict():
    from test_claims import ranked
    c = next(c for c in registry.CLAIMS if c.name == "rotation_orders_accuracy")
    few = c.judge(ranked(registry.PUBLISHED_ROWS[:3], c.column, 1.0))
    assert math.isnan(few.rho) and few.n_rows == 3 and few.orders is True and few.passed is None
    fig = Figure(0.5, 3)
    assert kinds.matches(stat(0.5, 0.001), fig) is True and kinds.matches(stat(0.6, 0.001), fig) is False


def test_a_nested_concatenation_keeps_each_pieces_segment_and_names_a_loose_piece_by_its_source():
    class Nested(nn.Module):
        def __init__(self, loose: bool):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b, self.c = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 1, 1), nn.Conv2d(3, 2, 1)
            self.loose = loose
            self.bn = nn.BatchNorm2d(8 if loose else 5)

        def forward(self, x):
            inner = torch.cat([self.a(x), x if self.loose else self.b(x)], 1)
            return self.bn(torch.cat([inner, self.c(x)] + ([self.b(x)] if self.loose else []), 1)).mean((2, 3))

    for model in (Nested(False), Untraceable(Nested(False))):
        p = "" if isinstance(model, Nested) else "body."
        (pair,) = find_pairs(model, torch.randn(2, 3, 2, 2)).pairs
        assert pair.segments == (Segment(0, 2, p + "a"), Segment(2, 3, p + "b"), Segment(3, 5, p + "c"))
    for model, source in ((Nested(True), "the model's input"), (Untraceable(Nested(True)), "mul")):  # x * 1.0
        (unpaired,) = find_pairs(model, torch.randn(2, 3, 2, 2)).unpaired
        assert unpaired.reason.startswith(f"its channels [2, 5) come from {source}, not from a convolution")


def test_a_concatenation_of_inputs_alone_is_named_cat_and_of_one_input_is_that_input():
    class Loose(nn.Module):
        def __init__(self, pieces: int):
            super().__init__()
            self.pieces, self.bn = pieces, nn.BatchNorm2d(3 * pieces)

        def forward(self, x):
            return self.bn(torch.cat([x] * self.pieces, 1)).mean((2, 3))

    for model, source in ((Loose(2), "cat"), (Loose(1), "the model's input"), (Untraceable(Loose(2)), "cat"),
                          (Untraceable(Loose(1)), "mul")):  # Untraceable's x * 1.0
        (unpaired,) = find_pairs(model, torch.randn(2, 3, 2, 2)).unpaired
        assert unpaired.reason.startswith(f"its input comes from {source}, not from a convolution"), source


def test_load_function_tells_a_missing_package_or_submodule_from_one_that_fails_and_keeps_an_empty_path_entry(
        monkeypatch):
    import os
    import sys
    for spec in ("nosuchpkg_second_case.mod:f", "os.nosuch_second_case:f"):
        with pytest.raises(CheckInputError, match=rf"--model {spec}: cannot find '{spec.split(':')[0]}'"):
            load_function(spec, "--model")
    monkeypatch.setattr(sys, "path", ["", *(p for p in sys.path if p not in ("", os.getcwd()))])
    load_function("os:getcwd", "--model")
    assert os.getcwd() not in sys.path  # "" already stands for the current directory


def test_scope_layers_picks_a_nested_layer_a_lag_exactly_at_its_threshold_and_passes_its_options_on():
    """A non-finite statistic of a layer inside a submodule (its name has two dots) is that layer's; a lag equal to
    ``lag_sigma`` is over it ("at or over"); a dict batch's ``input_key`` and ``max_batches`` reach the pass."""
    import warnings

    from bnrotation.monitor import Thresholds
    from test_reestimate_gated import _net, _probe
    x, y = _probe()
    nested = nn.Sequential(_net())
    reestimate(nested, [x])
    with torch.no_grad():
        nested[0][4].running_var[0] = math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warn=False: not even the non-finite statistic is warned about
        got = reestimate_if_stale(nested, [{"img": x}, {"img": x}], {"img": x, "lbl": y}, scope="layers",
                                  input_key="img", target_key="lbl", max_batches=1)
    assert got.layers == ["0.4"] and got.report.layers == got.layers and got.report.batches == 1
    assert not math.isnan(got.before.acc_eval_mode)  # the labels read under target_key
    assert (got.before.step, got.after.step) == (0, 1)
    net = _net()
    reestimate(net, [x])
    with torch.no_grad():
        net[4].running_mean += 2 * net[4].running_var.sqrt()
    lag_only = dict(mode_gap=0.0, eval_error_sigma=math.inf)  # E off: the lag alone decides
    lag = reestimate_if_stale(net, [x], (x, y), thresholds=Thresholds(lag_sigma=1e9, **lag_only)).before
    at = float(lag.layers.set_index("norm_layer").loc["4", "lag_median_abs_sigma"])
    exact = reestimate_if_stale(net, [x], (x, y), thresholds=Thresholds(lag_sigma=at, **lag_only), scope="layers")
    assert exact.fired and exact.layers == ["4"]


def test_a_flatten_that_merges_the_channel_dim_with_the_one_before_is_not_seen_through():
    assert channel_axis_after("flatten", (), (2, 3, 4), (6, 4), 1) is None
    assert channel_axis_after("flatten", (), (2, 3, 4), (2, 12), 1) is None
    assert channel_axis_after("flatten", (), (2, 3, 1), (2, 3), 1) == 1


def test_the_momentum_findings_say_what_is_wrong_and_the_fix_whole():
    def message(momentum, training=True):
        (f,) = lint_batchnorm(_bn_net(nn.BatchNorm2d(4, momentum=momentum)).train(training))
        return f.message

    assert message(0.0) == ("momentum=0: training never updates the running statistics, whatever the weights do; "
                            "restore the momentum (PyTorch's default 0.1) if it was set to 0 to back them up (a layer "
                            "meant to stay frozen belongs in eval(), its momentum kept)")
    assert message(None) == ("momentum=None in training mode: the running statistics average every batch since the "
                             "start, from weights long gone; set a momentum (PyTorch's default 0.1), or keep None only "
                             "for re-estimation after training")
    assert message(0.99) == ("momentum=0.99: each batch replaces 99% of the running statistics; PyTorch's momentum is "
                             "TensorFlow's 1 - momentum, so a Keras momentum of 0.99 is PyTorch's 0.01")


def test_findings_line_wraps_at_its_width_exactly():
    text = findings_line([Finding("momentum-zero", "a", "x" * 113 + " y")]).splitlines()
    assert text[2] == "    a: " + "x" * 113 and text[3] == "    y"  # 120 characters: TEXT_WIDTH - 40


# ----------------------------------------------------------------------------- pairing: an operation's name
@pytest.mark.parametrize("target, name", [
    ("view", "view"), ("__add__", "add"), ("__iadd__", "add_"), ("__radd__", "add"), ("__imatmul__", "matmul_"),
    ("__rtruediv__", "truediv"), ("__or__", "or"), ("__ror__", "or"), ("__ior__", "or_"),
    ("__getitem__", "__getitem__"), ("__i__", "__i__"), ("__radd", "radd"), ("_foo_", "foo_"),
    (torch.Tensor.__add__, "add"), (torch.Tensor.__iadd__, "add_"), (torch.Tensor.__rmul__, "mul"),
    (torch.relu, "relu"), (torch.Tensor.view, "view"),
    (nn.ReLU(), "relu"), (nn.AdaptiveAvgPool2d(1), "adaptive_avg_pool2d"), (nn.Linear(2, 2), "Linear"),
])
def test_an_operations_name_for_the_see_through_rule(target, name):
    """Tensor's operator methods by their arithmetic (in place: a trailing _; reflected: the same), other dunder
    names as they are, a leading _ dropped, a see-through module by its function's name, another by its class."""
    from bnrotation.pairing import _op_name
    assert _op_name(target) == name


def test_an_operation_without_a_name_is_named_by_its_type():
    import functools
    from bnrotation.pairing import _op_name

    assert _op_name(functools.partial(torch.relu)) == "partial"


# ----------------------------------------------------------------------------- pairing: each reason, to the letter
class _CatByAxis(nn.Module):
    """torch.cat's numpy alias: ``axis=1`` is the channel dim, as ``dim=1`` is."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.bn = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 4, 1), nn.BatchNorm2d(6)

    def forward(self, x):
        return self.bn(torch.cat([self.a(x), self.b(x)], axis=1))


class _Reordered(nn.Module):
    """One BatchNorm called on cat(a, a, b) and on cat(a, b, a): the same layers, other channels."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.bn = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 4, 1), nn.BatchNorm2d(8)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        return self.bn(torch.cat([a, a, b], 1)) + self.bn(torch.cat([a, b, a], 1))


class _Shared(nn.Module):
    """One BatchNorm called on the outputs of two convolutions."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.bn = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.a(x)) + self.bn(self.b(x))


class _WithInputs(nn.Module):
    """A BatchNorm over a convolution's 4 channels and ``k`` copies of the 3-channel input; none at all with
    ``conv=False``."""

    def __init__(self, k: int, conv: bool = True):
        super().__init__()
        self.k, self.a, self.bn = k, nn.Conv2d(3, 4, 1) if conv else None, nn.BatchNorm2d(4 * conv + 3 * k)

    def forward(self, x):
        return self.bn(torch.cat(([self.a(x)] if self.a is not None else []) + [x] * self.k, 1))


class _Transposed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.bn = nn.Conv1d(3, 8, 1), nn.BatchNorm1d(5)

    def forward(self, x):  # (N, 3, 5) -> (N, 8, 5) -> (N, 5, 8): the norm's channels are the length dim
        return self.bn(self.a(x).transpose(1, 2))


INPUT_REASON = "not from a convolution or linear layer through operations that keep each channel apart"


@pytest.mark.parametrize("model, shape, reason", [
    (_Reordered(), (4, 3, 5, 5), "called 2 times on different channels of cat(a, b)"),
    (_Shared(), (4, 3, 5, 5), "called 2 times on the outputs of different layers (a, b)"),
    (_WithInputs(1), (4, 3, 5, 5), f"its channels [4, 7) come from the model's input, {INPUT_REASON}"),
    (_WithInputs(2), (4, 3, 5, 5), f"its channels [4, 7) come from the model's input, {INPUT_REASON} (and 1 more "
                                   "channel ranges)"),
    (_WithInputs(3), (4, 3, 5, 5), f"its channels [4, 7) come from the model's input, {INPUT_REASON} (and 2 more "
                                   "channel ranges)"),
    (_WithInputs(2, conv=False), (4, 3, 5, 5), f"its input comes from cat, {INPUT_REASON}"),
    (_Transposed(), (4, 3, 5), "its input comes from a, but its channel dim holds dim 2's channels"),
])
def test_each_reason_a_layer_is_left_unpaired_is_given_to_the_letter(model, shape, reason):
    """The second call, the second layer, the second (and third) loose channel range: each gives its own reason,
    and the norm layer keeps its name."""
    found = find_pairs(model, torch.randn(*shape))
    assert found.pairs == [] and [(u.norm, u.weight, u.reason) for u in found.unpaired] == [("bn", None, reason)]


def test_a_concatenation_by_axis_is_paired_per_segment_with_no_reason():
    found = find_pairs(_CatByAxis(), torch.randn(4, 3, 5, 5))
    assert found.pairs == [NormPair("bn", "cat(a, b)", "", (Segment(0, 2, "a"), Segment(2, 6, "b")))]
    assert found.pairs[0].reason == "" and found.unpaired == []
