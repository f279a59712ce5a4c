"""Embedding aggregations of FedVS Sec. 2.2 / Fig. 1 (concat, average, max) and the baselines that use them."""

import numpy as np
import pytest
import torch

from fednet.algebra.meter import MacMeter
from fednet.errors import ConfigError
from fednet.learning.vertical import aggregate_embeddings, aggregation_gradient
from fednet.protocol import registry

from test_fedvs_protocol import BASE, N, _sim, _task


def _torch_aggregate(stack: torch.Tensor, how: str, present: np.ndarray) -> torch.Tensor:
    idx = torch.as_tensor(np.flatnonzero(present))
    if how == "average":
        return stack[:, idx].mean(dim=1)
    if how == "max":
        return stack[:, idx].max(dim=1).values
    mask = torch.as_tensor(present, dtype=stack.dtype)[None, :, None]
    return (stack * mask).reshape(stack.shape[0], -1)


@pytest.mark.parametrize("how", ["average", "concat", "max"])
@pytest.mark.parametrize("present", [None, [True, False, True, True, False]])
def test_forward_and_backward_match_torch_autograd(how, present):
    """Forward equals torch's; dL/dH_n of every received client equals autograd's for L = sum(R * H)."""
    rng = np.random.default_rng(1)
    b, n_clients, h = 3, 5, 4
    stack = rng.normal(size=(b, n_clients, h))
    mask = np.ones(n_clients, bool) if present is None else np.array(present)
    with MacMeter() as m:
        H = aggregate_embeddings(stack, how, present)
    assert m.macs == b * h * mask.sum()
    t = torch.tensor(stack, requires_grad=True)
    Ht = _torch_aggregate(t, how, mask)
    np.testing.assert_allclose(H, Ht.detach().numpy(), rtol=0, atol=1e-15)
    assert H.shape == ((b, n_clients * h) if how == "concat" else (b, h))
    R = rng.normal(size=H.shape)
    (Ht * torch.tensor(R)).sum().backward()
    for n in np.flatnonzero(mask):
        np.testing.assert_allclose(aggregation_gradient(R, stack, how, n, present), t.grad[:, n].numpy(),
                                   rtol=0, atol=1e-15)
    if how == "concat" and present is not None:
        assert np.all(H.reshape(b, n_clients, h)[:, ~mask] == 0)     # an ignored client's slot holds zeros
    with pytest.raises(ValueError, match="n must be a received client"):
        aggregation_gradient(R, stack, how, int(np.flatnonzero(~mask)[0]) if (~mask).any() else n_clients, present)


def test_bad_aggregation_arguments_are_named():
    stack = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"aggregation must be one of .* got 'sum'"):
        aggregate_embeddings(stack, "sum")
    with pytest.raises(ValueError, match="present must be 3 booleans"):
        aggregate_embeddings(stack, "max", [True, False])
    with pytest.raises(ValueError, match="at least one client"):
        aggregate_embeddings(stack, "concat", [False] * 3)


@pytest.mark.parametrize("name,value,needle", [
    ("fedvs_wait", "sum", r"aggregation: Input should be 'average', 'concat' or 'max' \(got 'sum'\)"),
    ("fedvs_vafl", "mean", r"aggregation: Input should be 'average', 'concat' or 'max' \(got 'mean'\)"),
    ("fedvs_wait_dp", "concat", r"aggregation: Wait-DP .* must be 'average', got 'concat'"),
    ("fedvs", "max", r"aggregation: FedVS decodes only the sum .* must be 'average', got 'max'"),
])
def test_configs_refuse_bad_or_unsupported_aggregations_by_name(name, value, needle):
    with pytest.raises(ConfigError, match=needle):
        registry.get(name)(_sim(), _task(), dict(BASE, aggregation=value))


def _wait_round(agg, name="fedvs_wait", **kw):
    proto = registry.get(name)(_sim(), _task(), dict(BASE, aggregation=agg, **kw))
    before = [w.copy() for w in proto.model.W]
    trace = proto.run(1)
    return proto, before, trace


def test_wait_concat_sizes_the_top_model_and_sends_each_client_its_slice():
    """One Wait round by hand: H = (H_1..H_N), the top step's dL/dH, client n steps on its slice at scale 1."""
    ref = registry.get("fedvs_wait")(_sim(), _task(), dict(BASE, aggregation="concat"))
    rows = ref.learning.batch_rows(1, BASE["batch_size"])
    stack = np.stack([ref.model.embedding(n, rows) for n in range(N)], axis=1)
    g = ref.model.server_step(aggregate_embeddings(stack, "concat"), rows)
    proto, before, trace = _wait_round("concat")
    h = BASE["embedding"]
    assert proto.model.top_params["0.weight"].shape == (8, N * h)       # the top model's first layer takes N h
    for n in range(N):
        step = BASE["lr_client"] * ref.model.features(n, rows).T @ g[:, n * h:(n + 1) * h]
        np.testing.assert_allclose(proto.model.W[n], before[n] - step, rtol=1e-12, atol=1e-14)
    # the same keyed delays and messages of the same size as the default (average) round: the same time
    _, _, tavg = _wait_round("average")
    assert trace[1]["time_s"] == pytest.approx(tavg[1]["time_s"], rel=1e-6)
    assert trace[1]["bits_down"] == tavg[1]["bits_down"]


def test_ignore_updates_only_the_received_clients_for_every_aggregation():
    for agg in ["concat", "max", "average"]:
        proto, before, trace = _wait_round(agg, name="fedvs_ignore", straggler_fraction=0.6)
        used = [int(i) for i in trace[1]["used"].split()]
        assert len(used) == N - 4                                     # 60 % of 7 -> 4 stragglers ignored
        changed = [n for n in range(N) if not np.array_equal(proto.model.W[n], before[n])]
        if agg == "max":     # a client that holds no maximum gets a zero gradient
            assert set(changed) <= set(used) and changed
        else:
            assert changed == used


def test_vafl_max_routes_the_gradient_through_its_table():
    """The arriving client's gradient is dL/dH where its fresh embedding is the table's maximum, 0 elsewhere."""
    proto = registry.get("fedvs_vafl")(_sim(), _task(), dict(BASE, aggregation="max"))
    proto.run(0)
    rows = proto.learning.batch_rows(1, BASE["batch_size"])
    H2 = proto.model.embedding(2, rows) + 10.0                        # client 2 wins every element
    g = proto.server_update(2, rows, H2)
    assert np.all(g != 0)
    g0 = proto.server_update(0, rows, proto.model.embedding(0, rows) - 10.0)     # client 0 wins none
    assert np.all(g0 == 0)
    trace = registry.get("fedvs_vafl")(_sim(), _task(), dict(BASE, aggregation="concat")).run(2)
    assert sum(r["event"] == "update" for r in trace) == 2 * N


@pytest.mark.parametrize("agg", ["average", "concat", "max"])
def test_observer_aggregates_every_clients_test_embedding_the_same_way(agg):
    """The test accuracy is the top model on the aggregate of all N clients' test embeddings (float32 products)."""
    from fednet.learning.vertical import pn_powers
    proto = registry.get("fedvs_wait")(_sim(), _task(), dict(BASE, aggregation=agg))
    m = proto.model
    stack = np.stack([pn_powers(x, D) @ W for x, D, W in zip(m.data.x_test, m.D, m.W)], axis=1)
    np.testing.assert_allclose(m.test_embedding(), aggregate_embeddings(stack, agg), rtol=1e-5, atol=1e-6)
    assert m.test_embedding().shape == (len(m.data.y_test), N * 4 if agg == "concat" else 4)
