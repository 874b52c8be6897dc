"""``sbfunc._tracing``: whether code may read a tensor on the host (a plain eager CPU tensor)."""

import torch

from sbfunc._tracing import host_readable


def test_host_readable_only_for_plain_eager_cpu_tensors():
    t = torch.tensor([1, 2])
    assert host_readable(t)
    assert not host_readable(torch.empty(2, device="meta"))
    seen = []
    torch.func.vmap(lambda x: seen.append(host_readable(t)) or x)(torch.zeros(2))
    assert seen == [False]
