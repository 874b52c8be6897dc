"""The benchmarks' two protocols (issue 37, item 4): under ``equal-backprop`` plain loads the
backprop batch and a selecting method ``candidate_batch_size(batch, keep)`` candidates; the
smoke runs of both studies write the protocol's own files and say which protocol ran."""

import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc.select import kept_count
from tests.test_benchmarks import run_script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _tta_protocol import (  # noqa: E402
    EQUAL_BACKPROP,
    EQUAL_CANDIDATES,
    method_config,
    output_stem,
)
from _tta_regime import epoch_ratios  # noqa: E402


@dataclass(frozen=True)
class Cfg:
    train: int = 8000
    batch: int = 256
    keep: float = 0.5


@settings(max_examples=100, deadline=None)
@given(b=st.integers(1, 256), keep=st.floats(0.05, 1.0))
def test_equal_backprop_loads_candidates_that_keep_the_plain_batch(b, keep):
    cfg = Cfg(train=100_000, batch=b, keep=keep)
    assert method_config(cfg, "plain", EQUAL_BACKPROP) == cfg
    loaded = method_config(cfg, "rank_power", EQUAL_BACKPROP)
    assert kept_count(loaded.batch, keep) == b
    assert method_config(cfg, "top_k", EQUAL_BACKPROP, keep=0.25).batch == 4 * b
    assert (loaded.train, loaded.keep) == (cfg.train, cfg.keep)  # only the batch changes


@pytest.mark.parametrize("method", ["plain", "rank_power", "jiang_var", "infobatch"])
def test_equal_candidates_loads_the_same_batch_for_every_method(method):
    assert method_config(Cfg(), method, EQUAL_CANDIDATES) == Cfg()


def test_methods_with_their_own_kept_share_load_for_it():
    cfg = Cfg(keep=0.3)
    assert method_config(cfg, "jiang_var", EQUAL_BACKPROP).batch == 512  # beta=1: half
    assert method_config(cfg, "infobatch", EQUAL_BACKPROP).batch == round(256 / 0.65)
    assert method_config(cfg, "loshchilov_k0.3", EQUAL_BACKPROP, keep=0.9).batch == 854


def test_the_protocol_and_the_rows_are_checked():
    with pytest.raises(ValueError, match="protocol must be one of"):
        method_config(Cfg(), "rank_power", "equal-steps")
    with pytest.raises(ValueError, match="exceeds the 1000 training rows"):
        method_config(Cfg(train=1000), "rank_power", EQUAL_BACKPROP, keep=0.1)


def test_the_outputs_of_each_protocol_have_their_own_names():
    assert output_stem("time_to_accuracy", EQUAL_CANDIDATES) == "time_to_accuracy"
    stem = output_stem("selection_field", EQUAL_BACKPROP)
    assert stem == "selection_field_equal_backprop"


def test_the_regime_ratios_are_per_epoch():
    times = {"T_full": [1.0], "T_kept": [0.5], "T_score": [0.5], "T_sb[rank_power]": [1.6]}
    same = epoch_ratios(times, 1.0)  # same loader batches: per step
    assert same["ideal"] == 1.0 and same["T_full/T_sb[rank_power]"] == 0.625
    half = epoch_ratios(times, 0.5)  # SB loads twice the rows: half the steps an epoch
    assert half["ideal"] == 2.0 and half["T_full/T_sb[rank_power]"] == 1.25
    assert "per epoch: 0.5 SB steps" in half["note"] and "per epoch" not in same["note"]


@pytest.mark.slow  # about 10 s on 2 shared cores (eager steps)
def test_selection_field_smoke_under_equal_backprop(tmp_path):
    run_script(
        "benchmarks/selection_field.py", "--smoke", "--protocol", "equal-backprop", "--write",
        "--out", str(tmp_path), "--methods", "plain", "random", "rank_power", "loshchilov",
    )  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "selection_field_equal_backprop.csv", "selection_field_equal_backprop.md"
    ]  # fmt: skip
    text = (tmp_path / "selection_field_equal_backprop.md").read_text()
    assert text.startswith("# The field's comparison table on MNIST-1D, equal backprop batch")
    assert "- Protocol `equal-backprop`" in text
    assert "'batch': 32" in text and "'rank_power@0.2': 160" in text  # 32 of 160 candidates
    for m in ("uniform", "rank_power", "loshchilov"):  # fixed-count: 20% of the candidates
        assert re.search(rf"^\| {m} \| 0\.2 \| .* \| 20 ± 0 \| [\d.]+ ± [\d.]+ \|$", text, re.M)


@pytest.mark.slow  # about 12 s on 2 shared cores (eager steps)
def test_time_to_accuracy_smoke_under_equal_backprop(tmp_path):
    run_script(
        "benchmarks/time_to_accuracy.py", "--quick", "--eager", "--protocol", "equal-backprop",
        "--methods", "rank_power", "loshchilov_noage", "--noises", "0.0", "--out", str(tmp_path),
    )  # fmt: skip
    stem = "time_to_accuracy_equal_backprop"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{stem}.{e}" for e in ("csv", "md", "png")
    ]
    text = (tmp_path / f"{stem}.md").read_text()
    assert "- Protocol `equal-backprop`" in text
    assert "`{'plain': 128, 'rank_power': 256, 'loshchilov_noage': 256}`" in text
    assert "(c) issue 37, equal backprop batch: some rule reaches" in text
    assert "(d) issue 28's whole-run prediction: not measured here" in text
    assert f"[`{stem}.csv`]({stem}.csv)" in text and f"]({stem}.png)" in text
    with (tmp_path / f"{stem}.csv").open() as f:
        runs = {r["method"]: r for r in csv.DictReader(f)}
    # 2 epochs of 1024 rows: plain 16 steps of 128; SB 8 steps of 256 candidates, the first
    # before the window (start 0.1) backpropagating all 256, the other 7 backpropagating 128
    assert int(runs["plain"]["backprop_samples"]) == 16 * 128
    assert int(runs["rank_power"]["backprop_samples"]) == 256 + 7 * 128
    assert int(runs["rank_power"]["forward_samples"]) == 256 + 7 * (256 + 128)  # scoring too
