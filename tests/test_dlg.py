"""The DLG attack and audit (experiments.dlg, experiments.dlg_audit): metrics by hand, and the
paper's shape on a quick run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from experiments.dlg import dlg_lenet, idlg_label
from experiments.dlg_audit import QUICK_NUS, ROW_KEYS, mse, psnr, run_dlg_audit, ssim

# --------------------------------------------------------------------------- metrics


def test_mse_and_psnr_of_known_images() -> None:
    # Prepare: zeros against a constant 0.5 image, and an image against itself + 0.1.
    zeros = np.zeros((8, 8))
    half = np.full((8, 8), 0.5)
    image = np.linspace(0.0, 0.9, 64).reshape(8, 8)

    # Execute / Assert: MSE = 0.25 -> PSNR = 10 log10(1 / 0.25) = 6.0206 dB;
    # MSE = 0.01 -> PSNR = 20 dB; identical images -> MSE 0, PSNR inf.
    assert mse(zeros, half) == pytest.approx(0.25)
    assert psnr(zeros, half) == pytest.approx(10 * math.log10(4.0))
    assert mse(image, image + 0.1) == pytest.approx(0.01)
    assert psnr(image, image + 0.1) == pytest.approx(20.0)
    assert mse(image, image) == 0.0
    assert psnr(image, image) == math.inf
    # data_range scales the peak: range 2 adds 20 log10(2) dB.
    assert psnr(zeros, half, data_range=2.0) == pytest.approx(10 * math.log10(16.0))


def test_mse_on_one_pixel() -> None:
    a = np.zeros((8, 8))
    b = a.copy()
    b[3, 4] = 1.0
    assert mse(a, b) == pytest.approx(1 / 64)
    assert psnr(a, b) == pytest.approx(10 * math.log10(64))


def test_ssim_identity_and_constant_images() -> None:
    rng = np.random.default_rng(0)
    image = rng.random((8, 8))
    assert ssim(image, image) == pytest.approx(1.0)
    # Two constant images a, b: every window has mu_x = a, mu_y = b and no variance, so
    # SSIM = (2ab + C1) / (a^2 + b^2 + C1) with C1 = (0.01 * data_range)^2.
    c1 = 0.01**2
    assert ssim(np.zeros((8, 8)), np.full((8, 8), 0.5)) == pytest.approx(c1 / (0.25 + c1))
    expected = (2 * 0.2 * 0.6 + c1) / (0.2**2 + 0.6**2 + c1)
    assert ssim(np.full((8, 8), 0.2), np.full((8, 8), 0.6)) == pytest.approx(expected)
    # Symmetric, and below 1 for different images.
    other = rng.random((8, 8))
    assert ssim(image, other) == pytest.approx(ssim(other, image))
    assert ssim(image, other) < 0.5


def test_metrics_reject_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="same shape"):
        mse(np.zeros((8, 8)), np.zeros((8, 7)))
    with pytest.raises(ValueError, match="2-D"):
        ssim(np.zeros((1, 8, 8)), np.zeros((1, 8, 8)))


def test_idlg_label_is_the_most_negative_row() -> None:
    # Rows (p_c - y_c) * h with h > 0: only the true class (2 here) sums below zero.
    h = np.array([0.2, 0.7, 0.1])
    p = np.array([0.1, 0.3, 0.4, 0.2])
    y = np.array([0.0, 0.0, 1.0, 0.0])
    assert idlg_label(np.outer(p - y, h)) == 2
    with pytest.raises(ValueError, match="2-D"):
        idlg_label(np.zeros(4))


def test_network_size() -> None:
    net = dlg_lenet()
    sizes = [p.numel() for p in net.parameters()]
    # 3 convolutions (12*1*25 + 12, then 2 x (12*12*25 + 12)) and Linear(192 -> 10).
    assert sizes == [300, 12, 3600, 12, 3600, 12, 1920, 10]
    assert sum(sizes) == 9466


def test_audit_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nu"):
        run_dlg_audit([-1.0], [0], tmp_path, quick=True, progress=lambda _: None)
    with pytest.raises(ValueError, match="seed"):
        run_dlg_audit([1.0], [-2], tmp_path, quick=True, progress=lambda _: None)
    with pytest.raises(ValueError, match="seeds"):
        run_dlg_audit([1.0], [], tmp_path, quick=True, progress=lambda _: None)
    with pytest.raises(ValueError, match="label_attack"):
        run_dlg_audit([1.0], [0], tmp_path, quick=True, label_attack="x")


# --------------------------------------------------------------------------- the audit


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_quick_audit_reproduces_the_paper_shape(tmp_path: Path) -> None:
    # Prepare
    lines: list[str] = []

    # Execute: one seed, the paper's multipliers; the nu = 0 baseline is added.
    rows = run_dlg_audit(list(QUICK_NUS), [0], tmp_path, quick=True, progress=lines.append)

    # Assert
    assert [row["nu"] for row in rows] == [0.0, *QUICK_NUS]
    assert all(tuple(row) == ROW_KEYS for row in rows)
    assert len(lines) == len(rows)
    by_nu = {row["nu"]: row for row in rows}
    # No noise: DLG reconstructs the image.
    assert by_nu[0.0]["mse"] < 1e-6
    assert by_nu[0.0]["ssim"] > 0.99
    assert by_nu[0.0]["epsilon_per_layer_sum"] == math.inf
    # nu = 0.001: still (near) perfect; nu >= 1: far worse.
    assert by_nu[0.001]["ssim"] > 0.95
    worst = min(row["mse"] for row in rows if row["nu"] >= 1.0)
    assert by_nu[0.001]["mse"] <= worst / 5
    # The release's cost is n/nu summed over the layers: 9466/nu.
    for nu in QUICK_NUS:
        assert by_nu[nu]["epsilon_per_layer_sum"] == pytest.approx(9466 / nu)
    assert (tmp_path / "figures" / "dlg_reconstructions.png").stat().st_size > 0


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_audit_is_deterministic(tmp_path: Path) -> None:
    first = run_dlg_audit([1.0], [3], tmp_path / "a", quick=True, progress=lambda _: None)
    second = run_dlg_audit([1.0], [3], tmp_path / "b", quick=True, progress=lambda _: None)
    assert first == second
    # The noise stream is keyed by nu, not by its position in the list.
    mixed = run_dlg_audit([10.0, 1.0], [3], tmp_path / "c", quick=True, progress=lambda _: None)
    assert [row for row in mixed if row["nu"] == 1.0] == [first[1]]
