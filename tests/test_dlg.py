"""The gradient-inversion attacks and the DLG audit (experiments.audits: dlg, dlg_audit).

Metrics and the likelihood by hand, the attacker's closed-form gradients against autograd, the
noise against the client's own mechanism, and the audit's shape on the smoke profile.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from client.numpy_client import build_mechanism
from client.policy import DevicePolicy
from client.settings import ClientSettings
from experiments.audits import dlg, dlg_attacks, dlg_audit, dlg_objectives
from experiments.audits.dlg import (
    CLIENT_DEFAULT_MODE,
    Effort,
    attack,
    batched_gradients,
    digits,
    dlg_lenet,
    idlg_label,
    observe,
    one_thread,
    release,
    run_attacks,
    victim,
)
from experiments.audits.dlg_audit import COLUMNS, check_profile, mse, psnr, ssim
from experiments.audits.dlg_report import STRONGEST, limits, paper_claims
from settings import federation_defaults

TINY = Effort(restarts=2, lbfgs_evals=20, adam_steps=30)

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
    other = rng.random((8, 8))
    assert ssim(image, other) == pytest.approx(ssim(other, image))
    assert ssim(image, other) < 0.5


def test_metrics_reject_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="same shape"):
        mse(np.zeros((8, 8)), np.zeros((8, 7)))
    with pytest.raises(ValueError, match="2-D"):
        ssim(np.zeros((1, 8, 8)), np.zeros((1, 8, 8)))


# --------------------------------------------------------------------------- the victim


def test_idlg_label_is_the_most_negative_row() -> None:
    # Rows (p_c - y_c) * h with h > 0: only the true class (2 here) sums below zero.
    h = np.array([0.2, 0.7, 0.1])
    p = np.array([0.1, 0.3, 0.4, 0.2])
    y = np.array([0.0, 0.0, 1.0, 0.0])
    assert idlg_label(np.outer(p - y, h)) == 2
    with pytest.raises(ValueError, match="2-D"):
        idlg_label(np.zeros(4))


def test_network_size() -> None:
    sizes = [p.numel() for p in dlg_lenet().parameters()]
    # 3 convolutions (12*1*25 + 12, then 2 x (12*12*25 + 12)) and Linear(192 -> 10).
    assert sizes == [300, 12, 3600, 12, 3600, 12, 1920, 10]
    assert sum(sizes) == 9466


def test_victims_are_ten_private_digits_the_recogniser_reads() -> None:
    data = digits()
    indices = [data.victim_index(i) for i in range(10)]
    # Ten different digits, in order, none of them among the recogniser's (public) images.
    assert [int(data.labels[i]) for i in indices] == list(range(10))
    assert not set(indices) & set(data.public.tolist())
    assert set(indices) <= set(data.private.tolist())
    assert list(data.recognise(data.images[indices])) == list(range(10))
    with pytest.raises(ValueError, match="image"):
        data.victim_index(-1)


def test_closed_form_gradients_equal_autograd() -> None:
    # Prepare: victim 4's network, three dummies with soft labels.
    net = victim(4).net
    params = [p.detach() for p in net.parameters()]
    generator = torch.Generator().manual_seed(0)
    images = torch.rand((3, 1, 8, 8), generator=generator, dtype=torch.float64)
    labels = torch.softmax(torch.randn((3, 10), generator=generator, dtype=torch.float64), -1)

    # Execute
    batched = batched_gradients(params, images, labels)

    # Assert: each image's gradient is autograd's through the module, to rounding.
    for b in range(3):
        loss = torch.sum(-labels[b] * torch.log_softmax(net(images[b:b + 1])[0], dim=-1))
        reference = torch.autograd.grad(loss, list(net.parameters()))
        for got, want in zip(batched, reference, strict=True):
            assert torch.allclose(got[b], want, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------- the noise


def test_whole_model_noise_is_what_a_default_client_releases(tmp_path: Path) -> None:
    # Prepare: the mechanism a client builds from the federation's and the device's defaults.
    policy = DevicePolicy.load({"ledger-dir": str(tmp_path)}, environ={})
    privacy = ClientSettings.resolve(federation_defaults(), policy).privacy
    nu = float(privacy.noise_multiplier)

    # Execute
    client = victim(0)
    released, cost = release(client, nu, CLIENT_DEFAULT_MODE)

    # Assert: the same mechanism (neighbourhood calibration over the whole model), and noise
    # whose norm is nu·‖δ‖ (Gamma(n, ‖δ‖ν/n): relative spread 1/√9466 ≈ 1 %), cost n/ν.
    assert repr(build_mechanism(privacy)) == repr(dlg.mechanism(nu, CLIENT_DEFAULT_MODE))
    assert "per_layer=False" in repr(dlg.mechanism(nu, CLIENT_DEFAULT_MODE))
    noise = np.concatenate([(r - c).ravel() for r, c in zip(released, client.theta_c,
                                                            strict=True)])
    delta = np.concatenate([(c - t).ravel() for c, t in zip(client.theta_c, client.theta,
                                                            strict=True)])
    assert np.linalg.norm(noise) == pytest.approx(nu * np.linalg.norm(delta), rel=0.05)
    assert cost == pytest.approx(9466 / nu)


def test_per_layer_noise_follows_each_layer() -> None:
    client = victim(1)
    released, cost = release(client, 2.0, "per-layer")
    assert cost == pytest.approx(9466 / 2.0)
    for r, c, t in zip(released, client.theta_c, client.theta, strict=True):
        if c.size >= 1920:  # the large layers: the noise norm concentrates (spread ≤ 2.3 %)
            assert np.linalg.norm(r - c) == pytest.approx(2.0 * np.linalg.norm(c - t), rel=0.1)
    # nu = 0 is the baseline: the update itself, no cost.
    raw, free = release(client, 0.0, "per-layer")
    assert all(np.array_equal(a, b) for a, b in zip(raw, client.theta_c, strict=True))
    assert free == math.inf
    with pytest.raises(ValueError, match="mode"):
        release(client, 1.0, "per-neuron")


def test_negative_log_likelihood_matches_the_laplace_density() -> None:
    # Prepare: a whole-model release at nu = 3 and two candidate images.
    nu, s = 3.0, dlg.LEARNING_RATE
    client = victim(2)
    released, _ = release(client, nu, "whole-model")
    obs = observe(client.theta, released, nu=nu, mode="whole-model")
    candidates = torch.stack([torch.from_numpy(client.image), torch.full((8, 8), 0.3,
                                                                         dtype=torch.float64)])
    candidates = candidates.reshape(2, 1, 8, 8)
    labels = dlg_attacks.one_hot_labels(client.label, 2)
    grads = dlg_objectives.flat_gradients(batched_gradients(obs.params, candidates, labels))

    # Execute
    nll = dlg.likelihood_objective(obs)(candidates, grads).numpy()

    # Assert: by hand, a candidate's update is δ = −s·g, its ε = n/(ν‖δ‖), and the release's
    # density is ∝ ε^n exp(−ε‖θ̂ − θ + s·g‖): −log p = −n log ε + ε‖θ̂ − θ + s·g‖ + const.
    theta = np.concatenate([t.ravel() for t in client.theta])
    shown = np.concatenate([r.ravel() for r in released])
    n = theta.size
    by_hand = []
    for g in grads.numpy():
        epsilon = n / (nu * s * np.linalg.norm(g))
        by_hand.append(-n * math.log(epsilon) + epsilon * np.linalg.norm(shown - theta + s * g))
    assert nll[0] - nll[1] == pytest.approx(by_hand[0] - by_hand[1], rel=1e-9)
    # The true image is the likelier one.
    assert nll[0] < nll[1]


# --------------------------------------------------------------------------- the attacks


def test_restarts_are_chosen_by_the_attacks_own_objective() -> None:
    # Prepare
    client = victim(5)
    released, _ = release(client, 1.0, "per-layer")
    obs = observe(client.theta, released, nu=1.0, mode="per-layer")

    # Execute: the same attacks with one and with three restarts (the first is shared).
    with one_thread():
        one = run_attacks(["likelihood", "prior"], obs, Effort(1, 20, 30), seed=5)
        three = run_attacks(["likelihood", "prior"], obs, Effort(3, 20, 30), seed=5)

    # Assert: the loss kept is the attack's objective at the image kept (nothing else chose
    # it), and more restarts never keep a worse one.
    for name, objective in (("likelihood", dlg.likelihood_objective(obs)),
                            ("prior", dlg.prior_objective(obs))):
        kept = three[name]
        image = torch.from_numpy(kept.image).reshape(1, 1, 8, 8)
        labels = dlg_attacks.one_hot_labels(kept.label, 1)
        grads = dlg_objectives.flat_gradients(batched_gradients(obs.params, image, labels))
        assert float(objective(image, grads)[0]) == pytest.approx(kept.loss, rel=1e-9)
        assert kept.loss <= one[name].loss
    with pytest.raises(ValueError, match="attack"):
        run_attacks(["oracle"], obs, TINY, seed=5)


def test_attacks_are_deterministic_and_independent_of_each_other() -> None:
    with one_thread():
        first = attack(7, 2.0, "whole-model", ("idlg", "likelihood"), TINY)
        again = attack(7, 2.0, "whole-model", ("idlg", "likelihood"), TINY)
        alone = attack(7, 2.0, "whole-model", ("likelihood",), TINY)
    for name in ("idlg", "likelihood"):
        assert np.array_equal(first.reconstructions[name].image,
                              again.reconstructions[name].image)
    # Batched beside other attacks or alone, an Adam attack gives the same answer.
    np.testing.assert_allclose(first.reconstructions["likelihood"].image,
                               alone.reconstructions["likelihood"].image, atol=1e-9)
    assert first.label_read == first.label == 7


# --------------------------------------------------------------------------- the audit


def test_profile_is_checked() -> None:
    assert check_profile([3.0, 1.0, 1.0], [2, 2, 0]) == ([0.0, 1.0, 3.0], [2, 0])
    with pytest.raises(ValueError, match="nu"):
        check_profile([-1.0], [0])
    with pytest.raises(ValueError, match="image"):
        check_profile([1.0], [-2])
    with pytest.raises(ValueError, match="images"):
        check_profile([1.0], [])


def _row(nu: float, image: int, recognised: int, psnr_db: float) -> dict[str, str]:
    return {"mode": "per-layer", "nu": str(nu), "image": str(image), "label": str(image),
            "attack": STRONGEST, "picked": "prior", "mse": "0.01", "psnr": str(psnr_db),
            "ssim": "0.5", "recognised": str(recognised), "closer_than_class_mean": "0",
            "label_read": str(image), "label_recovered": "1", "class_mean_psnr": "14",
            "class_mean_ssim": "0.6", "class_mean_mse": "0.04", "loss": "1", "cost": "1"}


def test_limits_are_read_from_the_intervals() -> None:
    # Prepare: ten images; every one recognised up to nu = 2, 4 of 10 at nu = 3 (t interval
    # 0.4 ± 0.37: reaches chance 0.1), none at nu = 5; PSNR 20-21 dB (class mean 14) up to
    # nu = 1, then 13 or 15 (a gain of 0 ± 0.75).
    rows = []
    for image in range(10):
        rows += [_row(0.0, image, 1, 60.0), _row(1.0, image, 1, 20.0 + image % 2),
                 _row(2.0, image, 1, 13.0 + 2 * (image % 2)), _row(3.0, image, int(image < 4),
                                                                   13.0 + 2 * (image % 2)),
                 _row(5.0, image, 0, 10.0)]
    rows += [{**r, "attack": "idlg"} for r in rows]

    # Execute
    found = limits(rows, "per-layer")

    # Assert
    assert found.recognisable == 2.0
    assert found.first_unrecognisable == 3.0
    assert found.beyond_label == 1.0
    assert found.label == 5.0


def test_the_papers_statements_are_read_on_dlgs_own_rows() -> None:
    # Prepare: DLG's rows: ν = 0.001 every image recognised at 40 dB (class mean 14); ν = 0.01
    # and 0.1 recognised 10/10 and 8/10; ν = 1 none, ν = 10 none. The strongest attack's rows
    # (recognised everywhere) must not count: the statements are about DLG.
    rows = []
    for image in range(10):
        rows += [_row(0.001, image, 1, 40.0 + image % 2), _row(0.01, image, 1, 30.0),
                 _row(0.1, image, int(image < 8), 20.0), _row(1.0, image, 0, 10.0),
                 _row(10.0, image, 0, 9.0)]
    dlg_rows = [{**r, "attack": "dlg"} for r in rows]
    strongest = [{**r, "recognised": "1"} for r in rows]

    # Execute
    claims = paper_claims(dlg_rows + strongest)

    # Assert: all three reproduced; with DLG recognising 6 of 10 at ν = 1, the third is not.
    assert len(claims) == 3 and all(c.endswith("reproduced.") or "reproduced for DLG" in c
                                    for c in claims), claims
    assert "**not" not in " ".join(claims)
    beaten = [{**r, "recognised": str(int(int(r["image"]) < 6))} if r["nu"] == "1.0" else r
              for r in dlg_rows]
    assert "**not reproduced**: DLG's reconstructions are recognised above chance at ν = 1." \
        in paper_claims(beaten + strongest)[2]
    # ν = 0.001 at the class mean's PSNR is not "fully reconstructed".
    flat = [{**r, "psnr": "14"} if r["nu"] == "0.001" else r for r in dlg_rows]
    assert paper_claims(flat)[0].endswith("**not reproduced**.")
    assert "untested" in paper_claims(strongest)[0]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_smoke_audit_reconstructs_without_noise_and_not_beyond_the_label_at_large_nu(
        tmp_path: Path) -> None:
    from experiments.cli import run_experiment

    # Execute: the smoke profile (3 images, nu in 0, 1, 10, both modes), as the CLI runs it.
    run_experiment("dlg", out=tmp_path, cache=tmp_path / "_runs", profile="smoke")

    # Assert
    with open(tmp_path / "results.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    attacks = dlg_audit.PROFILES["smoke"]["attacks"]
    assert list(rows[0]) == list(COLUMNS)
    assert len(rows) == 2 * 3 * 3 * (len(attacks) + 1)
    strongest = [r for r in rows if r["attack"] == STRONGEST]
    assert {r["picked"] for r in strongest} <= set(attacks)
    for mode in dlg.MODES:
        def of(nu: float, mode: str = mode) -> list[dict[str, str]]:
            return [r for r in strongest if r["mode"] == mode and float(r["nu"]) == nu]

        # No noise: reconstructed to rounding and read as the true digit.
        assert all(float(r["psnr"]) > 40 and r["recognised"] == "1" for r in of(0.0))
        # nu = 10: on average no closer to the image than the mean image of its digit.
        assert np.mean([float(r["psnr"]) for r in of(10.0)]) <= np.mean(
            [float(r["class_mean_psnr"]) for r in of(10.0)])
        # The label is read off the gradient at every nu.
        assert all(r["label_recovered"] == "1" for r in rows if r["mode"] == mode)
    for mode in dlg.MODES:
        assert (tmp_path / "figures" / f"dlg_reconstructions_{mode}.png").stat().st_size > 0
    assert (tmp_path / "figures" / "dlg_scores.png").stat().st_size > 0
    report = "\n".join(dlg_audit.EXPERIMENT.report(rows))
    assert "Student-t" in report and "whole-model" in report
