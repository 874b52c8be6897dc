"""Compiling a training step: ``step.compile()``, ``torch.compile(step)`` and the guards kept.

A step is ``plan`` (host decisions), ``core`` (the tensor work) and ``finish`` (the host
clock). :class:`CompilableStep`, the base of :class:`sbfunc.step.TrainStep`, holds what
compiling needs and nothing of the step's meaning:

* the **host/core split**: ``step.compile()`` compiles ``core`` alone and runs ``plan`` and
  ``finish`` as plain Python around it (one compiled frame per step, one graph per plan);
  under ``torch.compile(step)`` the compiler traces ``__call__`` instead, with ``plan`` and
  ``finish`` excluded by ``torch.compiler.disable`` (two compiled frames around the two host
  calls, the same graph of the core per plan, no other graph break). Either way a text field
  (a list of strings) reaches the compiled core as row indices
  (:func:`sbfunc.batch.strings_as_row_indices`), so new strings never recompile it;
* **cache separation**: ``torch.compile`` caches graphs per code object, so every step gets
  its own copy of the traced methods (``__call__`` and ``core``) and a call never checks the
  guards of another step's graphs;
* the **nn.Module base**: ``torch.compile(step)`` of a module returns a module that forwards
  attribute access, so the compiled step still has ``init`` and ``run_event``;
* the **guard filter** (:func:`drop_library_globals`): ``torch.compile`` guards every global a
  traced function reads. Tracing a step reads hundreds of them in sbfunc's and torch's own
  modules (833 global guards for a Selective Backprop step, about as many as every other guard
  together), fixed once the library is imported, and checking them on every call costs more
  than a small model's arithmetic. The filter drops exactly those and keeps every guard on the
  step's inputs and on globals of any other module (a model's ``forward``, an algorithm of
  yours), which still recompile when they change; patching sbfunc or torch after compiling is
  not seen (``step.compile(library_guards=True)`` keeps every guard).

More in ``docs/how-to/compile.md``.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from sbfunc.batch import strings_as_row_indices
from sbfunc.engine import TrainState
from sbfunc.engine.internal import Carry
from sbfunc.step._records import CoreOutputs, StepMetrics, StepPlan
from sbfunc.types import PerSample

__all__ = ["CompilableStep", "compile_options", "drop_library_globals", "library_global"]

_LIBRARIES = ("sbfunc", "torch", "optree", "kornia")
_IMPORT = re.compile(r"G\['__import_(\w+?)'\]")
_ROOT = re.compile(r"G\['([^']+)'\]")
_ROOT_MODULE = "sbfunc.step._train_step"  # the module of the compiled core (its G[...] globals)
# the methods torch.compile traces as frames of their own (``core`` too: a graph break inside
# it makes resume functions from its code)
_TRACED = ("__call__", "compiled_body", "core")


class CompilableStep(nn.Module):
    """``step(state, batch)``: the host ``plan``, the tensor ``core``, the host ``finish``,
    eagerly or compiled (see the module docs); a subclass defines the three parts.

    An ``nn.Module`` only so that ``torch.compile(step)`` returns a module that still has the
    step's other methods (``init``, ``run_event``): a compiled module forwards attribute access, a
    compiled plain callable does not. It has no parameters of its own.
    """

    per_sample: PerSample

    def __init__(self) -> None:
        super().__init__()
        for name in _TRACED:  # this step's own code objects: its own compile cache entries
            fn = getattr(type(self), name)
            own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)
            setattr(self, name, types.MethodType(own, self))
        self.compiled_core: Any = None  # set by compile()

    def plan(self, state: TrainState, batch: Any) -> StepPlan:
        """The host decisions of one step (excluded from compilation)."""
        raise NotImplementedError

    def core(self, plan: StepPlan, state: TrainState, batch: Any) -> tuple[Carry, CoreOutputs]:
        """The tensor work of one step under ``plan`` (what compiles)."""
        raise NotImplementedError

    def finish(
        self, state: TrainState, carry: Carry, out: CoreOutputs
    ) -> tuple[TrainState, StepMetrics]:
        """The new state and the metrics (excluded from compilation)."""
        raise NotImplementedError

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, StepMetrics]:
        """One training step on ``batch``: ``plan``, ``core``, ``finish``.

        After :meth:`compile` the core is the compiled one; ``torch.compile(step)`` traces
        this method itself, with ``plan`` and ``finish`` excluded (see the module docs).
        """
        if torch.compiler.is_compiling():  # the host parts stay out of the graph (wrapped
            # here, not at construction: torch.compiler.disable imports torch._dynamo)
            plan, batch = torch.compiler.disable(self._prepare)(state, batch, True)
            carry, out = self.compiled_body(plan, state, batch)
            return torch.compiler.disable(self.finish)(state, carry, out)
        if self.compiled_core is not None:  # step.compile(): host plan, compiled core
            plan, batch = self._prepare(state, batch, True)
            carry, out = self.compiled_core(plan, state, batch)
        else:
            plan = self.plan(state, batch)
            carry, out = self.core(plan, state, batch)
        return self.finish(state, carry, out)

    def compiled_body(
        self, plan: StepPlan, state: TrainState, batch: Any
    ) -> tuple[Carry, CoreOutputs]:
        """What a compiled step runs: :meth:`core`, returning only what :meth:`finish` reads
        (:meth:`~sbfunc.engine.Carry.outliving`). A graph's outputs are materialised, so
        returning the step's per-batch values (gradients, outputs, losses, the time tensors)
        would cost the compiled step allocations that the fused update otherwise avoids."""
        carry, out = self.core(plan, state, batch)
        return carry.outliving(), out

    def forward(self, state: TrainState, batch: Any) -> tuple[TrainState, StepMetrics]:
        """The same as calling the step (``nn.Module``'s entry point)."""
        return self(state, batch)

    def compile(self, *, library_guards: bool = False, **options: Any) -> None:
        """Compile the step in place: :meth:`core` with ``torch.compile(**options)``, while
        :meth:`plan` and :meth:`finish` run as plain Python around it (``jax.jit`` of the
        pure part). The fastest way to compile a step: one compiled frame per call (the
        core's), where ``torch.compile(step)`` has two (the entry frame and the resume frame
        after the host plan), with the same graphs and results; and the guards on library
        globals left out (:func:`drop_library_globals`), which on small models cost more than
        the step's arithmetic.

        Args:
            library_guards: keep the guards on sbfunc's, torch's and the standard library's
                globals too (``torch.compile``'s default; slower, and only needed if you
                patch those modules between steps).
            **options: passed to ``torch.compile`` (``backend``, ``mode``, ``fullgraph``,
                ``dynamic``, ``options``); a ``guard_filter_fn`` in ``options`` replaces
                the default one (see :func:`compile_options`).

        Raises:
            TypeError: if ``library_guards`` is not a bool.

        Example:
            >>> ce = torch.nn.functional.cross_entropy
            >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), ce)
            >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
            >>> step.compile(backend="eager", fullgraph=True)
            >>> state = step.init(*sbfunc.split_module(torch.nn.Linear(2, 2)),
            ...                   key=sbfunc.random.key(0))
            >>> state, m = step(state, (torch.randn(4, 2), torch.tensor([0, 1, 1, 0])))
            >>> state.time.step
            1

        References:
            ``torch.nn.Module.compile``; ``jax.jit``.
        """
        options = compile_options(options, library_guards=library_guards)
        self.compiled_core = torch.compile(self.compiled_body, **options)

    def _prepare(self, state: TrainState, batch: Any, compiling: bool) -> tuple[StepPlan, Any]:
        """The plan, and under compilation the batch with text fields as row indices (so the
        compiled core never guards on strings)."""
        if compiling:
            batch = strings_as_row_indices(batch, per_sample=self.per_sample)
        return self.plan(state, batch), batch


def _library(module: str) -> bool:
    root = module.split(".")[0]
    return root in _LIBRARIES or root in sys.stdlib_module_names


def library_global(name: str) -> bool:
    """Whether a guard's source ``name`` is a global of a library or standard module (or a
    builtin), rather than of user code.

    Example:
        >>> library_global("G['__import_sbfunc_dot_batch'].torch")
        True
        >>> library_global("G['CoreOutputs']")  # a global of the step's own module
        True
        >>> library_global("G['__import_my_model'].SCALE")
        False
    """
    found = _IMPORT.match(name)
    if found is not None:  # a global reached through an imported module
        return _library(found.group(1).replace("_dot_", "."))
    found = _ROOT.match(name)
    if found is None:
        return False
    root = found.group(1)
    if root.startswith("__builtins_dict__"):
        return True
    module = sys.modules.get(_ROOT_MODULE)
    value = None if module is None else vars(module).get(root)
    return value is not None and _library(getattr(value, "__module__", None) or root)


def drop_library_globals(entries: Sequence[Any]) -> list[bool]:
    """``torch.compile``'s ``guard_filter_fn``: keep every guard but those on library globals
    (see the module docs).

    Example:
        >>> from types import SimpleNamespace as Entry  # torch's GuardFilterEntry has these
        >>> drop_library_globals([Entry(name="G['torch'].sin", is_global=True),
        ...                       Entry(name="L['batch'][0]", is_global=False),
        ...                       Entry(name="G['__import_my_model'].SCALE", is_global=True)])
        [False, True, True]
    """
    return [not (e.is_global and library_global(e.name)) for e in entries]


def compile_options(options: dict[str, Any], *, library_guards: bool) -> dict[str, Any]:
    """``torch.compile`` keyword arguments with :func:`drop_library_globals` as the
    ``guard_filter_fn`` (unless ``library_guards`` or the caller set one).

    The filter travels in inductor's ``options``, which ``torch.compile`` refuses together with
    ``mode``: a ``mode`` alone becomes the options it stands for
    (``torch._inductor.list_mode_options``, as ``torch.compile`` expands it), so
    ``mode="reduce-overhead"`` still means CUDA graphs. With another backend and a ``mode``,
    or with both ``mode`` and ``options``, the arguments pass unchanged (no filter).

    Example:
        >>> opts = compile_options({"mode": "reduce-overhead"}, library_guards=False)
        >>> sorted(opts["options"]), "mode" in opts
        (['guard_filter_fn', 'triton.cudagraphs'], False)
    """
    if not isinstance(library_guards, bool):
        raise TypeError(f"library_guards must be True or False, got {library_guards!r}")
    opts = dict(options)
    if library_guards:
        return opts
    mode = opts.get("mode")
    if mode is not None:
        if opts.get("options") is not None or opts.get("backend", "inductor") != "inductor":
            return opts
        from torch._inductor import list_mode_options

        opts["options"] = dict(list_mode_options(mode, opts.get("dynamic")))
        del opts["mode"]
    inner = dict(opts.get("options") or {})
    inner.setdefault("guard_filter_fn", drop_library_globals)
    opts["options"] = inner
    return opts
