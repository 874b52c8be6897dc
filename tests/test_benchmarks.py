"""The benchmark harness: ``benchmarks/gpu.py --device cpu --quick`` runs to its tables (the CI
smoke run of the GPU benchmark), and the shared pieces it is built from behave."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _models import resnet18  # noqa: E402
from _steps import hand_runner  # noqa: E402
from _timing import interleaved  # noqa: E402

NO_PRECISION = "precision= not available"  # the one documented FAILED row (gpu.py)


def run_script(*args: str) -> subprocess.CompletedProcess:
    """Run a benchmark script from the repository root; fail with its output's tail."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=dict(os.environ), capture_output=True,
        text=True, timeout=600,  # only stops a hung run
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow  # about 50 s on 2 shared cores
def test_gpu_benchmark_quick_cpu_smoke(tmp_path):
    out = tmp_path / "gpu.md"
    proc = run_script("benchmarks/gpu.py", "--device", "cpu", "--quick", "--out", str(out))
    text = out.read_text()
    assert text.startswith("## GPU benchmark: ")
    head = "| row | ms/step median [IQR] | vs loop [IQR] | vs hand compiled [IQR] | peak MiB |"
    assert text.count(head) == 4  # two models x two precisions
    assert "| quantity | method | ms/call median [IQR] | vs sbfunc [IQR] | peak MiB |" in text
    for row in ("torch.optim loop", "hand compiled plain", "sbfunc compile() plain"):
        assert re.search(rf"^\| {re.escape(row)} \| \d", text, re.M), row
    failed = [ln for ln in text.splitlines() if "FAILED" in ln and NO_PRECISION not in ln]
    assert not failed, failed
    assert proc.stdout.strip().endswith(text.strip().splitlines()[-1])


def test_interleaved_syncs_around_every_timed_block():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    t = interleaved(fns, 3, 2, warmup=1, sync=lambda: calls.append("sync"))
    assert {k: len(v) for k, v in t.items()} == {"a": 3, "b": 3}
    assert calls[:2] == ["a", "b"]  # warm-up: no syncs
    assert calls[2:6] == ["sync", "a", "a", "sync"]
    assert calls.count("sync") == 2 * 3 * 2


def test_resnet18_is_resnet18_sized():
    assert sum(p.numel() for p in resnet18().parameters()) == 11_173_962
    assert resnet18(width=2)(torch.randn(3, 3, 8, 8)).shape == (3, 10)
    with pytest.raises(ValueError, match="width"):
        resnet18(width=0)


def test_hand_step_with_batchnorm_leaves_the_module_alone():
    torch.manual_seed(0)
    model = resnet18(width=2)
    before = {n: b.clone() for n, b in model.named_buffers()}
    advance = hand_runner(model, "rank-power", False, 4, precision="amp_bf16")
    for _ in range(2):
        advance((torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))))
    for n, b in model.named_buffers():
        torch.testing.assert_close(b, before[n], msg=n)


@pytest.mark.slow  # about 10 s on 2 shared cores (eager steps)
def test_selection_field_smoke(tmp_path):
    proc = run_script(
        "benchmarks/selection_field.py", "--smoke", "--write", "--out", str(tmp_path)
    )
    text = (tmp_path / "selection_field.md").read_text()
    assert text in proc.stdout
    assert "Target: full training's mean final accuracy minus 2 pp" in text
    methods = ["full", "uniform", "top_k", "rank_power", "grad_norm", "loshchilov", "rho_loss",
               "infobatch", "divbs", "bayesian"]  # fmt: skip
    for m in methods:
        assert re.search(rf"^\| {m} \| (all|0\.2) \| \d", text, re.M), m
    for m in methods[2:]:
        assert re.search(rf"^- `{m}` vs uniform: .* (beats|ties|loses) \(", text, re.M), m
    lines = (tmp_path / "selection_field.csv").read_text().splitlines()
    assert len(lines) == 1 + len(methods)  # header, one run per method


@pytest.mark.slow  # a few seconds (eager steps)
@pytest.mark.parametrize("model", ["cnn", "resnet18"])
def test_selection_overhead_smoke(model):
    proc = run_script("benchmarks/selection_overhead.py", "--quick", "--model", model)
    assert f"{model} width 8 on cpu" in proc.stdout
    for rule in ("plain", "uniform", "divbs", "bayesian", "bayesian_s32"):
        assert re.search(rf"^\| {rule} \| [\d.]+ \| [\d.]+ \[", proc.stdout, re.M), rule


def _run(method: str, chunk_walls: list[float]) -> dict:
    walls = [sum(chunk_walls[: i + 1]) for i in range(len(chunk_walls))]
    curve = [(w, w, 0, 0, 0.9) for w in walls]
    return {"method": method, "seed": 0, "noise": 0.0, "wall_s": walls[-1], "curve": curve}


def test_whole_run_prediction_pairs_the_chunks_inside_the_window():
    from _tta_report import _prediction_verdict, in_run_ratio

    stops = [10, 20, 30, 40]  # SB's window starts at step 10 (start 0.25): chunks 1-3
    plain = _run("plain", [1.0, 1.0, 1.2, 1.0])
    sb = _run("rank_power", [1.0, 0.5, 0.6, 0.5])  # the ratio is 0.5 in every chunk inside
    assert in_run_ratio(sb, plain, stops, 0.25) == pytest.approx(0.5)
    verdict = _prediction_verdict([plain, sb], {}, 0.25, "rank_power", stops)
    assert verdict.startswith("MET**") and "0.62x predicted" in verdict  # 0.25 + 0.75 * 0.5
    slow = _run("rank_power", [1.0, 0.5, 0.6, 1.5])  # a slow last chunk: the run loses
    assert _prediction_verdict([plain, slow], {}, 0.25, "rank_power", stops).startswith("MISS")


@pytest.mark.slow  # a few seconds: eager steps at the study's quick sizes
def test_run_vs_step_smoke():
    proc = run_script(
        "benchmarks/run_vs_step.py", "--quick", "--eager", "--rounds", "1", "--grains", "run",
        "--methods", "loshchilov_noage", "--threads", "1",
    )  # fmt: skip
    assert re.search(r"^run +plain [\d.]+ s, loshchilov_noage [\d.]+ s$", proc.stdout, re.M)
    assert re.search(r"^ +loshchilov_noage / plain [\d.]+ \[", proc.stdout, re.M)
    assert "run's predicted ratio" in proc.stdout
