"""What the server accepts of a reply: metrics, counts, sizes, names (no Flower loop needed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.common import ndarray_to_bytes

from strategies.replies import (
    MAX_NAME,
    NameBook,
    ReplyMetrics,
    check_num_examples,
    check_tensor_sizes,
    merge_spend,
    parse_metrics,
    tensor_limits,
)

GOOD: dict[str, Any] = {
    "client-name": "client-3", "declined": 0, "spend-d": 1.2, "spend-epsilon": 0.0,
    "spend-delta": 0.0, "releases": 3, "declines": 0, "mechanism": "laplace",
}


def test_good_metrics_are_kept_and_unknown_keys_are_not() -> None:
    parsed = parse_metrics({**GOOD, "sigma": 2.0, "extra": "x" * 10_000}, need_sigma=True,
                           mechanism="laplace")

    assert isinstance(parsed, ReplyMetrics)
    assert (parsed.name, parsed.declined, parsed.sigma) == ("client-3", False, 2.0)
    assert "extra" not in parsed.values and parsed.values["releases"] == 3


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"client-name": None}, "metric 'client-name' must be a name"),
        ({"client-name": 7}, "metric 'client-name' must be a name"),
        ({"client-name": ""}, "metric 'client-name' must be a name"),
        ({"client-name": "../other"}, "metric 'client-name' must be a name"),
        ({"client-name": "a" * (MAX_NAME + 1)}, "metric 'client-name' must be a name"),
        ({"declined": 2}, "metric 'declined' must be 0 or 1"),
        ({"declined": True}, "metric 'declined' must be 0 or 1"),
        ({"spend-d": "1.2"}, "metric 'spend-d' must be a finite number >= 0, got '1.2'"),
        ({"spend-d": -0.1}, "metric 'spend-d' must be a finite number >= 0"),
        ({"spend-d": float("nan")}, "metric 'spend-d' must be a finite number >= 0"),
        ({"spend-epsilon": float("inf")}, "metric 'spend-epsilon' must be a finite number"),
        ({"spend-epsilon": True}, "metric 'spend-epsilon' must be a finite number"),
        ({"budget-epsilon": -1.0}, "metric 'budget-epsilon' must be a finite number"),
        ({"sigma": -1.0}, "metric 'sigma' must be a finite number >= 0"),
        ({"sigma": b"1"}, "metric 'sigma' must be a finite number >= 0"),
        ({"spend-delta": 1.5}, "metric 'spend-delta' must be a number in [0, 1]"),
        ({"budget-delta": -1e-9}, "metric 'budget-delta' must be a number in [0, 1]"),
        ({"releases": -1}, "metric 'releases' must be an integer >= 0"),
        ({"releases": 1.0}, "metric 'releases' must be an integer >= 0"),
        ({"declines": "2"}, "metric 'declines' must be an integer >= 0"),
        ({"mechanism": "rot13"}, "metric 'mechanism' must be one of"),
        ({"mechanism": "none"}, "released with mechanism 'none', the run asks for 'laplace'"),
    ],
)
def test_each_malformed_metric_is_named(change: dict[str, Any], reason: str) -> None:
    parsed = parse_metrics({**GOOD, **change}, need_sigma=False, mechanism="laplace")

    assert isinstance(parsed, str) and parsed.startswith(reason), parsed


def test_sigma_is_required_only_where_needed_and_never_of_a_decline() -> None:
    assert parse_metrics(GOOD, need_sigma=True) == (
        "metric 'sigma' is missing: this run needs each release's declared noise"
    )
    assert isinstance(parse_metrics(GOOD, need_sigma=False), ReplyMetrics)
    declined = parse_metrics({**GOOD, "declined": 1, "mechanism": "gaussian"}, need_sigma=True,
                             mechanism="laplace")
    assert isinstance(declined, ReplyMetrics) and declined.declined


def test_a_long_reason_is_cut_in_the_log_line() -> None:
    parsed = parse_metrics({**GOOD, "spend-d": "x" * 10_000}, need_sigma=False)

    assert isinstance(parsed, str) and len(parsed) < 150


@pytest.mark.parametrize("value", [-1, 10**12, 1.0, True, "1", None])
def test_absurd_num_examples_are_refused(value: object) -> None:
    reason = check_num_examples(value)
    assert reason is not None and reason.startswith("num_examples must be an integer")


@pytest.mark.parametrize("value", [0, 1, 10**9])
def test_plausible_num_examples_pass(value: int) -> None:
    assert check_num_examples(value) is None


def test_spend_keeps_the_largest_report() -> None:
    old = {"client-name": "a", "spend-d": 2.0, "releases": 5, "sigma": 1.0}
    new = {"client-name": "a", "spend-d": 0.4, "releases": 1, "sigma": 3.0}

    merged = merge_spend(old, new)

    assert merged == {"client-name": "a", "spend-d": 2.0, "releases": 5, "sigma": 3.0}
    assert merge_spend(new, old)["spend-d"] == 2.0


SHAPES = [(2, 3), (4,)]


def serialised(*arrays: np.ndarray) -> list[bytes]:
    return [ndarray_to_bytes(a) for a in arrays]


def test_a_reply_of_the_expected_size_passes() -> None:
    tensors = serialised(np.zeros((2, 3), np.float32), np.zeros(4, np.float32))

    assert check_tensor_sizes(tensors, tensor_limits(SHAPES, np.float32)) is None


@pytest.mark.parametrize(
    ("tensors", "reason"),
    [
        (serialised(np.zeros((2, 3), np.float32), np.zeros(400, np.float32)),
         "message too large"),
        # Limits here: 152 + 64 and 144 + 64 bytes (data + this NumPy's header + one block).
        ([b"\x00" * 300, b"\x00" * 10], "array 0 is 300 bytes, at most 216 expected"),
        ([b"\x00" * 10, b"\x00" * 300], "array 1 is 300 bytes, at most 208 expected"),
        ([b"x"], "expected 2 arrays, got 1"),
        ([b"x", "text"], "array 1 is a str, not bytes"),
    ],
)
def test_oversized_or_odd_tensors_are_refused_before_parsing(
    tensors: list[object], reason: str
) -> None:
    result = check_tensor_sizes(tensors, tensor_limits(SHAPES, np.float32))

    assert result is not None and result.startswith(reason), result


def test_the_size_limit_is_tight() -> None:
    # The data part is exact: one float32 more than the shape holds is refused.
    limits = tensor_limits([(1000,)], np.float32)
    exact = len(ndarray_to_bytes(np.zeros(1000, np.float32)))

    assert exact <= limits[0] < exact + 4 * 17


# ---------------------------------------------------------------------------- names


def test_a_node_keeps_its_first_name() -> None:
    book = NameBook()

    assert book.check("11", "alice", {"11"}) is None
    assert book.check("11", "bob", {"11"}) == "node 11 speaks as 'alice', this reply says 'bob'"
    assert book.label("11") == "alice" and book.label("99") == "node 99"


def test_a_name_stays_with_its_node_when_that_node_answered_the_round() -> None:
    book = NameBook()
    book.check("11", "alice")

    assert book.check("12", "alice", answered={"11", "12"}) == \
        "name 'alice' belongs to node 11, which answered this round"
    assert book.name_node == {"alice": "11"} and book.superseded() == set()


def test_a_restarted_device_takes_its_name_over_and_its_old_node_is_superseded() -> None:
    # The old node is still registered (its heartbeat has not expired) but did not answer.
    book = NameBook()
    book.check("11", "alice")
    book.check("21", "bob")

    assert book.check("12", "alice", answered={"12", "21"}) is None
    assert book.name_node == {"alice": "12", "bob": "21"}
    assert book.superseded() == {"11"}
    # The old node, should it answer again, may no longer speak as alice (nor as anyone else).
    assert book.check("11", "alice", answered={"11"}) == "name 'alice' moved to node 12"
    assert book.check("11", "carol") == "node 11 speaks as 'alice', this reply says 'carol'"


def test_name_book_round_trip() -> None:
    book = NameBook()
    book.check("11", "alice", {"11"})

    again = NameBook.from_dict(book.to_dict())

    assert again.node_name == book.node_name and again.name_node == book.name_node
