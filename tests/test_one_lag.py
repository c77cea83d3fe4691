"""One lag: the study's interventions, its diagnosis and its averaging table measure the running-mean lag as the
monitor does (σ with the layer's eps), under the monitor's column names; a schema-1 run reads under the new names.

Each definition test uses a layer whose eps is large against its input variance, where the lag without eps (the
schema-1 study's) and the lag with it differ a hundredfold."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn as nn

from bnrotation import records
from bnrotation.monitor import StalenessMonitor
from bnrotation.probes import fresh_statistics
from bnrotation.study.analysis.formatting import schema_versions
from bnrotation.study.analysis.results import BadRunError, load_run, read_table
from bnrotation.study.analysis.tables import table
from bnrotation.study.interventions import layer_lags, run_interventions
from bnrotation.study.run_averages import lag_network_median_abs_sigma

from conftest import ROOT

EPS = 1.0  # the layer's eps, against an input variance near 1e-4: σ = sqrt(var + eps) is near 1, not near 0.01


def _net_with_large_eps() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Conv(3 -> 5, 1x1) -> BatchNorm2d(5, eps=1) -> ReLU -> pool -> Linear(5 -> 3), with running means 0.05 above
    the inputs' means; a probe of 24 images whose BatchNorm inputs have a variance near 1e-4 (an odd number of
    channels: the median is one channel's lag, not a mean of two)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 5, 1, bias=False), nn.BatchNorm2d(5, eps=EPS), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 3))
    x = torch.randn(24, 3, 4, 4) * 0.01 + 1.0  # (N, C, H, W)
    with torch.no_grad():
        z = net[0](x)  # (N, 5, 4, 4): the BatchNorm's inputs
        net[1].running_mean.copy_(z.mean(dim=(0, 2, 3)) + 0.05 * torch.arange(1, 6))
        net[1].running_var.copy_(z.var(dim=(0, 2, 3)))
    return net.eval(), x, torch.randint(0, 3, (24,))


def test_the_large_eps_layer_tells_the_two_definitions_apart():
    net, x, _ = _net_with_large_eps()
    var = fresh_statistics(net, x)["1"][1]  # (5,)
    assert float(var.max()) < 1e-3 < EPS  # without eps the σ would be below 0.03, with it about 1


def test_the_interventions_lag_is_the_monitors():
    """The re-estimation batch is the monitor's probe, so the fresh statistics are the same: the per-channel lag and
    each layer's median |lag| must be the monitor's ``lag_sigma`` and ``lag_median_abs_sigma``."""
    net, x, y = _net_with_large_eps()
    record = StalenessMonitor(net, (x, y), warn=False)(0)
    result = run_interventions(net, [x], x, y, chunk=24)
    monitor_lag = torch.from_numpy(record.channels["lag_sigma"].to_numpy().copy())  # (5,)
    torch.testing.assert_close(result.lag_sigma["1"], monitor_lag.double(), rtol=1e-5, atol=1e-7)
    lags = layer_lags(result)
    assert list(lags.columns) == ["norm_layer", "channels", "lag_median_abs_sigma", "worst_channel",
                                  "worst_lag_sigma", "median_var_ratio"]
    line, monitor = lags.set_index("norm_layer").loc["1"], record.layers.set_index("norm_layer").loc["1"]
    assert line["lag_median_abs_sigma"] == pytest.approx(monitor["lag_median_abs_sigma"], rel=1e-5)
    assert line["worst_channel"] == monitor["worst_channel"] == 4
    assert line["worst_lag_sigma"] == pytest.approx(monitor["lag_max_abs_sigma"], rel=1e-5)
    assert 0.1 < line["lag_median_abs_sigma"] < 0.2  # 0.15 / sqrt(1 + var): with eps; without it, above 5


def test_the_interventions_table_names_the_norm_layer():
    net, x, y = _net_with_large_eps()
    table = run_interventions(net, [x], x, y, chunk=24).table
    assert list(table.columns) == ["intervention", "k", "norm_layer", "acc_eval_mode"]
    assert table.loc[table["intervention"] == "layer", "norm_layer"].tolist() == ["1"]
    assert set(records.TABLE_COLUMNS["interventions"]) >= set(table.columns)


def test_the_averaging_tables_lag_is_the_network_median_of_the_monitors():
    """Over every channel of every layer, the lower middle (torch's median) of the monitor's |lag_sigma|."""
    net, x, y = _net_with_large_eps()
    record = StalenessMonitor(net, (x, y), warn=False)(0)
    want = float(torch.from_numpy(record.channels["lag_sigma"].abs().to_numpy().copy()).median())
    assert lag_network_median_abs_sigma(net, fresh_statistics(net, x)) == pytest.approx(want, rel=1e-5)


# ----------------------------------------------------------------------------- schema 1 reads under the new names
SCHEMA_1 = {"averaging": ("lag_median_abs_sigma", "lag_network_median_abs_sigma"),
            "interventions": ("layer", "norm_layer")}


def _write(df: pd.DataFrame, path, name: str, version: int) -> None:
    """``df`` as a table of the suite's format at schema ``version``, its columns as given (no check)."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = {**(table.schema.metadata or {}), b"bnrotation.schema_version": str(version).encode(),
            b"bnrotation.table": name.encode()}
    pq.write_table(table.replace_schema_metadata(meta), path)


@pytest.mark.parametrize("name", SCHEMA_1)
def test_a_schema_1_table_reads_under_the_new_names(tmp_path, name):
    old, new = SCHEMA_1[name]
    columns = [new if c == new else c for c in records.TABLE_COLUMNS[name]]
    df = pd.DataFrame({c: [0] for c in columns}).rename(columns={new: old})
    if name == "averaging":
        df[old] = [0.25]
    _write(df, tmp_path / "t.parquet", name, 1)
    got = read_table(tmp_path / "t.parquet", name)
    assert new in got.columns and old not in got.columns
    assert got[new].tolist() == df[old].tolist()


def test_a_schema_2_table_is_read_as_written(tmp_path):
    """Only schema 1 is renamed: a schema-2 table under an old name keeps it, so a required column is missing."""
    df = pd.DataFrame({c: [0] for c in records.TABLE_COLUMNS["interventions"]}).rename(columns={"norm_layer": "layer"})
    _write(df, tmp_path / "iv.parquet", "interventions", 2)
    with pytest.raises(BadRunError, match=r"missing columns \['norm_layer'\]"):
        read_table(tmp_path / "iv.parquet", "interventions")
    av = pd.DataFrame({c: [0] for c in records.TABLE_COLUMNS["averaging"]} | {"lag_median_abs_sigma": [0.25]})
    _write(av, tmp_path / "av.parquet", "averaging", 2)
    assert "lag_network_median_abs_sigma" not in read_table(tmp_path / "av.parquet", "averaging").columns


def test_a_committed_schema_1_run_reads_under_the_new_names():
    run = load_run(ROOT / "results/reference/runs/adam/seed=0", tables=("checks", "interventions", "averaging"))
    assert run.info["schema_version"] == 1
    iv, av = run.tables["interventions"], run.tables["averaging"]
    assert "layer" not in iv.columns and set(iv.loc[iv["intervention"] == "layer", "norm_layer"]) == {"bn1", "bn2",
                                                                                                        "bn3"}
    assert "lag_median_abs_sigma" not in av.columns and av["lag_network_median_abs_sigma"].notna().all()
    assert not math.isnan(float(av["lag_network_median_abs_sigma"].median()))


# ----------------------------------------------------------------------------- a report names its runs' schema versions
def test_schema_versions_in_words():
    assert schema_versions([1, 1]) == "schema version 1" and schema_versions([]) == "schema version ?"
    assert schema_versions([2, 1, "2"]) == "schema versions 1 and 2"


def test_the_table_of_schema_1_runs_says_schema_1_and_of_mixed_runs_both():
    """The suite writes schema 2; a table of the committed schema-1 runs still says what its runs hold."""
    old = load_run(ROOT / "results/reference/runs/sgd/seed=0")
    assert records.SCHEMA_VERSION == 2 and old.info["schema_version"] == 1
    assert "(schema version 1)" in table.to_markdown(table.build_table([old]), ROOT)
    new = dataclasses.replace(old, info={**old.info, "seed": 1, "schema_version": 2}, derived={})
    lines = table.build_table([old, new])
    assert lines["schema_version"].tolist() == ["1,2"]
    assert "(schema versions 1 and 2)" in table.to_markdown(lines, ROOT)
