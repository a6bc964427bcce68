"""Checks applied to a client's reply before the server uses it.

A reply that fails a check is dropped by the strategy (and logged with the client's node id and
the reason); the round goes on with the others. Nothing here raises on bad client input: a
malformed reply is an event to record, not an error of the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from io import BytesIO

import numpy as np
from numpy.lib import format as npy_format

__all__ = ["check_reply", "npy_view"]


def check_reply(
    arrays: Sequence[object],
    expected_shapes: Sequence[tuple[int, ...]],
    expected_dtype: np.dtype | type,
) -> str | None:
    """Return why a reply's arrays are unusable, or ``None`` if they are usable.

    Parameters
    ----------
    arrays : sequence of np.ndarray
        The released arrays, one per layer of a single hypothesis.
    expected_shapes : sequence of tuple of int
        The shape of each layer of one hypothesis.
    expected_dtype : np.dtype or type
        The dtype every array must have (exactly: no casting, so ``float64`` is refused where
        ``float32`` is expected and a byte-swapped ``>f4`` is refused on a little-endian host).

    Returns
    -------
    str or None
        The first problem found (wrong number of arrays, not an array, wrong dtype, wrong shape,
        NaN or infinite values), worded for a log line; ``None`` when the reply is usable.
    """
    want = np.dtype(expected_dtype)
    if len(arrays) != len(expected_shapes):
        return f"expected {len(expected_shapes)} arrays, got {len(arrays)}"
    for index, (array, shape) in enumerate(zip(arrays, expected_shapes, strict=True)):
        if not isinstance(array, np.ndarray):
            return f"array {index} is a {type(array).__name__}, not a NumPy array"
        if array.dtype != want:
            return f"array {index} has dtype {array.dtype.str}, expected {want.str}"
        if array.shape != tuple(shape):
            return f"array {index} has shape {array.shape}, expected {tuple(shape)}"
        if not np.isfinite(array).all():
            return f"array {index} has non-finite values (NaN or inf)"
    return None


def npy_view(tensor: bytes) -> np.ndarray:
    """Read one ``np.save``-format tensor as a read-only view of its bytes (no copy).

    Flower serialises every ndarray with ``np.save`` (``flwr.common.ndarray_to_bytes``); its own
    ``bytes_to_ndarray`` goes through ``np.load``, which copies the data into a new array. Here the
    header is parsed and the data is viewed in place, so the caller can copy it once, straight to
    where it is needed.

    Parameters
    ----------
    tensor : bytes
        One entry of ``Parameters.tensors``.

    Returns
    -------
    np.ndarray
        A read-only array backed by ``tensor``.

    Raises
    ------
    ValueError
        If the bytes are not a well-formed ``.npy`` payload (whatever is wrong with them),
        hold Python objects (pickles are never accepted), or are shorter or longer than the
        header says.
    """
    stream = BytesIO(tensor)
    version = npy_format.read_magic(stream)
    try:
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(stream)
        else:
            # 3.0 only exists for structured dtypes with non-Latin-1 field names: never a model.
            raise ValueError(f"unsupported .npy format version {version}")
    except ValueError:
        raise
    except Exception as err:
        # NumPy parses the header with Python's tokenizer: a damaged header can raise
        # TokenError, SyntaxError, TypeError... all mean the same to the server.
        raise ValueError(f"unreadable .npy header ({type(err).__name__})") from None
    if dtype.hasobject:
        raise ValueError("object arrays are not accepted")
    offset = stream.tell()
    count = int(np.prod(shape, dtype=np.int64))
    if len(tensor) - offset != count * dtype.itemsize:
        raise ValueError(
            f"payload has {len(tensor) - offset} bytes, header says {count * dtype.itemsize}"
        )
    flat = np.frombuffer(tensor, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order="F" if fortran_order else "C")
