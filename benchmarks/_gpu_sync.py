"""The GPU record's sync row (``gpu.py``): does a warm eager step of each selection rule wait
for the GPU on the host?

Each rule's step (the record's ResNet-18 for Selective Backprop's policies, its language model
for token selection) runs three warm steps, then two more under
``torch.cuda.set_sync_debug_mode("error")``, which raises at the first synchronising CUDA
call (a ``.item()``, a ``nonzero``, a blocking copy in either direction). The row says
``sync-free``, or where the first sync was called from: the innermost frame of the
traceback outside torch. The keys live on the device, except in the ``CPU key`` row (sbfunc's
default key, whose noise is drawn on the host and copied over). Jiang's and Loshchilov's
rules are documented to sync (the kept count; the count of rows to score: see the compile
how-to's "Where a step reads the device"). Off CUDA the debug mode does not exist: the steps
still run (so the row's code runs in the CPU smoke) and the row says so."""

from __future__ import annotations

import copy
import functools
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from _gpu_budget import Bound, Config, Runner, Step, failure
from _gpu_lm import sbfunc_row
from _gpu_resnet import CLASSES, EAGER_S, data, model, sizes
from _steps import KEEP, sbfunc_runner

from sbfunc import policies as P

WARM, CHECKED = 3, 2
FREE, DOCUMENTED = "sync-free", "syncs (documented)"
ROOT = Path(__file__).resolve().parents[1]


class Rule(NamedTuple):
    name: str
    expected: str
    build: Callable[[], Step]


def _sb(cfg: Config, policy: Callable[[], Any] | None, key_device: torch.device | None) -> Step:
    """The ResNet's eager step with Selective Backprop of ``policy()`` on ``(x, y, ids)``
    batches (``None``: the plain step); the key on ``key_device`` (default: the device)."""
    batch = sizes(cfg).batches[0]
    m = copy.deepcopy(model(cfg))
    variant, options = ("plain", {}) if policy is None else ("SB", {"policy": policy(), "ids": 2})
    advance = sbfunc_runner(
        m, variant, CLASSES, "eager", device=cfg.device, precision=cfg.precision,
        backend=cfg.backend, key_device=key_device or cfg.device, **options,
    )  # fmt: skip
    return Bound(advance, data(cfg, batch, ids=True))


def rules(cfg: Config) -> list[Rule]:
    n, width, cpu = sizes(cfg).batches[0], sizes(cfg).width, torch.device("cpu")
    table = functools.partial(torch.zeros, n, device=cfg.device)  # per-id losses, on the device
    sb = functools.partial(_sb, cfg)
    policies: dict[str, tuple[str, Callable[[], Any]]] = {
        "`top_k(0.5)`": (FREE, lambda: P.top_k(KEEP)),
        "Jiang, `jiang_cdf(1.0)`": (DOCUMENTED + ": the kept count", lambda: P.jiang_cdf(1.0)),
        "Loshchilov, `loshchilov(100, 0.5, max_age=2)`": (
            DOCUMENTED + ": the count of rows to score",
            lambda: P.loshchilov(100.0, KEEP, num_ids=n, max_age=2),
        ),
        "DivBS, `divbs(0.5)`": (FREE, lambda: P.divbs(KEEP)),
        "Bayesian, `bayesian(0.5)`": (FREE, lambda: P.bayesian(
            KEEP, num_features=8 * width, num_classes=CLASSES, reference_losses=table())),
        "RHO-LOSS, `rho_loss(0.5)`": (FREE, lambda: P.rho_loss(KEEP, table())),
    }  # fmt: skip
    found = [
        Rule("plain (no selection)", FREE, lambda: sb(None, None)),
        Rule("rank-power (SB's default)", FREE, lambda: sb(lambda: P.rank_power(KEEP), None)),
        Rule("rank-power, CPU key", "noise drawn on the host, copied to the device",
             lambda: sb(lambda: P.rank_power(KEEP), cpu)),
    ]  # fmt: skip
    found += [Rule(k, e, functools.partial(sb, p, None)) for k, (e, p) in policies.items()]
    for variant in ("uniform", "excess"):
        name = f'`TokenSelection(0.6, score="{variant}")` (the language model)'
        build = functools.partial(sbfunc_row, cfg, variant, "eager", cfg.device)
        found.append(Rule(name, FREE, build))
    return found


def site(e: BaseException) -> str:
    """Where ``e`` was called from, ``path:line (function)``: the innermost frame of its
    traceback in this repository (sbfunc's code), else the innermost outside torch."""
    torch_dir = Path(torch.__file__).resolve().parent
    frames = [(Path(f.filename).resolve(), f) for f in traceback.extract_tb(e.__traceback__)]
    outside = [(path, f) for path, f in frames if not path.is_relative_to(torch_dir)]
    ours = [(path, f) for path, f in outside if path.is_relative_to(ROOT)]
    if not outside:
        return "inside torch"
    path, frame = (ours or outside)[-1]
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return f"`{shown}:{frame.lineno}` (`{frame.name}`)"


def _sync_error(e: BaseException | None) -> BaseException | None:
    """The sync debug mode's error in ``e``'s chain (a library may wrap it), if any."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, RuntimeError) and "synchroniz" in str(e):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def check(step: Step, device: torch.device) -> str:
    """Warm ``step`` up, then run it under the sync debug mode: ``sync-free`` or the site."""
    for _ in range(WARM):
        step()
    if device.type != "cuda":
        return f"not checked: `set_sync_debug_mode` needs CUDA ({WARM} eager steps ran)"
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(CHECKED):
            step()
    except Exception as e:
        sync = _sync_error(e)
        if sync is None:
            raise
        return f"**syncs** at {site(sync)}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize(device)
    return f"{FREE} ({CHECKED} warm steps)"


def run(cfg: Config, runner: Runner) -> tuple[list[str], list[str]]:
    """The sync table: every rule checked in turn, while the budget lasts."""
    estimate = EAGER_S * (0.2 if cfg.quick else 1.0)
    batch = sizes(cfg).batches[0]
    lines = [
        "### Host syncs of a warm eager step, per selection rule",
        "",
        f"ResNet-18 at batch {batch} (keep {KEEP}) and the language model above; keys on the "
        f"device unless named; {WARM} warm steps, then {CHECKED} under "
        '`torch.cuda.set_sync_debug_mode("error")`.',
        "",
        "| rule | expected | result |",
        "|---|---|---|",
    ]
    for rule in rules(cfg):
        if not runner.fits(estimate):
            result = runner.skip(estimate).note
        else:
            try:
                result = check(rule.build(), cfg.device)
            except Exception as e:
                result = failure(e)
        lines.append(f"| {rule.name} | {rule.expected} | {result} |")
    return [*lines, ""], []
