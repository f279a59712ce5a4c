"""The privacy tests can fail: each mutation of the protocols' secrets makes a privacy check fail.

Mutations (each applied with ``monkeypatch``, each undone after its test):

* **masks zeroed** -- LightSecAgg's masks and mask noise (the engine's secret stream of purpose
  ``masks`` returns zeros; the pure audit's ``uniform`` returns zeros);
* **pads zeroed** -- CodedPaddedFL's one-time pads (secret stream ``pads`` / ``random_ring_limbs``);
* **threshold lowered** -- CodedSecAgg's Shamir threshold ``k'`` and LightSecAgg's privacy ``T``
  one below what the audit's colluders need.

Each test first runs the unmutated check (it passes), then the mutated one, and asserts that the
check raises ``AssertionError`` at one of the audit's own assertions (:func:`audit_fails`
checks that the failing frame is in a ``test_privacy_*`` module: not a crash or a decoding
check elsewhere).  The mutated views are deterministic or grossly non-uniform, so the
chi-square statistics land far beyond the 1e-4 rejection level: the failures are not chance.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import test_privacy_codedpaddedfl as cpfl_audit
import test_privacy_codedsecagg as csa_audit
import test_privacy_lightsecagg as lsa_audit
from fednet.codes.lightsecagg import lsa_encode_mask
from fednet.codes.shamir import shamir_share
from fednet.sim.simulation import Simulation


@contextlib.contextmanager
def audit_fails():
    """Expect an ``AssertionError`` raised by an assertion of a privacy audit module."""
    with pytest.raises(AssertionError) as excinfo:
        yield
    where = excinfo.traceback[-1].path.name
    assert where.startswith("test_privacy_") and where != "test_privacy_mutations.py", where


class ZeroGenerator:
    """Stands in for a secret ``numpy.random.Generator`` whose every integer draw is ``low``."""

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        lo = 0 if high is None else low
        return np.full(() if size is None else size, lo, dtype=dtype)


def zero_secret_stream(monkeypatch: pytest.MonkeyPatch, purpose: str) -> None:
    """Make ``Simulation.secret_rng(node, purpose, ...)`` return zeros for one purpose."""
    real = Simulation.secret_rng

    def mutated(self, node, p, *more):
        return ZeroGenerator() if p == purpose else real(self, node, p, *more)

    monkeypatch.setattr(Simulation, "secret_rng", mutated)


# -- masks zeroed ------------------------------------------------------------------------------
def test_zeroed_masks_fail_the_engine_audit(monkeypatch):
    lsa_audit.test_protocol_masked_uploads_are_uniform_for_the_server()
    zero_secret_stream(monkeypatch, "masks")
    with audit_fails():
        lsa_audit.test_protocol_masked_uploads_are_uniform_for_the_server()


def test_zeroed_masks_fail_the_pure_audit(monkeypatch):
    monkeypatch.setattr(lsa_audit, "uniform", lambda rng, q, shape: np.zeros(shape, np.int64))
    with audit_fails():
        lsa_audit.test_server_learns_only_the_sum_of_survivors()


# -- pads zeroed -------------------------------------------------------------------------------
def test_zeroed_pads_fail_the_engine_audit(monkeypatch):
    cpfl_audit.test_engine_shares_in_device_views_are_uniform()
    zero_secret_stream(monkeypatch, "pads")
    with audit_fails():
        cpfl_audit.test_engine_shares_in_device_views_are_uniform()


def test_zeroed_pads_fail_the_pure_audit(monkeypatch):
    cpfl_audit.test_padded_shares_are_uniform_and_independent_of_the_data()
    # patch the name where pad() looks it up, whichever module defines pad()
    monkeypatch.setitem(cpfl_audit.pad.__globals__, "random_ring_limbs",
                        lambda shape, bits, rng: np.zeros((-(-bits // 16),) + tuple(shape), np.int64))
    with audit_fails():
        cpfl_audit.test_padded_shares_are_uniform_and_independent_of_the_data()


# -- threshold lowered -------------------------------------------------------------------------
def test_lowered_shamir_threshold_fails_the_collusion_audit(monkeypatch):
    monkeypatch.setattr(csa_audit, "shamir_share",
                        lambda secret, n, kp, q, rng, pts: shamir_share(secret, n, kp - 1, q, rng, pts))
    with audit_fails():
        csa_audit.test_z_colluding_devices_see_uniform_shares()


def test_lowered_shamir_threshold_fails_the_server_audit(monkeypatch):
    monkeypatch.setattr(csa_audit, "shamir_share",
                        lambda secret, n, kp, q, rng, pts: shamir_share(secret, n, kp - 1, q, rng, pts))
    with audit_fails():
        csa_audit.test_server_view_depends_only_on_the_global_aggregate()


def test_lowered_lightsecagg_privacy_fails_the_collusion_audit(monkeypatch):
    monkeypatch.setattr(lsa_audit, "lsa_encode_mask",
                        lambda z, U, T, q, rng, a, b: lsa_encode_mask(z, U, T - 1, q, rng, a, b))
    with audit_fails():
        lsa_audit.test_t_colluding_users_see_uniform_mask_shares()
