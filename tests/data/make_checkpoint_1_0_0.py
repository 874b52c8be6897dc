"""Write a small checkpoint with sbfunc 1.0.0 (kept as test data for 1.1's loading test)."""

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc

assert sbfunc.__version__ == "1.0.0", sbfunc.__file__
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0)
smooth = sbfunc.algorithms.LabelSmoothing(0.1, num_classes=3)
ema = sbfunc.algorithms.EMA(half_life="2ba")
step = sbfunc.make_train_step(
    loss_fn, sbfunc.optim.adamw(1e-2), [sbfunc.sequence(sb, smooth), ema]
)
params, buffers = sbfunc.split_module(model, clone=True)
state = step.init(params, buffers, key=sbfunc.random.key(0), total_steps=10)
g = torch.Generator().manual_seed(1)
for _ in range(3):
    x = torch.randn(16, 4, generator=g)
    y = torch.randint(0, 3, (16,), generator=g)
    state, m = step(state, (x, y))
sbfunc.checkpoint.save(state, "/work/main/tests/data/checkpoint_1_0_0.ckpt")
print(state.time, m.loss)
