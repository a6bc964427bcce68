"""Random generators: the device's own noise, opted-in seeded noise, server-side randomness."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator

import numpy as np
import pytest

from mechanisms import device_rng, make_rng, seeded_rng
from mechanisms import rng as rng_module


@pytest.fixture
def fresh_warning_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Let seeded_rng warn again, as in a new process."""
    monkeypatch.setattr(rng_module, "_seeded_noise_warned", False)
    yield


# -- device_rng --------------------------------------------------------------------------------


def test_device_rng_gives_a_new_stream_every_call() -> None:
    # Execute: first draws of 64 bits from several generators.
    firsts = [int(device_rng().integers(2**63)) for _ in range(8)]

    # Assert: 8 independent 63-bit draws collide with probability < 2^-57.
    assert len(set(firsts)) == len(firsts)


def test_device_rng_is_a_pcg64_seeded_with_128_bits_from_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: record what device_rng asks of the OS CSPRNG.
    asked: list[int] = []
    real = secrets.randbits

    def spy(k: int) -> int:
        asked.append(k)
        return real(k)

    monkeypatch.setattr(rng_module.secrets, "randbits", spy)

    # Execute
    generator = device_rng()
    device_rng()

    # Assert: one 128-bit seed per generator, fresh every call.
    assert asked == [128, 128]
    assert isinstance(generator, np.random.Generator)
    assert isinstance(generator.bit_generator, np.random.PCG64)


def test_device_rng_does_not_log(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="mechanisms.rng"):
        device_rng()
    assert caplog.records == []


# -- seeded_rng --------------------------------------------------------------------------------


def test_seeded_rng_is_reproducible_and_keyed(fresh_warning_state: None) -> None:
    # Execute
    a = seeded_rng(7, 3, 0).standard_normal(4)
    b = seeded_rng(7, 3, 0).standard_normal(4)
    other_key = seeded_rng(7, 3, 1).standard_normal(4)
    other_seed = seeded_rng(8, 3, 0).standard_normal(4)
    no_keys = seeded_rng(7).standard_normal(4)

    # Assert
    np.testing.assert_array_equal(a, b)
    for other in (other_key, other_seed, no_keys):
        assert not np.array_equal(a, other)


def test_seeded_rng_is_the_documented_seed_sequence(fresh_warning_state: None) -> None:
    expected = np.random.default_rng(np.random.SeedSequence([5, 2, 9])).integers(2**62, size=3)
    np.testing.assert_array_equal(seeded_rng(5, 2, 9).integers(2**62, size=3), expected)


def test_seeded_rng_keys_are_not_concatenated_ambiguously(fresh_warning_state: None) -> None:
    # (1, 23) and (12, 3) must be different streams: a key is an entry, not digits.
    a = seeded_rng(1, 23).integers(2**62)
    b = seeded_rng(12, 3).integers(2**62)
    assert a != b


def test_seeded_rng_warns_once_per_process(
    fresh_warning_state: None, caplog: pytest.LogCaptureFixture
) -> None:
    # Execute
    with caplog.at_level(logging.WARNING, logger="mechanisms.rng"):
        seeded_rng(7, 0)
        seeded_rng(7, 1)
        seeded_rng(9)

    # Assert
    assert len(caplog.records) == 1
    record = caplog.records[0]
    assert record.levelno == logging.WARNING
    assert "reproducible" in record.getMessage()
    assert "seed 7" in record.getMessage()


@pytest.mark.parametrize(
    ("seed", "keys", "error", "pattern"),
    [
        (-1, (), ValueError, r"^seed must be a non-negative integer, got seed=-1$"),
        (1.5, (), TypeError, r"^seed must be an integer, got seed=1\.5$"),
        ("7", (), TypeError, r"^seed must be an integer, got seed='7'$"),
        (True, (), TypeError, r"^seed must be an integer, got seed=True$"),
        (None, (), TypeError, r"^seed must be an integer, got seed=None$"),
        (7, (0, -2), ValueError, r"^keys\[1\] must be a non-negative integer, got keys\[1\]=-2$"),
        (7, (2.0,), TypeError, r"^keys\[0\] must be an integer, got keys\[0\]=2\.0$"),
    ],
)
def test_seeded_rng_rejects_bad_seeds_naming_them(
    fresh_warning_state: None, seed: object, keys: tuple[object, ...],
    error: type[Exception], pattern: str,
) -> None:
    with pytest.raises(error, match=pattern):
        seeded_rng(seed, *keys)  # type: ignore[arg-type]


def test_seeded_rng_accepts_numpy_integers(fresh_warning_state: None) -> None:
    a = seeded_rng(np.int64(4), np.uint8(2)).integers(2**62)  # type: ignore[arg-type]
    assert a == seeded_rng(4, 2).integers(2**62)


# -- make_rng (server-side randomness) --------------------------------------------------------


@pytest.mark.parametrize("seed", [None, -1, -100])
def test_unseeded_generators_use_os_entropy_quietly(
    seed: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    # Execute
    with caplog.at_level(logging.WARNING):
        a, b = make_rng(seed), make_rng(seed)

    # Assert
    assert isinstance(a, np.random.Generator)
    assert a.integers(2**62) != b.integers(2**62)  # fails with probability 2^-62
    assert caplog.records == []


def test_fixed_seed_is_reproducible_and_logged_as_server_side(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Execute
    with caplog.at_level(logging.WARNING, logger="mechanisms.rng"):
        a, b = make_rng(7), make_rng(np.int64(7))  # type: ignore[arg-type]

    # Assert: the message is about the server's randomness, not about privacy noise.
    assert a.integers(2**62) == b.integers(2**62)
    assert len(caplog.records) == 2
    message = caplog.records[0].getMessage()
    assert caplog.records[0].levelno == logging.WARNING
    assert "server-side randomness" in message and "reproducible" in message
    assert "privacy noise" not in message
    assert "does not drive the release noise" in message


@pytest.mark.parametrize("seed", [1.5, "7", True])
def test_make_rng_rejects_non_integer_seeds(seed: object) -> None:
    with pytest.raises(TypeError, match="seed must be an integer or None"):
        make_rng(seed)  # type: ignore[arg-type]
