"""strategies.hypotheses: k hypotheses ↔ one (k, n) float32 matrix, on NumPy arrays alone."""

import numpy as np
import pytest

from strategies.hypotheses import check_saved, split_layers, stack_hypotheses


def test_stack_then_split_gives_the_layers_back() -> None:
    # Prepare: k = 2 hypotheses of layers (2,) and (1, 2): n = 4.
    hypotheses = [
        [np.array([1, 2], np.float64), np.array([[3, 4]], np.int64)],
        [np.array([5, 6], np.float32), np.array([[7, 8]], np.float32)],
    ]

    # Execute
    shapes, flat = stack_hypotheses(hypotheses)
    layers = split_layers(flat, shapes)

    # Assert
    assert shapes == [(2,), (1, 2)]
    np.testing.assert_array_equal(flat, [[1, 2, 3, 4], [5, 6, 7, 8]])
    assert flat.dtype == np.float32
    np.testing.assert_array_equal(layers[1][1], [[7, 8]])
    assert [[a.shape for a in h] for h in layers] == [[(2,), (1, 2)]] * 2
    assert np.shares_memory(layers[0][0], flat)  # views: callers copy


@pytest.mark.parametrize(
    ("hypotheses", "message"),
    [
        ([], "at least one hypothesis"),
        ([[]], "no layers"),
        ([[np.zeros(0)]], "no parameters"),
        ([[np.zeros(2)], [np.zeros(3)]], r"initial_hypotheses\[1\] has layer shapes"),
        ([[np.array([1.0, np.nan])]], r"initial_hypotheses\[0\] has non-finite"),
        ([[np.array(["a", "b"])]], r"initial_hypotheses\[0\] has non-numeric"),
    ],
)
def test_stack_refuses_bad_hypotheses_naming_them(hypotheses: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stack_hypotheses(hypotheses)


def test_check_saved_accepts_matching_and_refuses_other_shapes_or_non_finite() -> None:
    # Prepare
    run = np.zeros((2, 3), np.float32)
    shapes = [(3,)]

    # Execute / Assert
    check_saved(shapes, run, run, like=run, like_shapes=shapes)
    with pytest.raises(ValueError, match="holds 1 hypotheses of layer shapes"):
        check_saved(shapes, run[:1], run[:1], like=run, like_shapes=shapes)
    with pytest.raises(ValueError, match="not finite"):
        check_saved(shapes, run, np.full((2, 3), np.inf, np.float32), like=run,
                    like_shapes=shapes)
