"""The benchmark harness: ``benchmarks/gpu.py --device cpu --quick`` runs to its page (the CI
smoke run of the GPU record), its budget skips, fails and aborts rows as it says, and the
shared pieces it is built from behave."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_readme import NAME, resolve

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _gpu_budget import Outcome, Row, Runner, combined, fixed, table, verdict  # noqa: E402
from _gpu_sync import check, site  # noqa: E402
from _models import resnet18  # noqa: E402
from _steps import GraphStep, hand_runner  # noqa: E402
from _timing import interleaved  # noqa: E402
from gpu import command  # noqa: E402

CPU = torch.device("cpu")


def run_script(*args: str) -> subprocess.CompletedProcess:
    """Run a benchmark script from the repository root; fail with its output's tail."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=dict(os.environ), capture_output=True,
        text=True, timeout=600,  # only stops a hung run
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def timed_row(text: str, row: str) -> bool:
    """Whether the page has ``row`` with a measured time (not SKIPPED, FAILED, ABORTED)."""
    return re.search(rf"^\| {re.escape(row)} \| \d", text, re.M) is not None


@pytest.mark.slow  # about 30 s on 2 shared cores
def test_gpu_record_quick_cpu_smoke(tmp_path):
    out = tmp_path / "gpu.md"
    proc = run_script("benchmarks/gpu.py", "--device", "cpu", "--quick", "--out", str(out))
    text = out.read_text()
    assert text.startswith("# GPU record: CPU smoke run, not a record\n")
    assert "Command: `python benchmarks/gpu.py --device cpu --quick`" in text
    lm = ["hand loop", "sbfunc plain", 'sbfunc TokenSelection(0.6, "uniform")',
          'sbfunc TokenSelection(0.6, "excess", same-size reference)',
          "hand loop, compiled", "sbfunc compile() plain"]  # fmt: skip
    resnet = ["torch.optim loop", "hand SB loop", "sbfunc SB", "score forward",
              "loop on the 8 kept rows", "loop on the 16 kept rows",
              "ideal (score forward + loop on the kept rows)"]  # fmt: skip
    for row in lm + resnet:
        assert timed_row(text, row), row
    assert text.count("### ResNet-18 (width 8), eager: batch") == 2
    assert re.search(r"^\| sbfunc compile\(\) plain \| .*\| [\d.]+ \|$", text, re.M)  # compile s
    assert text.count("not checked: `set_sync_debug_mode` needs CUDA (3 eager steps ran)") == 11
    targets = text[text.index("## Targets") :]
    assert len(re.findall(r"^- .*: \*\*(met|missed)\*\* \(", targets, re.M)) == 3
    bad = [ln for ln in text.splitlines() if re.search("FAILED|SKIPPED|ABORTED|not measured", ln)]
    assert not bad, bad
    assert proc.stdout.strip().endswith(text.strip().splitlines()[-1])
    names = {n for n in NAME.findall(text) if not n.endswith((".md", ".py"))}
    for name in names:  # the page is committed under docs/: its sbfunc names must exist
        resolve(name)


@pytest.mark.slow  # a few seconds: the language model's eager rows under bf16 autocast
def test_gpu_record_bf16_language_model_smoke(tmp_path):
    out = tmp_path / "gpu.md"
    run_script("benchmarks/gpu.py", "--device", "cpu", "--quick", "--precision", "amp_bf16",
               "--phases", "lm", "--out", str(out))  # fmt: skip
    text = out.read_text()
    assert "Precision `amp_bf16` (the forward and loss under bf16 autocast)" in text
    for row in ("hand loop", "sbfunc plain", 'sbfunc TokenSelection(0.6, "uniform")'):
        assert timed_row(text, row), row
    assert "### ResNet-18" not in text


def _runner(budget_s: float | None, **kw) -> Runner:
    return Runner(CPU, budget_s, 3, block_s=0.0, warmup=1, start=time.perf_counter(), **kw)


def test_budget_skips_rows_that_do_not_fit_and_goes_on_after_failures():
    calls = []

    def fails() -> None:
        raise ValueError("no such thing\nsecond line")

    rows = [
        Row("a", lambda: lambda: calls.append("a"), fixed(0.0)),
        Row("too long", lambda: lambda: calls.append("never"), fixed(1e6), compiled=True),
        Row("broken", lambda: fails, fixed(0.0)),
        Row("b", lambda: lambda: calls.append("b"), fixed(0.0), vs=(("vs a", "a"),)),
    ]
    out, rounds, inner = _runner(60.0, reserve_s=0.0).run(rows)
    assert out["too long"].note.startswith("SKIPPED (budget): est. 1000000 s, ")
    assert out["broken"].note == "FAILED: ValueError: no such thing"
    assert len(out["a"].times) == len(out["b"].times) == rounds == 3 and inner == 1
    assert "never" not in calls
    lines = table("t", [(r.name, r.vs) for r in rows], out, rounds, inner)
    assert (
        lines[4] == "| row | ms/step median [IQR] | vs a [IQR] | peak MiB | held MiB | compile s |"
    )
    assert any(ln.startswith("| too long | SKIPPED (budget): est.") for ln in lines)
    assert verdict("b fast", out, "b", "a", 1e9).startswith("- b fast: **met** (")
    assert verdict("b", out, "broken", "a", 1.0) == (
        "- b: **not measured** (`broken`: FAILED: ValueError: no such thing)"
    )


def test_budget_aborts_a_compile_past_its_deadline():
    def slow_build():
        time.sleep(30)
        return lambda: None

    runner = _runner(0.2, reserve_s=0.0, grace_s=0.1)
    t0 = time.perf_counter()
    out, _, _ = runner.run([Row("slow", slow_build, fixed(0.0), compiled=True)])
    assert time.perf_counter() - t0 < 10
    assert out["slow"].note.startswith("ABORTED (budget)")


def test_combined_rows_sum_their_parts_per_round():
    out = {"x": Outcome([1.0, 2.0]), "y": Outcome([0.5, 0.5]), "z": Outcome([], "FAILED: e")}
    assert combined(out, ["x", "y"]).times == [1.5, 2.5]
    assert combined(out, ["x", "z"]).note == "not measured: z"


@given(
    steps=st.lists(st.floats(1e-6, 10.0), min_size=1, max_size=8),
    block_s=st.floats(0.0, 1.0),
    budget_s=st.floats(1.0, 1e4),
    rounds=st.integers(1, 30),
)
@settings(max_examples=50, deadline=None, derandomize=True, database=None)
def test_rounds_and_block_sizes_stay_in_their_bounds(steps, block_s, budget_s, rounds):
    runner = Runner(CPU, budget_s, rounds, block_s=block_s, warmup=1, start=time.perf_counter())
    inner = runner.inner(steps)
    assert 1 <= inner <= 10
    fitted = runner.rounds_for(dict(enumerate(steps)), inner)
    assert min(rounds, 3) <= fitted <= rounds


def test_sync_site_is_the_innermost_frame_outside_torch():
    def reads_the_device():
        return torch.tensor([1.0, 2.0]).item()  # raises inside torch

    with pytest.raises(RuntimeError) as info:
        reads_the_device()
    assert site(info.value) == (
        f"`tests/test_benchmarks.py:{reads_the_device.__code__.co_firstlineno + 1}` "
        "(`reads_the_device`)"
    )
    calls = []
    assert check(lambda: calls.append(1), CPU).startswith("not checked: ")
    assert len(calls) == 3


def test_the_page_records_its_command_without_the_output_path():
    assert command(["--quick", "--out", "/tmp/x.md", "--full"]) == (
        "python benchmarks/gpu.py --quick --full"
    )
    assert command(["--out=/tmp/x.md"]) == "python benchmarks/gpu.py"


def test_a_graph_step_settles_its_state_out_of_the_graphs_memory():
    step = GraphStep(lambda state, batch: ((state[0] + batch, state[1]), None), (torch.ones(2), 3))
    step(torch.ones(2))
    before = step.state[0]
    step.settle()
    assert step.state[0].data_ptr() != before.data_ptr() and step.state[1] == 3
    torch.testing.assert_close(step.state[0], torch.full((2,), 2.0))


def test_interleaved_settles_after_each_warm_up_and_timed_block():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    interleaved(fns, 2, 2, warmup=1, after={"a": lambda: calls.append("settle a")})
    assert calls == ["a", "settle a", "b"] + ["a", "a", "settle a", "b", "b"] * 2


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
