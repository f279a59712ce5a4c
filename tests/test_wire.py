"""Wire widths from the payload (issue 27, item 2; :mod:`fednet.sim.engine.wire`): an explicit width wins, else the
payload tells (floats by their dtype, bytes 8, a galois field ceil(log2 p)), else an error naming the message kind."""

from __future__ import annotations

import galois
import numpy as np
import pytest

from fednet.algebra.shape import Shape
from fednet.sim.engine import wire


@pytest.mark.parametrize("payload,bits", [
    (np.zeros(3, np.float32), 32), (np.zeros(3), 64), (np.zeros(3, np.float16), 16), (np.zeros(3, np.uint8), 8),
    (b"abc", 8), (bytearray(4), 8), (1.5, 64), (np.float32(1.0), 32),
    (Shape((4, 5), np.float32), 32), (Shape((4,), np.dtype("float64")), 64),
    ((np.zeros(2, np.float32), np.ones(3, np.float32)), 32), ({"a": np.zeros(2)}, 64),
])
def test_the_payload_tells_its_width(payload, bits) -> None:
    assert wire.width(payload, None, "m") == bits


def test_a_galois_field_array_costs_ceil_log2_p() -> None:
    GF = galois.GF(2**31 - 1)
    assert wire.width(GF([1, 2, 3]), None, "m") == 31
    assert wire.width(galois.GF(2**8)([1, 2]), None, "m") == 8


def test_declarations() -> None:
    assert wire.field(2**32 - 5).bits == 32 and wire.field(2**61 - 1).bits == 61 and wire.field(2).bits == 1
    assert wire.field(2**32).bits == 32 and wire.field(2**32 + 1).bits == 33
    assert wire.fixed(48, 24).bits == 48 and wire.bits(7).bits == 7
    x = np.zeros(3)                                                  # float64, but declared 32: the declaration wins
    assert wire.width(x, 32, "m") == 32 and wire.width(x, wire.field(257), "m") == 9
    with pytest.raises(ValueError, match="p >= 2"):
        wire.field(1)
    with pytest.raises(ValueError, match="0 <= f < k"):
        wire.fixed(8, 8)


@pytest.mark.parametrize("payload", [np.zeros(3, np.int64), np.zeros(2, np.int32), None, 7, [np.zeros(2)] * 0,
                                     Shape((3,), np.int64), object()])
def test_an_unknown_width_is_an_error_naming_the_kind_and_the_argument(payload) -> None:
    with pytest.raises(wire.WireWidthError, match=r"gx: message kind 'share'.*upload_bits="):
        wire.width(payload, None, "share", arg="upload_bits", where="gx: ")


def test_parts_of_different_widths_and_bad_declarations_are_errors() -> None:
    with pytest.raises(wire.WireWidthError, match="kind 'mix'.*different widths"):
        wire.width((np.zeros(2, np.float32), np.zeros(2)), None, "mix")
    for bad in (0, -3, 2.5, True, "32"):
        with pytest.raises(wire.WireWidthError, match=r"kind 'k': element_bits must be a positive int"):
            wire.width(np.zeros(2), bad, "k")


def test_widths_resolves_a_declared_width_once() -> None:
    of = wire.widths(48, "u")
    assert of.constant == 48 and of(None) == 48
    of = wire.widths(None, "u")
    assert of.constant is None and of(np.zeros(2, np.float32)) == 32


def test_misfit() -> None:
    p = 2**31 - 1
    assert wire.misfit(np.array([0, p - 1]), wire.field(p), 31) is None
    assert "not elements of" in wire.misfit(np.array([0, p]), wire.field(p), 31)
    assert wire.misfit(np.array([-2**47, 2**47 - 1]), wire.fixed(48, 24), 48) is None
    assert "signed 48 bits" in wire.misfit(np.array([2**47]), wire.fixed(48, 24), 48)
    assert wire.misfit(np.array([2**32 - 1, 0]), None, 32) is None              # unsigned 32 bits
    assert wire.misfit(np.array([-2**31, 2**31 - 1]), None, 32) is None          # signed 32 bits
    assert "need 33 bits" in wire.misfit(np.array([-1, 2**32 - 1]), None, 32)    # neither
    assert "need 61 bits" in wire.misfit((np.zeros(2), np.array([2**60])), wire.Width(32), 32)
    assert wire.misfit(np.array([1e30]), wire.Width(8), 8) is None               # floats: a declared quantisation
    assert wire.misfit(Shape((3,), np.int64), wire.Width(8), 8) is None          # stand-ins carry no values
