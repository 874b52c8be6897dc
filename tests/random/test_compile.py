import torch
import torch.nn.functional as F

from sbfunc import random as sbrandom


def test_keys_noise_and_keyed_ops_compile_fullgraph_and_match_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5))
    x, q = torch.randn(3, 4), torch.randn(1, 2, 3, 4)

    def step(key, step_count):
        k = sbrandom.fold_in(key, step_count)  # a tensor step: no recompilation per step
        k_model, k_noise = sbrandom.split(k)
        with sbrandom.keyed(k_model):
            y = model(x)
            attention = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
            r = torch.rand(2)
        u = sbrandom.uniform(k_noise, (5,))
        z = sbrandom.normal(k_noise, (5,))
        b = sbrandom.bernoulli(k_noise, 0.3, (5,))
        return y, attention, r, u, z, b

    compiled = torch.compile(step, fullgraph=True)
    key = sbrandom.key(0)
    for i in (3, 4):
        got, expected = compiled(key, torch.tensor(i)), step(key, torch.tensor(i))
        for g, e in zip(got, expected, strict=True):
            if e.dtype == torch.bool:
                assert torch.equal(g, e)
            else:
                torch.testing.assert_close(g, e)
        assert torch.equal(got[0] == 0, expected[0] == 0)  # the same dropout mask
        assert torch.equal(got[2], expected[2]) and torch.equal(got[3], expected[3])  # bitwise
    assert not torch.equal(compiled(key, torch.tensor(3))[3], compiled(key, torch.tensor(4))[3])
