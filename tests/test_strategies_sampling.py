"""strategies.sampling: waiting for devices and the uniform sample with the strategy's rng."""

import numpy as np
import pytest

from strategies.sampling import check_sampling, sample_devices
from tests.test_strategies_clustered import FakeManager


def test_sample_is_one_rng_choice_over_the_sorted_node_ids() -> None:
    # Prepare: connected in scrambled order; the sample indexes the sorted ids.
    manager = FakeManager(["n3", "n1", "n4", "n2"])
    rng, twin = np.random.default_rng(5), np.random.default_rng(5)

    # Execute
    available, chosen = sample_devices(manager, rng, server_round=1, clients_per_round=2,
                                       min_replies=1, round_timeout=10.0, forming=False)

    # Assert
    expected = [["n1", "n2", "n3", "n4"][i] for i in twin.choice(4, size=2, replace=False)]
    assert chosen == expected
    assert sorted(available) == ["n1", "n2", "n3", "n4"]
    assert rng.random() == twin.random()  # nothing else drawn
    assert manager.waited_for == []


def test_a_forming_federation_is_waited_for_then_whoever_is_there_is_sampled() -> None:
    # Prepare: 2 connected, 3 wanted, the federation still forming.
    manager = FakeManager(["a", "b"])

    # Execute
    _, chosen = sample_devices(manager, np.random.default_rng(0), server_round=1,
                               clients_per_round=3, min_replies=1, round_timeout=60.0,
                               forming=True)

    # Assert
    assert manager.waited_for == [3]
    assert sorted(chosen) == ["a", "b"]


def test_too_few_devices_sample_nobody_and_draw_nothing() -> None:
    # Prepare
    manager = FakeManager(["a"])
    rng = np.random.default_rng(0)
    state_before = rng.bit_generator.state

    # Execute
    available, chosen = sample_devices(manager, rng, server_round=4, clients_per_round=3,
                                       min_replies=2, round_timeout=5.0, forming=False)

    # Assert
    assert (list(available), chosen) == (["a"], [])
    assert manager.waited_for == [2]
    assert rng.bit_generator.state == state_before


@pytest.mark.parametrize(
    ("args", "name"),
    [((0, 1, 1.0), "clients_per_round"), ((1, True, 1.0), "min_replies"),
     ((1, 1, 0.0), "round_timeout"), ((1, 1, float("inf")), "round_timeout")],
)
def test_check_sampling_names_the_bad_setting(args: tuple, name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}="):
        check_sampling(*args)


def test_check_sampling_returns_plain_types() -> None:
    assert check_sampling(np.int64(3), 2, 7) == (3, 2, 7.0)
