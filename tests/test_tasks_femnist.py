"""Tests of the FEMNIST loader and task on a tiny LEAF-format fixture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tasks
from tasks.femnist import PAPER_NUM_PARAMETERS, FemnistTask, femnist_cnn, load_leaf
from tasks.torch_support import count_parameters


def _user(rng: np.random.Generator, n: int) -> dict[str, list[float] | list[int]]:
    return {
        "x": rng.random((n, 784)).round(3).tolist(),
        "y": rng.integers(0, 62, size=n).tolist(),
    }


@pytest.fixture(scope="module")
def leaf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two LEAF files, four users; f0001 is split over both files."""
    root = tmp_path_factory.mktemp("femnist")
    rng = np.random.default_rng(0)
    first = {"f0000": _user(rng, 5), "f0001": _user(rng, 3)}
    second = {"f0001": _user(rng, 2), "f0002": _user(rng, 4), "f0003": _user(rng, 6)}
    for name, users in (("all_data_0.json", first), ("all_data_1.json", second)):
        content = {
            "users": list(users),
            "num_samples": [len(u["y"]) for u in users.values()],
            "user_data": users,
        }
        (root / name).write_text(json.dumps(content))
    (root / "notes.txt").write_text("not json data")
    return root


def _task(leaf_dir: Path, **config: object) -> FemnistTask:
    task = tasks.load_task(
        {"task": "femnist", "data-path": str(leaf_dir), "validation-users": 1, **config}
    )
    assert isinstance(task, FemnistTask)
    return task


def test_loader_reads_every_file_in_order(leaf_dir: Path) -> None:
    data = load_leaf(leaf_dir)
    assert data.users == ("f0000", "f0001", "f0002", "f0003")
    assert {uid: len(y) for uid, y in data.labels.items()} == {
        "f0000": 5,
        "f0001": 5,
        "f0002": 4,
        "f0003": 6,
    }
    assert data.images["f0000"].shape == (5, 28, 28) and data.images["f0000"].dtype == np.float32
    single = load_leaf(leaf_dir / "all_data_1.json")
    assert single.users == ("f0001", "f0002", "f0003")


def test_partitions_and_validation_users(leaf_dir: Path) -> None:
    task = _task(leaf_dir, **{"rotate-probability": 0.0})
    assert task.training_users == ("f0000", "f0001", "f0002")
    assert [d.user for d in task.validation_datasets()] == ["f0003"]
    raw = load_leaf(leaf_dir)
    for p, uid in enumerate(task.training_users):
        data = task.client_dataset(p, 3)
        assert data.user == uid
        assert data.x.shape == (len(raw.labels[uid]), 1, 28, 28) and data.x.dtype == np.float32
        np.testing.assert_array_equal(data.x[:, 0], raw.images[uid])
        np.testing.assert_array_equal(data.y, raw.labels[uid])
    with pytest.raises(ValueError, match="exceeds the 3 training users"):
        task.client_dataset(0, 4)


def test_rotation_per_user(leaf_dir: Path) -> None:
    plain = _task(leaf_dir, **{"rotate-probability": 0.0}).client_dataset(1, 3)
    turned = _task(leaf_dir, **{"rotate-probability": 1.0}).client_dataset(1, 3)
    np.testing.assert_array_equal(turned.x, np.rot90(plain.x, k=1, axes=(2, 3)))
    assert set(plain.group) == {0} and set(turned.group) == {1}
    half_a, half_b = _task(leaf_dir), _task(leaf_dir)
    for uid in ("f0000", "f0001", "f0002", "f0003"):
        assert half_a.is_rotated(uid) == half_b.is_rotated(uid)
    draws = [_task(leaf_dir, **{"data-seed": s}).is_rotated("f0000") for s in range(40)]
    assert 8 <= sum(draws) <= 32


def test_model_follows_the_paper_count() -> None:
    # Table 3 with 3×3 kernels reproduces the paper's n0; its printed 2×2 would give 1,400,990
    assert count_parameters(femnist_cnn()) == PAPER_NUM_PARAMETERS == 1_206_590
    assert count_parameters(femnist_cnn(kernel_size=2)) == 1_400_990


def test_training_reduces_loss(leaf_dir: Path) -> None:
    task = _task(leaf_dir, device="cpu")
    assert task.num_parameters == PAPER_NUM_PARAMETERS
    data = task.client_dataset(2, 3)
    params = task.initial_hypotheses(1, np.random.default_rng(0))[0]
    before = task.loss(params, data)
    trained = task.train(
        params,
        data,
        epochs=5,
        learning_rate=0.05,
        batch_size=4,
        rng=np.random.default_rng(0),
        device="cpu",
    )
    assert all(a.dtype == np.float32 for a in trained)
    assert task.loss(trained, data) < before
    result = task.evaluate([params, trained], task.validation_datasets())
    assert {k for k in result if not k.startswith("hypothesis_")} == {"loss", "accuracy"}
    assert set(result) >= {"hypothesis_0_users", "hypothesis_1_users"}


def test_missing_or_bad_data_path_is_named(tmp_path: Path, leaf_dir: Path) -> None:
    with pytest.raises(ValueError, match="data-path"):
        tasks.load_task({"task": "femnist"})
    with pytest.raises(ValueError, match=r"data-path=.*does not exist"):
        tasks.load_task({"task": "femnist", "data-path": str(tmp_path / "absent")})
    with pytest.raises(ValueError, match=r"data-path=.*no \*\.json"):
        tasks.load_task({"task": "femnist", "data-path": str(tmp_path)})
    (tmp_path / "broken.json").write_text('{"users": ["a"], "user_data": {}}')
    with pytest.raises(ValueError, match=r"data-path.*broken\.json"):
        tasks.load_task({"task": "femnist", "data-path": str(tmp_path)})
    with pytest.raises(ValueError, match=r"validation-users must be < the 4 users"):
        _task(leaf_dir, **{"validation-users": 4})
