"""check_reply and npy_view: what makes a client's reply unusable, and zero-copy reading."""

import io

import numpy as np
import pytest
from flwr.common import ndarray_to_bytes

from strategies import check_reply
from strategies.validation import npy_view

SHAPES = [(2, 3), (4,)]


def good_arrays() -> list[np.ndarray]:
    return [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, dtype=np.float32)]


def test_usable_reply_has_no_reason() -> None:
    assert check_reply(good_arrays(), SHAPES, np.float32) is None


@pytest.mark.parametrize(
    ("arrays", "expected"),
    [
        ([np.zeros((2, 3), np.float32)], "expected 2 arrays, got 1"),
        ([*good_arrays(), np.zeros(1, np.float32)], "expected 2 arrays, got 3"),
        ([], "expected 2 arrays, got 0"),
        (
            [np.zeros((2, 3), np.float64), np.ones(4, np.float32)],
            "array 0 has dtype <f8, expected <f4",
        ),
        (
            [np.zeros((2, 3), np.float32), np.ones(4, np.int32)],
            "array 1 has dtype <i4, expected <f4",
        ),
        ([np.zeros((2, 3), ">f4"), np.ones(4, np.float32)], "array 0 has dtype >f4, expected <f4"),
        (
            [np.zeros((3, 2), np.float32), np.ones(4, np.float32)],
            "array 0 has shape (3, 2), expected (2, 3)",
        ),
        (
            [np.zeros((2, 3), np.float32), np.ones(5, np.float32)],
            "array 1 has shape (5,), expected (4,)",
        ),
        ([[0.0] * 6, np.ones(4, np.float32)], "array 0 is a list, not a NumPy array"),
    ],
)
def test_malformed_reply_reason(arrays: list[object], expected: str) -> None:
    assert check_reply(arrays, SHAPES, np.float32) == expected


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused(bad: float) -> None:
    # Prepare: one bad coordinate in the second layer.
    arrays = good_arrays()
    arrays[1][2] = bad

    # Execute
    reason = check_reply(arrays, SHAPES, np.float32)

    # Assert
    assert reason == "array 1 has non-finite values (NaN or inf)"


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
        np.float32(2.5) * np.ones((), np.float32),
        np.zeros((0, 3), np.float32),
        np.arange(5, dtype=np.float64),
    ],
)
def test_npy_view_reads_what_flower_serialises(array: np.ndarray) -> None:
    # Prepare
    tensor = ndarray_to_bytes(array)

    # Execute
    view = npy_view(tensor)

    # Assert
    np.testing.assert_array_equal(view, array)
    assert view.dtype == array.dtype and view.shape == array.shape


def test_npy_view_does_not_copy() -> None:
    # Prepare
    tensor = ndarray_to_bytes(np.arange(1000, dtype=np.float32))

    # Execute
    view = npy_view(tensor)

    # Assert: the array's memory lies inside the bytes object, and cannot be written.
    buffer = np.frombuffer(tensor, dtype=np.uint8)
    assert np.shares_memory(view, buffer)
    assert not view.flags.writeable


def test_npy_view_refuses_truncated_payload() -> None:
    tensor = ndarray_to_bytes(np.arange(10, dtype=np.float32))

    with pytest.raises(ValueError, match="payload has 36 bytes, header says 40"):
        npy_view(tensor[:-4])


def test_npy_view_refuses_trailing_bytes() -> None:
    tensor = ndarray_to_bytes(np.arange(10, dtype=np.float32))

    with pytest.raises(ValueError, match="payload has 44 bytes, header says 40"):
        npy_view(tensor + b"\x00" * 4)


def test_npy_view_refuses_object_arrays() -> None:
    # Prepare: a pickled object array, which np.load would only read with allow_pickle=True.
    stream = io.BytesIO()
    np.save(stream, np.array([{"a": 1}], dtype=object), allow_pickle=True)

    # Execute / Assert
    with pytest.raises(ValueError, match="object arrays"):
        npy_view(stream.getvalue())


def test_npy_view_refuses_garbage() -> None:
    with pytest.raises(ValueError):
        npy_view(b"definitely not an npy file")


def test_damaged_payloads_only_ever_raise_value_error() -> None:
    # Prepare: 5,000 damaged copies of a good payload (1-5 random bytes changed, a third of
    # them also truncated), seeded. NumPy's header parser can raise TokenError or SyntaxError
    # on some; the server must see ValueError (a dropped reply), never a crash.
    from flwr.common import ndarray_to_bytes

    rng = np.random.default_rng(0)
    good = ndarray_to_bytes(np.zeros((2, 3), np.float32))
    for _ in range(5000):
        damaged = bytearray(good)
        for _ in range(int(rng.integers(1, 6))):
            damaged[int(rng.integers(len(damaged)))] = int(rng.integers(256))
        if rng.random() < 0.3:
            damaged = damaged[: int(rng.integers(len(damaged)))]

        # Execute / Assert
        try:
            npy_view(bytes(damaged))
        except ValueError:
            pass
