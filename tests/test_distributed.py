"""Rank agreement (:func:`bnrotation.distributed.ranks_agree`) with two real processes on the ``gloo`` backend.

One start of two processes (fork where the platform has it, else spawn) runs every two-rank case (:func:`_worker`),
each rank writing what it measured to a file:

- identical data on both ranks: the spread is exactly 0 (the same float32 operations on the same numbers);
- rank 1's inputs shifted by ``SHIFT``: the first BatchNorm's batch means differ by ``SHIFT * W.sum(1)`` at every
  step, so after ``STEPS`` updates with momentum m its running means differ by ``(1 - (1 - m)**STEPS)`` times that
  (the closed form), while the second BatchNorm sees the first one's batch-normalised output, the same on both
  ranks but for rounding; the worst layer is the first. Rank 0's buffers broadcast then: the spread is 0 again;
- the same under ``DistributedDataParallel`` with its default buffer sync: rank 0's buffers are copied to
  rank 1 before each forward pass, so only the last update differs: m times the shift's effect, a ratio of
  ``m / (1 - (1 - m)**STEPS)`` to the case without DDP;
- a model converted to ``SyncBatchNorm``: detected; its forward pass needs a GPU under torch 2.13 (CPU inputs
  raise), in which case only the detection is tested;
- rank 1 holding one more BatchNorm layer: both ranks raise the same error, naming rank 1 and the layer;
- two layers whose buffers are set by hand, rank 1's shifted by another amount in each layer, in the running mean
  and in the running variance (:func:`two_layer_buffers`): every channel of both has its spreads' closed form.
"""

from __future__ import annotations

import math
import pickle
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from bnrotation.distributed import RankAgreement, ranks_agree

torch.set_num_threads(1)

SHIFT, STEPS, MOMENTUM = 3.0, 5, 0.1
TIMEOUT_S = 300  # the whole spawn, two interpreters importing torch on a shared machine included


class Tiny(nn.Module):
    """fc1 -> bn1 -> ReLU -> fc2 -> bn2."""

    def __init__(self, extra: bool = False):
        super().__init__()
        torch.manual_seed(0)  # the same weights on every rank
        self.fc1, self.bn1 = nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8, momentum=MOMENTUM)
        self.fc2, self.bn2 = nn.Linear(8, 4, bias=False), nn.BatchNorm1d(4, momentum=MOMENTUM)
        self.bn3 = nn.BatchNorm1d(4) if extra else None

    def forward(self, x):
        y = self.bn2(self.fc2(torch.relu(self.bn1(self.fc1(x)))))
        return self.bn3(y) if self.bn3 is not None else y


def inputs(step: int, shift: float) -> torch.Tensor:
    """Batch ``step``, the same on every rank, plus ``shift`` on every feature."""
    return torch.randn(16, 6, generator=torch.Generator().manual_seed(step)) + shift


def train(model: nn.Module, shift: float, backward: bool = False, steps: range = range(STEPS)) -> None:
    """Training-mode forward passes on batches ``steps``, shifted by ``shift``."""
    model.train()
    for step in steps:
        out = model(inputs(step, shift))
        if backward:
            out.square().mean().backward()  # DDP's reducer expects one backward per forward


# Per layer: rank 0's running means and variances (channel c), and rank 1's shift of the mean and factor of the
# variance: different in the two layers, so that a layer read at another's offset has other spreads.
TWO_LAYERS = {"bn1": (lambda c: 0.1 * c, lambda c: 1.0 + 0.1 * c, 0.5, 1.5),
              "bn2": (lambda c: -0.2 * c, lambda c: 2.0 + c, 2.0, 3.0)}


def two_layer_buffers(model: nn.Module, rank: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Set ``model``'s bn1 and bn2 buffers to rank ``rank``'s values of :data:`TWO_LAYERS`; ``{layer: (mean, var)}``
    as stored (float32)."""
    stored = {}
    for name, (mean, var, shift, factor) in TWO_LAYERS.items():
        m = model.get_submodule(name)
        c = torch.arange(m.num_features, dtype=torch.float64)
        with torch.no_grad():
            m.running_mean.copy_(mean(c) + shift * rank)
            m.running_var.copy_(var(c) * factor ** rank)
        stored[name] = (m.running_mean.clone(), m.running_var.clone())
    return stored


def _worker(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    # rendezvous through a file in the run's own folder: no port to pick that another process could take between
    # the pick and the bind
    dist.init_process_group("gloo", init_method=f"file://{Path(out, 'store')}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=240))
    found = {}
    try:
        same = Tiny()
        train(same, 0.0)
        found["same"] = ranks_agree(same)
        shifted = Tiny()
        train(shifted, SHIFT * rank)
        found["shifted"] = ranks_agree(shifted)
        for buffer in shifted.buffers():  # the fix: every rank takes rank 0's statistics
            dist.broadcast(buffer, src=0)
        found["broadcast"] = ranks_agree(shifted)
        ddp = nn.parallel.DistributedDataParallel(Tiny())  # syncs buffers before each forward by default
        train(ddp, SHIFT * rank, backward=True)
        found["ddp"] = ranks_agree(ddp)
        synced = nn.SyncBatchNorm.convert_sync_batchnorm(Tiny())
        found["sync_untrained"] = ranks_agree(synced)
        try:
            train(synced, SHIFT * rank)
            found["sync_trained"] = ranks_agree(synced)
        except ValueError as e:  # torch's SyncBatchNorm refuses CPU inputs under a process group
            found["sync_forward_error"] = str(e)
        by_hand = Tiny()
        two_layer_buffers(by_hand, rank)
        found["two_layers"] = ranks_agree(by_hand)
        try:
            ranks_agree(Tiny(extra=rank == 1))
        except ValueError as e:
            found["mismatch"] = str(e)
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(found))


def _start_ranks(out: Path) -> list[dict]:
    """Run :func:`_worker` on two spawned ranks writing into ``out``; what each measured. Fails (never hangs) after
    :data:`TIMEOUT_S`."""
    # spawn: each rank a fresh interpreter. A fork of a pytest-xdist worker copies whatever locks the threads that
    # earlier tests left running (Lightning's, the compiler's, OpenMP's) held at that moment, and the ranks then
    # hung now and then until the time-out (seen once in two full runs of `make test`).
    context = mp.start_processes(_worker, args=(2, str(out)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"the two gloo ranks did not finish within {TIMEOUT_S} s")
    return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(2)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    """What each of two gloo ranks measured in :func:`_worker`. A rank killed by a signal before it wrote its file
    (once in a full `.ci/run`: ``terminate called without an active exception`` in gloo, SIGABRT, not seen in
    isolation) is a failure of the two processes' start, not of what they measure: the ranks start once more, in a
    new folder, and a second such failure fails the tests with both. Every other error (a rank's exception, a
    time-out) fails at once."""
    first = None
    for attempt in range(2):
        try:
            return _start_ranks(tmp_path_factory.mktemp(f"ranks{attempt}"))
        except mp.ProcessExitedException as err:
            if err.signal_name is None or first is not None:
                raise AssertionError(f"two gloo ranks: {err}" + (f" (and before it: {first})" if first else "")) from err
            first = err
    raise AssertionError("unreachable")


def _oracle_bn1(shift: float, ddp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """bn1's running means on rank 0 and rank 1, replayed in this process without any collective. Under DDP's
    broadcast both ranks start the last forward pass from rank 0's buffers."""
    models = [Tiny(), Tiny()]
    train(models[0], 0.0, steps=range(STEPS - 1))
    if ddp:
        models[1].load_state_dict(models[0].state_dict())
    else:
        train(models[1], shift, steps=range(STEPS - 1))
    train(models[0], 0.0, steps=range(STEPS - 1, STEPS))
    train(models[1], shift, steps=range(STEPS - 1, STEPS))
    return models[0].bn1.running_mean.double(), models[1].bn1.running_mean.double()


def test_identical_data_gives_a_spread_of_exactly_zero(two_ranks):
    for found in two_ranks:
        same = found["same"]
        assert same.world_size == 2 and same.mean_spread_sigma == 0.0 and same.var_spread == 0.0
        assert same.agrees() and not same.uses_sync_batchnorm
        assert list(same.channels["norm_layer"].unique()) == ["bn1", "bn2"] and len(same.channels) == 8 + 4


def test_broadcasting_rank_0s_buffers_makes_the_ranks_agree_exactly(two_ranks):
    assert all(found["broadcast"].agrees() and found["broadcast"].mean_spread_sigma == 0.0 for found in two_ranks)


def test_a_shifted_rank_diverges_by_the_closed_form_in_the_first_layer(two_ranks):
    """The spread of bn1 channel c is ``(1 - 0.9**5) * SHIFT * |W1[c].sum()| / sqrt(mean running var + eps)``.
    Tolerance: float32 means of 16 samples and five updates, about 1e-6 relative, against 1e-4 here."""
    a, b = (found["shifted"] for found in two_ranks)
    assert a.channels.equals(b.channels) and a.mean_spread_sigma == b.mean_spread_sigma  # every rank: the same answer
    assert a.worst_layer == "bn1" and not a.agrees(tolerance_sigma=1.0)
    w = Tiny().fc1.weight.detach().double()  # (8, 6)
    replica = Tiny()
    train(replica, 0.0)
    var = replica.bn1.running_var.double()  # the shift leaves the variance alone, up to rounding
    closed = (1 - (1 - MOMENTUM) ** STEPS) * SHIFT * w.sum(1).abs() / (var + replica.bn1.eps).sqrt()  # (8,) σ
    bn1 = a.channels[a.channels["norm_layer"] == "bn1"]
    torch.testing.assert_close(torch.tensor(bn1["mean_spread_sigma"].to_numpy()), closed, rtol=1e-4, atol=0)
    assert a.worst_channel == int(closed.argmax())
    bn2 = a.channels[a.channels["norm_layer"] == "bn2"]
    assert bn2["mean_spread_sigma"].max() < 1e-4 < float(closed.min())  # bn1 removed the shift: rounding only
    assert a.var_spread < 1e-4
    assert "bn1 channel" in a.summary and "no SyncBatchNorm" in a.summary


def test_the_spread_is_the_replayed_ranks_and_ddp_broadcast_leaves_one_update_of_it(two_ranks):
    """Against bn1's running means replayed in this process (:func:`_oracle_bn1`), and the ratio
    ``m / (1 - (1 - m)**STEPS)`` between DDP with its default buffer sync and no DDP (0.244 at m = 0.1, five
    steps). Tolerance: the same float32 rounding as the closed form, 1e-4 relative."""
    shifted, ddp = two_ranks[0]["shifted"], two_ranks[0]["ddp"]
    for found, is_ddp in ((shifted, False), (ddp, True)):
        r0, r1 = _oracle_bn1(SHIFT, is_ddp)
        replica = Tiny()
        train(replica, 0.0)
        expected = (r1 - r0).abs() / (replica.bn1.running_var.double() + replica.bn1.eps).sqrt()
        got = found.channels[found.channels["norm_layer"] == "bn1"]["mean_spread_sigma"].to_numpy()
        torch.testing.assert_close(torch.tensor(got), expected, rtol=1e-4, atol=1e-7)
    ratio = ddp.mean_spread_sigma / shifted.mean_spread_sigma
    assert math.isclose(ratio, MOMENTUM / (1 - (1 - MOMENTUM) ** STEPS), rel_tol=1e-4)
    assert ddp.worst_layer == "bn1" and not ddp.agrees(tolerance_sigma=0.1)  # the broadcast does not make them agree


def test_two_layers_with_different_shifts_in_mean_and_variance_have_each_their_closed_form(two_ranks):
    """Every channel of both layers against the docstring's formulas on the two ranks' stored float32 buffers, in
    float64 as the function computes them (rounding only: 1e-12 relative). The second layer's shift is the larger in
    σ, so the worst layer is the second; a stride that reads the second layer at another offset fails here."""
    stored = [two_layer_buffers(Tiny(), rank) for rank in range(2)]
    for found in two_ranks:
        got = found["two_layers"]
        assert list(got.channels["norm_layer"]) == ["bn1"] * 8 + ["bn2"] * 4
        for name, m in (("bn1", Tiny().bn1), ("bn2", Tiny().bn2)):
            (mean0, var0), (mean1, var1) = (s[name] for s in stored)
            means, variances = torch.stack([mean0, mean1]).double(), torch.stack([var0, var1]).double()  # (2, C)
            scale = variances.mean(0) + m.eps
            lines = got.channels[got.channels["norm_layer"] == name]
            assert list(lines["channel"]) == list(range(m.num_features))
            torch.testing.assert_close(torch.tensor(lines["mean_spread_sigma"].to_numpy()),
                                       (means[1] - means[0]).abs() / scale.sqrt(), rtol=1e-12, atol=0)
            torch.testing.assert_close(torch.tensor(lines["var_spread"].to_numpy()),
                                       (variances[1] - variances[0]).abs() / scale, rtol=1e-12, atol=0)
        assert got.worst_layer == "bn2" and got.worst_channel == 0  # 2 / sqrt(2 · 2): the smallest variance of bn2
        assert got.mean_spread_sigma == got.channels["mean_spread_sigma"].max()
        assert got.var_spread == got.channels["var_spread"].max() == pytest.approx(2 * 2 / 4, rel=1e-6)


def test_syncbatchnorm_is_detected(two_ranks):
    for found in two_ranks:
        assert found["sync_untrained"].uses_sync_batchnorm and found["sync_untrained"].agrees()
        assert "SyncBatchNorm" in found["sync_untrained"].summary
        if "sync_trained" in found:  # a torch whose SyncBatchNorm runs on CPU: it must keep the ranks together
            assert found["sync_trained"].agrees(tolerance_sigma=1e-6, tolerance_var=1e-6)
        else:
            assert "expected input tensor to be on GPU" in found["sync_forward_error"]


def test_ranks_with_different_layers_raise_the_same_error_on_every_rank(two_ranks):
    messages = [found["mismatch"] for found in two_ranks]
    assert messages[0] == messages[1]
    assert "rank 1 holds other BatchNorm layers than rank 0" in messages[0] and "('bn3', 4)" in messages[0]


def test_one_rank_agrees_trivially_and_no_process_group_is_an_error(tmp_path):
    model = Tiny()
    train(model, 0.0)
    with pytest.raises(RuntimeError, match="process group is not initialised"):
        ranks_agree(model)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        alone = ranks_agree(model)
        with pytest.raises(ValueError, match="no BatchNorm layer with running statistics"):
            ranks_agree(nn.Linear(2, 2))
    finally:
        dist.destroy_process_group()
    assert isinstance(alone, RankAgreement) and alone.world_size == 1 and alone.agrees()
    assert alone.mean_spread_sigma == 0.0 and alone.worst_layer == "bn1"
