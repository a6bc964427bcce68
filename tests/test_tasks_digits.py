"""Tests of the rotated-digits task, the torch helpers and device selection."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

import tasks
from settings import SettingError
from tasks.config import TaskSettingsError
from tasks.device import configure_torch_threads, resolve_device
from tasks.digits import DigitsTask, digits_cnn, from_arrays, to_arrays
from tasks.torch_support import count_parameters, rmse_loss, seeded_module

USERS = 20


@pytest.fixture(scope="module")
def task() -> DigitsTask:
    built = tasks.load_task({"task": "digits", "device": "cpu"})
    assert isinstance(built, DigitsTask)
    return built


def _digest(images: np.ndarray) -> list[str]:
    return [hashlib.sha1(np.ascontiguousarray(img).tobytes()).hexdigest() for img in images]


def test_cnn_shape_and_parameter_count(task: DigitsTask) -> None:
    # conv 1->32 k2: 160, conv 32->64 k2: 8256, fc 576->128: 73856, fc 128->10: 1290
    assert task.num_parameters == 160 + 8256 + 73856 + 1290 == 83562
    assert count_parameters(digits_cnn()) == task.num_parameters
    assert task.parameter_shapes[0] == (32, 1, 2, 2) and task.parameter_shapes[-1] == (10,)
    out = digits_cnn()(torch.zeros(3, 1, 8, 8))
    assert tuple(out.shape) == (3, 10)


def test_partitions_are_disjoint_and_cover_the_images() -> None:
    flat = DigitsTask(rotate_probability=0.0)
    train = [flat.client_dataset(p, USERS) for p in range(USERS)]
    validation = flat.validation_datasets()
    assert sum(len(d) for d in train) == 1438 and sum(len(d) for d in validation) == 359
    assert len(validation) == 20
    from sklearn.datasets import load_digits

    every = (np.asarray(load_digits().images, np.float32) / 16.0)[:, None]
    ours = np.concatenate([d.x for d in train + validation])
    assert sorted(_digest(ours)) == sorted(_digest(every))
    assert max(len(d) for d in train) - min(len(d) for d in train) <= 1


def test_data_are_deterministic_and_seeded(task: DigitsTask) -> None:
    again = DigitsTask(device="cpu")
    a, b = task.client_dataset(5, USERS), again.client_dataset(5, USERS)
    assert a.x.tobytes() == b.x.tobytes() and a.y.tobytes() == b.y.tobytes()
    assert a.x.dtype == np.float32 and a.x.shape[1:] == (1, 8, 8) and a.y.dtype == np.int64
    other = DigitsTask(data_seed=1).client_dataset(5, USERS)
    assert other.y.tobytes() != a.y.tobytes()


def test_rotation_is_per_user_and_counter_clockwise() -> None:
    flat = DigitsTask(rotate_probability=0.0)
    turned = DigitsTask(rotate_probability=1.0)
    for p in (0, 3):
        plain, rotated = flat.client_dataset(p, USERS), turned.client_dataset(p, USERS)
        np.testing.assert_array_equal(rotated.x, np.rot90(plain.x, k=1, axes=(2, 3)))
        assert set(plain.group) == {0} and set(rotated.group) == {1}
    half = DigitsTask(rotate_probability=0.5)
    groups = [set(half.client_dataset(p, 100).group.tolist()) for p in range(100)]
    assert all(len(g) == 1 for g in groups)  # one orientation per user
    rotated_users = sum(g == {1} for g in groups)
    assert 30 <= rotated_users <= 70


def test_settings_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="rotate-probability"):
        tasks.load_task({"task": "digits", "rotate-probability": 2})
    with pytest.raises(TaskSettingsError, match=r"validation-users must be <= 359 .*=400"):
        tasks.load_task({"task": "digits", "validation-users": 400})
    with pytest.raises(TaskSettingsError, match=r"validation-users must be >= 1 .*=0"):
        tasks.load_task({"task": "digits", "validation-users": 0})
    task = DigitsTask(users=10)
    with pytest.raises(ValueError, match=r"users=10.*num-partitions=9"):
        task.client_dataset(0, 9)
    with pytest.raises(ValueError, match="exceeds"):
        DigitsTask().client_dataset(0, 2000)
    # ... and from the public settings alone (the count of training images is public).
    with pytest.raises(TaskSettingsError, match=r"users=10.*num-partitions=9"):
        task.check_partition(0, 9)
    with pytest.raises(TaskSettingsError, match="exceeds"):
        DigitsTask().check_partition(0, 2000)
    with pytest.raises(ValueError, match="device='tpu'"):
        tasks.load_task({"task": "digits", "device": "tpu"})


def test_initial_hypotheses_are_seeded_and_distinct(task: DigitsTask) -> None:
    state = torch.random.get_rng_state()
    first = task.initial_hypotheses(2, np.random.default_rng(4))
    again = task.initial_hypotheses(2, np.random.default_rng(4))
    assert torch.equal(state, torch.random.get_rng_state())  # global torch RNG untouched
    assert all(a.dtype == np.float32 for a in first[0])
    assert [a.shape for a in first[0]] == task.parameter_shapes
    assert all(np.array_equal(x, y) for x, y in zip(first[0], again[0], strict=True))
    assert not np.array_equal(first[0][0], first[1][0])


def test_array_round_trip() -> None:
    source, target = seeded_module(digits_cnn, 1), seeded_module(digits_cnn, 2)
    arrays = to_arrays(source)
    frozen = [a.copy() for a in arrays]
    for a in frozen:
        a.setflags(write=False)  # as Flower hands them (np.frombuffer)
    from_arrays(target, frozen)
    assert all(np.array_equal(a, b) for a, b in zip(to_arrays(target), arrays, strict=True))
    with pytest.raises(ValueError, match="layers"):
        from_arrays(target, arrays[:-1])


def test_training_reduces_the_loss_and_is_reproducible(task: DigitsTask) -> None:
    data = task.client_dataset(0, USERS)
    params = task.initial_hypotheses(1, np.random.default_rng(0))[0]
    before = task.user_metrics(params, data)
    assert set(before) == {"loss", "accuracy"}
    kwargs = {"epochs": 8, "learning_rate": 0.1, "batch_size": 10, "device": "cpu"}
    trained = task.train(params, data, rng=np.random.default_rng(1), **kwargs)  # type: ignore[arg-type]
    again = task.train(params, data, rng=np.random.default_rng(1), **kwargs)  # type: ignore[arg-type]
    assert all(np.array_equal(a, b) for a, b in zip(trained, again, strict=True))
    assert [a.shape for a in trained] == task.parameter_shapes
    assert all(a.dtype == np.float32 for a in trained)
    after = task.user_metrics(trained, data)
    assert after["loss"] < 0.8 * before["loss"]
    # evaluate: the trained hypothesis wins on this user whatever its position
    result = task.evaluate([params, trained], [data])
    assert result["loss"] == pytest.approx(after["loss"], rel=1e-5)
    assert result["accuracy"] == pytest.approx(after["accuracy"])


def test_rmse_loss_has_zero_gradient_at_zero_error() -> None:
    prediction = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = rmse_loss(prediction, torch.tensor([1.0, 2.0]))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-18)
    assert prediction.grad is not None and torch.all(prediction.grad == 0)


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(TaskSettingsError, match="device='tpu'"):
        resolve_device("tpu")
    # Each branch checks what this machine can show: CUDA refused here, or CUDA used there.
    if torch.cuda.is_available():
        assert resolve_device("cuda").type == "cuda"
        with pytest.raises(TaskSettingsError, match=r"device='cuda:999' names GPU 999"):
            resolve_device("cuda:999")
    else:
        with pytest.raises(TaskSettingsError, match=r"device='cuda'.*not available"):
            resolve_device("cuda")


@pytest.mark.parametrize(("name", "index"), [("cuda", None), ("cuda:0", 0), ("CUDA:1", 1)])
def test_a_visible_gpu_is_resolved_by_its_index(monkeypatch: pytest.MonkeyPatch, name: str,
                                                index: int | None) -> None:
    # As on a machine with two GPUs (torch.device objects need no GPU to exist).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device(name) == torch.device("cuda", index)


@pytest.mark.parametrize(("name", "message"), [
    ("cuda:999", r"device='cuda:999' names GPU 999 but only 2 are visible"),
    ("cuda:2", r"names GPU 2 but only 2"),
    ("cuda:256", r"names GPU 256"),  # torch would keep 0 of it (8 bits)
    ("cuda:-1", r"as cuda or cuda:N"),
    ("cuda:x", r"as cuda or cuda:N"),
    ("cuda:\u00b2", r"as cuda or cuda:N"),
    ("cuda:", r"as cuda or cuda:N"),
])
def test_a_gpu_index_beyond_the_visible_ones_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                        name: str, message: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(TaskSettingsError, match=message):
        resolve_device(name)


def test_configure_torch_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    previous = torch.get_num_threads()
    try:
        monkeypatch.setenv("GPFL_TORCH_THREADS", "2")
        assert configure_torch_threads() == 2 and torch.get_num_threads() == 2
        monkeypatch.setenv("GPFL_TORCH_THREADS", "zero")
        with pytest.raises(TaskSettingsError, match="GPFL_TORCH_THREADS"):
            configure_torch_threads()
    finally:
        torch.set_num_threads(previous)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_training_on_cuda_matches_the_contract(task: DigitsTask) -> None:
    data = task.client_dataset(1, USERS)
    params = task.initial_hypotheses(1, np.random.default_rng(0))[0]
    out = task.train(
        params,
        data,
        epochs=2,
        learning_rate=0.1,
        batch_size=10,
        rng=np.random.default_rng(0),
        device="cuda",
    )
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in out)
    assert task.loss(out, data) < task.loss(params, data)


def test_logistic_model_has_650_parameters_and_trains() -> None:
    task = DigitsTask(model="logistic", rotate_probability=0.0, device="cpu")
    assert task.num_parameters == 64 * 10 + 10 == 650
    rng = np.random.default_rng(0)
    params = task.init_parameters(rng)
    data = task.client_dataset(0, 2)
    before = task.loss(params, data)
    trained = task.train(params, data, epochs=5, learning_rate=0.5, batch_size=50, rng=rng,
                         device="cpu")
    assert task.loss(trained, data) < 0.7 * before


def test_dirichlet_partition_is_a_label_skewed_partition() -> None:
    users = 10
    skewed = DigitsTask(partition="dirichlet", dirichlet_alpha=0.1, rotate_probability=0.0)
    even = DigitsTask(rotate_probability=0.0)
    parts = [skewed.client_dataset(p, users) for p in range(users)]
    # A partition of the 1438 training images: nothing lost, nothing twice, nobody empty.
    assert sum(len(d) for d in parts) == 1438 and min(len(d) for d in parts) >= 1
    digests = [h for d in parts for h in _digest(d.x)]
    even_digests = [h for p in range(users) for h in _digest(even.client_dataset(p, users).x)]
    assert sorted(digests) == sorted(even_digests)

    def classes_for_half(datasets: list[tasks.Dataset]) -> float:
        # Mean number of classes needed to cover half of a user's images.
        needed = []
        for d in datasets:
            counts = np.sort(np.bincount(d.y, minlength=10))[::-1]
            needed.append(int(np.searchsorted(np.cumsum(counts), len(d) / 2)) + 1)
        return float(np.mean(needed))

    # alpha = 0.1 concentrates each user's labels on ~1-2 classes; equal slices need ~5.
    even_parts = [even.client_dataset(p, users) for p in range(users)]
    assert classes_for_half(parts) <= 2.5 < 4.0 <= classes_for_half(even_parts)
    # The same split in every process (the shares come from data-seed alone).
    again = DigitsTask(partition="dirichlet", dirichlet_alpha=0.1, rotate_probability=0.0)
    assert again.client_dataset(3, users).y.tobytes() == parts[3].y.tobytes()


def test_rmse_loss_compares_probabilities_with_one_hot_labels() -> None:
    task = DigitsTask(model="logistic", loss="rmse", device="cpu")
    params = [np.zeros((10, 64), np.float32), np.zeros(10, np.float32)]
    data = task.client_dataset(0, 2)
    # Uniform probabilities 0.1: squared error 0.81 on the true class, 0.01 on nine others.
    assert task.loss(params, data) == pytest.approx(np.sqrt((0.81 + 9 * 0.01) / 10), rel=1e-6)


@pytest.mark.parametrize(
    ("key", "value"),
    [("model", "resnet"), ("partition", "shards"), ("loss", "hinge"), ("dirichlet-alpha", 0.0)],
)
def test_bad_digits_settings_name_the_setting(key: str, value: object) -> None:
    with pytest.raises(SettingError, match=rf"^{key} must be .*, got {key}={value!r}$"):
        tasks.load_task({"task": "digits", key: value})
    with pytest.raises(SettingError, match=rf"^{key} must be .*, got {key}={value!r}$"):
        DigitsTask(**{key.replace("-", "_"): value})  # type: ignore[arg-type]


def test_parity_labels_flip_for_rotated_users_and_evaluate_reports_fairness() -> None:
    digit = DigitsTask(rotate_probability=0.2, device="cpu")
    parity = DigitsTask(rotate_probability=0.2, labels="parity", model="logistic", device="cpu")
    assert parity.num_parameters == 64 * 2 + 2
    seen = set()
    for p in range(USERS):
        d, q = digit.client_dataset(p, USERS), parity.client_dataset(p, USERS)
        assert d.x.tobytes() == q.x.tobytes() and d.group.tobytes() == q.group.tobytes()
        even = (d.y % 2 == 0).astype(np.int64)
        rotated = bool(d.group[0])
        seen.add(rotated)
        assert q.y.tolist() == (1 - even if rotated else even).tolist()
    assert seen == {False, True}
    zeros = [np.zeros((2, 64), np.float32), np.array([0.0, 1.0], np.float32)]  # always "1"
    metrics = parity.evaluate([zeros], parity.validation_datasets())
    # A constant prediction has equal rates in both groups: every gap is exactly 0.
    assert metrics["demographic-parity-difference"] == 0.0
    assert metrics["equal-opportunity-difference"] == 0.0
    assert metrics["equalized-odds-difference"] == 0.0
    # Any model: the gaps are those of the pooled predictions, upright users against rotated.
    from tasks.fairness import fairness_metrics

    params = parity.init_parameters(np.random.default_rng(3))
    validation = parity.validation_datasets()
    y_pred = np.concatenate([parity.predict(params, d.x).argmax(axis=1) for d in validation])
    y_true = np.concatenate([d.y for d in validation])
    groups = np.concatenate([d.group for d in validation])
    assert 0 < groups.sum() < groups.size
    expected = fairness_metrics(y_true, y_pred, 1 - groups)
    got = parity.evaluate([params], validation)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key
    assert got["accuracy"] == pytest.approx(
        np.mean([np.mean(parity.predict(params, d.x).argmax(axis=1) == d.y) for d in validation]))
