"""Pure optimizers on torch's own foreach kernels, and schedules of their hyperparameters.

``opt = sbfunc.optim.adam(1e-3)``; ``state = opt.init(params)``;
``new_params, new_state = opt.update(grads, state, params)``. Parameters and gradients are
``dict[str, Tensor]``; ``update`` returns the new parameters (one fused foreach kernel per
quantity, as ``torch.optim`` does) and never modifies its inputs. The numbers match
``torch.optim.SGD``/``Adam``/``AdamW`` and Composer's ``DecoupledSGDW``/``DecoupledAdamW``.
A learning rate (or weight decay) may be a schedule, a function of the state's step count
evaluated with tensor ops, so a compiled step compiles once.

``update`` is differentiable (torch.func can differentiate through it); call it under
``torch.no_grad()`` when the parameters require grad and no gradient through the step is wanted.
"""

from sbfunc.optim._adam import AdamState, adam, adamw, decoupled_adamw
from sbfunc.optim._base import Optimizer
from sbfunc.optim._join import join_schedules, warmup_cosine_decay_schedule
from sbfunc.optim._schedules import (
    Schedule,
    constant_schedule,
    cosine_decay_schedule,
    exponential_decay,
    linear_schedule,
    piecewise_constant_schedule,
)
from sbfunc.optim._sgd import SGDState, decoupled_sgdw, sgd

__all__ = [
    "AdamState",
    "Optimizer",
    "SGDState",
    "Schedule",
    "adam",
    "adamw",
    "constant_schedule",
    "cosine_decay_schedule",
    "decoupled_adamw",
    "decoupled_sgdw",
    "exponential_decay",
    "join_schedules",
    "linear_schedule",
    "piecewise_constant_schedule",
    "sgd",
    "warmup_cosine_decay_schedule",
]
