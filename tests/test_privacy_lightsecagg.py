"""Privacy audit of the LightSecAgg baseline: the server learns only the survivors' sum.

Same trick as ``test_privacy_codedsecagg``: a model of M coordinates with equal per-coordinate
values is M independent trials (masks and noise are fresh per coordinate; with ``U - T = 1`` a
piece is the whole mask).  Chi-square tests reject at p < 1e-4.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2_contingency

from fednet.algebra.fields import uniform
from fednet.algebra.modp import add_mod
from fednet.codes.lightsecagg import default_lsa_points, lsa_aggregate_encoded, lsa_decode_aggregate_mask, lsa_encode_mask

ALPHA = 1e-4


def server_view(x, U1, N, U, T, q, M, rng):
    alphas, betas = default_lsa_points(N, U)
    masks = [uniform(rng, q, M) for _ in range(N)]
    enc = [lsa_encode_mask(masks[i], U, T, q, rng, alphas, betas) for i in range(N)]
    masked = [add_mod(np.full(M, x[i]), masks[i], q) for i in U1]
    s = [lsa_aggregate_encoded([enc[i][j] for i in U1], q) for j in U1]
    agg = lsa_decode_aggregate_mask(np.stack(s), [alphas[j] for j in U1], betas, U, T, M, q)
    return masked + s, agg, enc


def cells(values, q):
    idx = np.zeros_like(values[0], dtype=np.int64)
    for v in values:
        idx = idx * q + v.astype(np.int64)
    return idx


def test_server_learns_only_the_sum_of_survivors():
    q, N, U, T, M = 7, 3, 2, 1, 100_000
    U1 = [0, 1]                               # user 2 dropped
    rng = np.random.default_rng(0)
    hist = {}
    for name, x in (("A", [1, 3, 0]), ("B", [6, 5, 2]), ("C", [2, 3, 0])):   # sums 4, 4, 5 (mod 7)
        view, agg, _ = server_view(x, U1, N, U, T, q, M, rng)
        total = (view[0] + view[1]) % q
        assert np.all((total - agg) % q == (x[0] + x[1]) % q)              # determines the sum
        hist[name] = np.bincount(cells(view, q), minlength=q ** len(view))
    table = np.stack([hist["A"], hist["B"]])
    table = table[:, table.sum(axis=0) > 0]
    assert chi2_contingency(table)[1] > ALPHA                              # and nothing more
    table = np.stack([hist["A"], hist["C"]])
    table = table[:, table.sum(axis=0) > 0]
    assert chi2_contingency(table)[1] < 1e-12                              # power check


def test_t_colluding_users_see_uniform_mask_shares():
    q, N, U, T, M = 11, 4, 3, 2, 100 * 11**2
    rng = np.random.default_rng(1)
    alphas, betas = default_lsa_points(N, U)
    for secret in (0, 3):
        z = np.full(M, secret)                    # a fixed mask: only the noise protects it
        enc = lsa_encode_mask(z, U, T, q, rng, alphas, betas)   # U - T = 1 piece of length M
        h = np.bincount(cells([enc[0], enc[1]], q), minlength=q**2)   # colluders: users 0 and 1
        e = M / q**2
        from scipy.stats import chi2

        assert chi2.sf(((h - e) ** 2 / e).sum(), q**2 - 1) > ALPHA


def test_protocol_server_reads_no_encoded_mask():
    """On the engine, the bundles of encoded masks the server stores and forwards are encrypted:
    they are in its ``relayed`` list, never in its view; each user's view holds the shares addressed to it."""
    from factories import make_sim, make_task
    from fednet.protocols.lightsecagg import LightSecAgg

    sim = make_sim(D=5, seed=0)
    task = make_task(D=5, n=10, d=6, c=2, lr=0.01)
    LightSecAgg(sim, task, dict(z=1, U=4, mode="full")).run(2)
    assert sim.server.relayed and all(m.kind == "encoded_mask_relay" for m in sim.server.relayed)
    assert not [m for m in sim.server.view if m.kind.startswith("encoded_mask")]
    assert all(any(m.kind == "encoded_mask_relay" for m in dev.view) for dev in sim.devices)


def masked_uploads_seen_by_server(seed: int = 0) -> np.ndarray:
    """Top 4 bits of every masked upload element in the server's view (a small full-mode run, p = 2**32 - 5)."""
    from factories import make_sim, make_task
    from fednet.protocols.lightsecagg import LightSecAgg

    sim = make_sim(D=5, seed=seed)
    task = make_task(D=5, n=10, d=10, c=3, lr=0.01)
    proto = LightSecAgg(sim, task, dict(z=1, U=4, mode="full"))
    proto.run(4)
    vals = [np.asarray(m.payload, dtype=np.int64) for m in sim.server.view if m.kind == "masked_model"]
    assert vals, "no masked upload reached the server"
    return np.concatenate(vals) >> 28                 # 32-bit elements: the top 4 bits


def test_protocol_masked_uploads_are_uniform_for_the_server():
    """The server's view of each masked upload ``Q(G_i) + z_i`` is uniform over GF(p) (a one-time pad)."""
    from scipy.stats import chi2

    h = np.bincount(masked_uploads_seen_by_server(), minlength=16)
    assert h.sum() >= 400
    e = h.sum() / 16
    assert chi2.sf(((h - e) ** 2 / e).sum(), 15) > ALPHA
