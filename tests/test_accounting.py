"""The paper's accounting options (issue 13, item 1): each changes exactly what it should.

Schlegel et al., "CodedPaddedFL and CodedSecAgg": Sec. V-D (alpha - 1 encoding MACs, k-bit shares),
Sec. V-E / VI-D (groups run independently), Sec. VI-C (Shamir encoding not counted), Remark 3
((k+f)/k, the (k+f)-bit field).  Analytic timing: deterministic compute, no loss.
"""

from __future__ import annotations

import numpy as np
import pytest

from factories import make_sim, make_task
from fednet.algebra.fields import fixed_point_field, paper_field
from fednet.algebra.fixed_point import FixedPoint
from fednet.algebra.meter import MacMeter, charge, recharged
from fednet.codes import padded
from fednet.codes.secagg import share_secrets
from fednet.protocols.codedpaddedfl import CodedPaddedFL, CodedPaddedFLConfig
from fednet.protocols.codedsecagg import CodedSecAgg, CodedSecAggConfig
from fednet.sim.compute import Deterministic
from fednet.sim.simulation import Simulation
from fednet.study.config import Study
from fednet.topologies.lte import lte_star

RATE = 1e6


def two_speed_sim(D: int, slow: set[int], seed: int = 3) -> Simulation:
    """Star of D devices at 1e6 MAC/s, no loss, deterministic compute; ``slow`` devices upload at 1 Mbit/s."""
    up = [1e6 if i in slow else 5e6 for i in range(D)]
    g = lte_star(D, uplink_bps=up, device_mac_rates=[RATE] * D, loss=0.0)
    return Simulation(g, seed, device_compute=Deterministic())


def test_recharged_replaces_the_blocks_count():
    with MacMeter() as outer:
        charge(5)
        with recharged(lambda m: 3 * m) as inner:
            charge(7)
        charge(1)
    assert inner.macs == 7
    assert outer.macs == 5 + 21 + 1
    with pytest.raises(ValueError, match="non-negative"):
        with recharged(lambda m: -1):
            pass


# -- CodedSecAgg ------------------------------------------------------------------------------------------


def test_widen_compute_multiplies_epoch_device_compute_by_k_plus_f_over_k():
    D, d, c = 4, 6, 4
    rows = {}
    for widen in (False, True):
        p = CodedSecAgg(make_sim(D, deterministic=True), make_task(D=D, d=d, c=c),
                        dict(z=1, groups=1, widen_compute=widen))
        rows[widen] = p.run(2)
    macs = d * d * c + d * c                       # eq. (13) per device
    for e in (1, 2):
        plain = rows[False][e]["time_s"] - rows[False][e - 1]["time_s"]
        wide = rows[True][e]["time_s"] - rows[True][e - 1]["time_s"]
        assert wide - plain == pytest.approx(macs * (72 / 48 - 1) / RATE, rel=1e-12)
        assert rows[True][e]["device_macs"] * 2 == rows[False][e]["device_macs"] * 3   # exactly 72/48
    # phase 1 is untouched
    assert rows[True][0]["time_s"] == rows[False][0]["time_s"]
    assert rows[True][0]["device_macs"] == rows[False][0]["device_macs"]


def test_widen_compute_also_scales_tree_additions():
    D, N, d, c = 8, 4, 6, 4
    macs = {}
    for widen in (False, True):
        p = CodedSecAgg(make_sim(D, deterministic=True), make_task(D=D, d=d, c=c),
                        dict(z=1, groups=N, widen_compute=widen))
        macs[widen] = p.run(1)[1]["device_macs"]
    assert macs[True] * 2 == macs[False] * 3


def test_paper_field_is_72_bits_and_decodes_exactly():
    q = paper_field(48, 24)
    assert q == 2**72 - 93 and q.bit_length() == 72 and fixed_point_field(48, 24) == 2**72 + 15
    cfg = CodedSecAggConfig(field_prime="largest_below")
    assert cfg.q == q
    D, N, d, c = 8, 2, 6, 3
    task = make_task(D=D, d=d, c=c)
    p = CodedSecAgg(make_sim(D, deterministic=True), task, dict(z=1, groups=N, field_prime="largest_below"))
    rows = p.run(3)                                # full mode, check_decoding: exact Python-int comparison
    assert p.q == q
    assert p.max_decode_error <= 1e-9
    size = d * (d + 1) // 2 + d * c
    assert rows[0]["bits_up"] == D * (D // N - 1) * size * 72      # 72-bit elements on the wire
    ref = CodedSecAgg(make_sim(D, deterministic=True), make_task(D=D, d=d, c=c), dict(z=1, groups=N))
    ref.run(3)
    np.testing.assert_array_equal(p.theta, ref.theta)             # same decoded aggregates as the 73-bit field


def test_paper_field_refuses_secrets_it_cannot_hold():
    fp, q = FixedPoint(48, 24), paper_field(48, 24)
    M = np.zeros((2, 2), dtype=np.int64)
    G1 = np.zeros((2, 1), dtype=np.int64)
    share_secrets(fp, q, M, G1)                    # small values: fine
    M[0, 0], M[1, 1] = 2**47 - 1, -2**47           # every Q<48,24> value of X^T X fits
    G1[1, 0] = 2**47 - 1                           # 2**f G1 = 2**71 - 2**24 <= (q-1)/2 = 2**71 - 47
    share_secrets(fp, q, M, G1)
    G1[1, 0] = -2**47                              # |2**f G1| = 2**71 > (q-1)/2: the one Q<48,24> value refused
    with pytest.raises(ValueError, match="field too small.*72 bits.*secrets"):
        share_secrets(fp, q, M, G1)


def _starts(p, name):
    starts = {}
    real = getattr(p, name)

    def spy(dev):
        starts[dev.index] = p.env.now
        return real(dev)

    setattr(p, name, spy)
    return starts


@pytest.mark.parametrize("schedule", ["relay_steps", "relay_asap"])
def test_codedsecagg_per_group_phase1_adds_at_its_own_sharing_end(schedule):
    D, N = 8, 2
    slow = {0, 1, 2, 3}                            # group 0 uploads 5x slower
    ends = {}
    for per_group in (False, True):
        p = CodedSecAgg(two_speed_sim(D, slow), make_task(D=D),
                        dict(z=1, groups=N, sharing_schedule=schedule, encode_per_group=per_group))
        starts = _starts(p, "_combine")
        rows = p.run(0)
        last = {g: max(m.delivered_at for i in members for m in p.devices[i].view if m.kind == "shamir_share")
                for g, members in enumerate(p.groups)}
        for g, members in enumerate(p.groups):
            want = last[g] if per_group else max(last.values())
            assert all(starts[i] == pytest.approx(want, abs=1e-12) for i in members), (per_group, g)
        ends[per_group] = rows[0]["time_s"]
        if per_group:
            assert last[1] < last[0]
    assert ends[True] <= ends[False]


# -- CodedPaddedFL ----------------------------------------------------------------------------------------


def test_encode_count_alpha_minus_1_charges_the_papers_count():
    D, alpha, d, c = 6, 3, 6, 3
    rows = {}
    for count in ("alpha", "alpha_minus_1"):
        p = CodedPaddedFL(make_sim(D, deterministic=True), make_task(D=D, d=d, c=c),
                          dict(alpha=alpha, encode_count=count))
        rows[count] = p.run(1)
    size = padded.share_elements(d, c)
    assert rows["alpha"][0]["device_macs"] == D * alpha * size
    assert rows["alpha_minus_1"][0]["device_macs"] == D * (alpha - 1) * size      # Sec. V-D
    assert rows["alpha"][0]["time_s"] - rows["alpha_minus_1"][0]["time_s"] == pytest.approx(size / RATE, rel=1e-12)
    assert rows["alpha"][1]["device_macs"] == rows["alpha_minus_1"][1]["device_macs"]   # epochs untouched


def test_encode_count_alpha_1_charges_nothing():
    p = CodedPaddedFL(make_sim(4, deterministic=True), make_task(D=4), dict(alpha=1, encode_count="alpha_minus_1"))
    assert p.run(0)[0]["device_macs"] == 0


@pytest.mark.parametrize("schedule", ["relay_steps", "relay_asap", "upload_once"])
def test_codedpaddedfl_per_group_encoding_starts_at_its_own_sharing_end(schedule):
    D, N, alpha = 8, 2, 3
    slow = {0, 1, 2, 3}
    ends = {}
    for per_group in (False, True):
        p = CodedPaddedFL(two_speed_sim(D, slow), make_task(D=D),
                          dict(alpha=alpha, groups=N, sharing_schedule=schedule, encode_per_group=per_group))
        starts = _starts(p, "_encode_device")
        rows = p.run(0)
        last = {g: max(m.delivered_at for i in members for m in p.devices[i].view if m.kind == "share")
                for g, members in enumerate(p.groups)}
        for g, members in enumerate(p.groups):
            want = last[g] if per_group else max(last.values())
            assert all(starts[i] == pytest.approx(want, abs=1e-12) for i in members), (per_group, g)
        if per_group:
            assert last[1] < last[0]               # the fast group starts encoding first
        ends[per_group] = rows[0]["time_s"]
    assert ends[True] <= ends[False]


def test_share_element_bits_is_the_wire_width():
    D, d, c, alpha = 4, 6, 3, 2
    bits = {}
    for w in (None, 48):
        p = CodedPaddedFL(make_sim(D, deterministic=True), make_task(D=D, d=d, c=c),
                          dict(alpha=alpha, share_element_bits=w))
        bits[w] = p.run(0)[0]["bits_up"]
    assert bits[48] * CodedPaddedFLConfig(alpha=alpha).ring_bits == bits[None] * 48


# -- the study-level switch -------------------------------------------------------------------------------


def _study(**extra):
    runs = [dict(label="csa", protocol="codedsecagg", params=dict(z=1, groups=2, mode="timing")),
            dict(label="cpfl", protocol="codedpaddedfl", params=dict(alpha=2, groups=2, mode="timing")),
            dict(label="cpfl own", protocol="codedpaddedfl",
                 params=dict(alpha=2, groups=2, mode="timing", share_element_bits=72, encode_per_group=False)),
            dict(label="conv", protocol="conventional")]
    runs += extra.pop("more_runs", [])
    return Study.model_validate(dict(name="acc", network=dict(n_devices=8), runs=runs, **extra))


def test_fednet_accounting_keeps_the_params():
    s = _study()
    assert s.accounting == "fednet"
    for run in s.runs:
        assert s.run_params(run) == run.params


def test_paper_accounting_sets_every_choice_unless_the_run_does():
    s = _study(accounting="paper")
    csa, cpfl, own, conv = (s.run_params(r) for r in s.runs)
    assert csa == dict(z=1, groups=2, mode="timing", charge_encoding=False, widen_compute=True,
                       field_prime="largest_below", encode_per_group=True)
    assert cpfl == dict(alpha=2, groups=2, mode="timing", share_element_bits=48, encode_count="alpha_minus_1",
                        encode_per_group=True)
    assert own["share_element_bits"] == 72 and own["encode_per_group"] is False     # the run's own choice wins
    assert own["encode_count"] == "alpha_minus_1"
    assert conv == {}
    cfg = CodedSecAggConfig(**csa)
    assert cfg.q.bit_length() == 72 and not cfg.charge_encoding and cfg.widen_compute


def test_run_level_accounting_overrides_the_study():
    s = _study(more_runs=[dict(label="csa paper", protocol="codedsecagg", accounting="paper",
                               params=dict(z=1, groups=2, mode="timing"))])
    assert s.run_params(s.runs[0]) == s.runs[0].params
    assert s.run_params(s.runs[-1])["widen_compute"] is True
    s = _study(accounting="paper", more_runs=[dict(label="csa fednet", protocol="codedsecagg", accounting="fednet",
                                                   params=dict(z=1, groups=2, mode="timing"))])
    assert s.run_params(s.runs[-1]) == dict(z=1, groups=2, mode="timing")
    with pytest.raises(ValueError, match="accounting"):
        _study(accounting="papr")


def test_a_sweep_can_vary_the_accounting():
    s = Study.model_validate(dict(name="acc", network=dict(n_devices=8), runs=[
        dict(label="csa N={groups} {accounting}", protocol="codedsecagg", params=dict(z=1, mode="timing"),
             sweep=dict(groups=[1, 2], accounting=["fednet", "paper"]))]))
    assert [r.name for r in s.runs] == ["csa N=1 fednet", "csa N=1 paper", "csa N=2 fednet", "csa N=2 paper"]
    assert [r.accounting for r in s.runs] == ["fednet", "paper"] * 2
    assert "accounting" not in s.runs[1].params and s.run_params(s.runs[1])["widen_compute"] is True
    assert "widen_compute" not in s.run_params(s.runs[0])
