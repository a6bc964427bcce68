"""The prose of the ``empirical-privacy`` and ``mia`` sections of docs/RESULTS.md; ch. 4's verdict.

Each experiment writes its own section (``empirical_privacy.audit_section``,
``mia.mia_section``) from its table and the text here: the two sections share their
introduction and how to read them, which stay apart from the experiments' code. Nothing here
imports an experiment, so that both can import it.
"""

from __future__ import annotations

import math

from experiments.core.tables import fmt, mean_ci, paired_difference, verdict

__all__ = ["EQUIVALENCE_MARGIN", "INTRO", "MECHANISMS_TEXT", "MIA_LIMITS", "MIA_TEXT",
           "RECORD_TEXT", "mia_findings", "mia_verdict"]

INTRO = (
    "Each ledger charges an ε per release; the audits below check it against what an attacker "
    "can actually do. An empirical lower bound ε_lb = ln((TPR_low − δ)/FPR_high) (Clopper–"
    "Pearson bounds at 95 % confidence, the likelihood-ratio threshold test chosen on one half "
    "of the releases and counted on the other) that exceeds the charge proves the accounting "
    "wrong; one below it proves nothing about the accounting being right, only that this test "
    "did not find an error. The regression test `tests/test_privacy_audit.py` runs the same "
    "audit at small scale in the test suite (seconds) and also requires it to catch the "
    "injected errors listed below.")
MECHANISMS_TEXT = (
    "**Mechanisms** (`experiments/audits/privacy_audit.py`, driving the real `mechanisms` objects' "
    "`sanitize`; the charge is what a real `PrivacyLedger` records for the release). "
    "Euclidean Laplace is audited in one dimension, where its law meets the d-privacy "
    "guarantee exactly, per unit of distance (two models at distance 1 for the fixed "
    "calibration; updates ±‖δ‖ for the neighbourhood one, whose charge n/ν covers distance "
    "‖δ‖). Gaussian and sign: the whole clipped update along the axis joining the two "
    "centres; k = 2 reproduces the client's path with the real mechanism objects (each data "
    "set picks a different hypothesis, 10·C apart, trains away from the other, and the "
    "hypotheses' diameter is passed as the client passes it; the real client's own path is "
    "driven by `tests/test_adversarial_server.py`); its rows repeat k = 1's number for "
    "number, as they should: with σ = z·(2C + D) the projected law is the same, and both "
    "audits draw the same seeds. *exact* is the largest ε the release's law "
    "allows for that pair at that δ: the gap from the charge to it is the accounting's slack "
    "(RDP's conversion for the Gaussian, post-processing for the sign), the gap from it to the "
    "bound the test's (its tails need more releases).")
RECORD_TEXT = (
    "**Record level** (`dpsgd`, `experiments/audits/record_audit.py`). Every release is made by "
    "the device's own path: settings resolved from a run config and a device policy (its "
    "`neighbouring` included), `plan_record_release` (the event a real `PrivacyLedger` "
    "charges: record-level ε at δ), `release_record` (the k = 2 report-noisy-min, DP-SGD "
    "with Opacus's per-sample gradients, the release check), fixed clipping at C = 1. The "
    "neighbouring inputs are a crafted canary record in or out (add/remove) or replaced by "
    "its mirror image (replace-one, the device default): a bias-free linear classifier of "
    "two classes, and a canary whose one feature no other record uses, so that its gradient "
    "lies in a column of the weights of its own, in a fixed direction, with a norm far above "
    "C: clipping leaves exactly C there, and the projection of the release on that direction "
    "is s·Binomial(T, q) + N(0, Tν²) in units of C (s = 1 in, 0 out, −1 replaced), whose "
    "exact likelihood ratio is the test. Each release carries 100 such canary slots (half in, "
    "half out, at random): their directions are orthogonal and the noise isotropic, so each "
    "slot is one independent trial of the one-record pair and *releases per input* counts "
    "slots; the row with one canary per release checks that design at one trial a release. "
    "k = 2: one canary per release, whose loss is 0 under one hypothesis and the loss clip L "
    "under the other, beside a record that tilts the sums by L/2, so that the choice turns "
    "on the canary; the test reads which hypothesis the release was trained from. *exact*: "
    "closed form at q = 1, numerical integration at T = 1, blank otherwise.")
MIA_TEXT = (
    "**Membership inference** (thesis 004 ch. 4, `experiments/audits/mia.py`). One device's "
    "release after one round of gpfl's own client (`client.numpy_client.GpflClient`, "
    "called in process "
    "with the experiments' device policy) on a random half of the candidate records; loss "
    "score (eq. 4.2), shadow-model calibration (shadows: the same client on random halves of "
    "the candidates; each record calibrated by the shadows that did not train on it) and "
    "noisy-neighbour calibration (Gaussian noise at the first layer's output, eq. 4.6, σ by a "
    "golden-section search of the AUC on a calibration half). Every metric is taken on the "
    "other half of the candidates. The ε columns are eq. 4.4 on the released model (each "
    "record is one trial of one model, so they measure that model, not the mechanism); the "
    "charged cost of each release is n/ν (Laplace, per distance ‖δ‖) or ε = 8 at δ = 1e-5 "
    "(Gaussian, device level). Cost: seconds of this run for each calibration (shadow: "
    "training and scoring the shadows; noisy: the σ search and scoring). "
    "**The thesis's own setting differs**: its comparison (ch. 4, Fig. 4.3-4.4) audits a "
    "language model, GPT-2 pre-trained on OpenWebText and fine-tuned on 60 % of WikiText, "
    "with 10 shadow models, 10 noisy neighbours per sample (noise at the output of the "
    "embedding layer) and 126-token WikiText samples as non-members, without any local "
    "privacy mechanism; ours audits gpfl's small classifiers (scikit-learn digits and "
    "breast-cancer, one device's release) with and without gpfl's mechanisms, because no "
    "language model or WikiText ships with the installed packages. A verdict below is about "
    "these models, not about GPT-2.")
MIA_LIMITS = (
    "How to read it. An evaluation half holds about 100 members and 100 non-members per seed "
    "on digits (400 candidates) and about 75 of each on breast-cancer (300), so TPR at FPR "
    "0.1 % can only be read at FPR 0, and the 95 % lower bound on ε, which splits that half "
    "again, has little power: "
    "a bound of 0 there says the attack is too weak to certify anything at this size, not "
    "that the model is private. The point estimates of eq. 4.4 are the thesis's measure "
    "(Fig. 4.4); they carry no confidence. The Gaussian release at ε = 8 on one device is "
    "noise of σ ≈ 1.3 per coordinate on every parameter: its target is at chance accuracy, "
    "and every attack with it. Costs were measured on a machine shared with other work; "
    "their ratio within a seed is the comparable figure.")


#: How far below the shadow calibration (in AUC, and in TPR at FPR 1 %) the noisy one may be
#: and still count as matching it ("≈" in ch. 4's finding).
EQUIVALENCE_MARGIN = 0.05
Interval = tuple[float, float, int]


def mia_verdict(auc: Interval, tpr: Interval, cost: Interval) -> str:
    """Ch. 4's finding, read from the 95 % intervals of noisy − shadow and of the cost ratio.

    *Reproduced*: both differences' intervals lie above −margin (noisy no worse than shadow by
    more than the margin) and the cost ratio's above 1 (shadow costs more). *Not reproduced*:
    an interval lies wholly below −margin, or the ratio's wholly at or below 1. Otherwise
    *inconclusive* at this number of seeds. (Where the shadow attack itself is not above
    chance, matching it says little: `mia_findings` says so beside the verdict.)
    """
    def bounds(i: Interval) -> tuple[float, float]:
        mean, half, n = i
        half = half if n >= 2 and math.isfinite(half) else math.inf
        return mean - half, mean + half

    (auc_lo, auc_hi), (tpr_lo, tpr_hi), (cost_lo, cost_hi) = map(bounds, (auc, tpr, cost))
    if auc_hi < -EQUIVALENCE_MARGIN or tpr_hi < -EQUIVALENCE_MARGIN or cost_hi <= 1.0:
        return "not reproduced"
    if auc_lo > -EQUIVALENCE_MARGIN and tpr_lo > -EQUIVALENCE_MARGIN and cost_lo > 1.0:
        return "reproduced"
    return "inconclusive"


def mia_findings(rows: list[dict[str, str]]) -> list[str]:
    """Markdown: noisy against shadow (paired by seed), the cost ratio, and the verdict."""
    lines = [f"Does ch. 4's finding (noisy-neighbour calibration ≈ shadow-model calibration, at "
             f"a fraction of the cost) hold? Each difference paired by seed, mean [95 % "
             f"Student-t interval]. *Reproduced* when the intervals of noisy − shadow in AUC "
             f"and in TPR at FPR 1 % both lie above −{EQUIVALENCE_MARGIN:g} and that of the "
             f"cost ratio shadow / noisy above 1; *not reproduced* when one difference's "
             f"interval lies wholly below −{EQUIVALENCE_MARGIN:g} or the ratio's at or below "
             f"1; *inconclusive* otherwise.", ""]
    verdicts: dict[str, str] = {}
    for task, noise in dict.fromkeys((r["task"], r["noise"]) for r in rows):
        cell = [r for r in rows if r["task"] == task and r["noise"] == noise]

        def by(column: str, cell: list[dict[str, str]] = cell) -> dict[int, float]:
            return {int(r["seed"]): float(r[column]) for r in cell if r.get(column)}

        auc = paired_difference(by("auc_noisy"), by("auc_shadow"))
        above = paired_difference(by("auc_shadow"), by("auc_loss"))
        tpr = paired_difference(by("tpr_1_noisy"), by("tpr_1_shadow"))
        cost = mean_ci([float(r["cost_s_shadow"]) / float(r["cost_s_noisy"]) for r in cell])
        found = mia_verdict(auc, tpr, cost)
        shadow_mean, shadow_half, seeds = mean_ci([float(r["auc_shadow"]) for r in cell])
        if found == "reproduced" and not (seeds >= 2 and shadow_mean - shadow_half > 0.5):
            found += " (vacuously: the shadow attack's AUC is not above chance here)"
        if noise == "none":
            verdicts[task] = found
        lines.append(f"- {task}, {noise}: AUC noisy − shadow {verdict(*auc)}; TPR at 1 % "
                     f"noisy − shadow {verdict(*tpr)}; AUC shadow − loss {verdict(*above)}; "
                     f"shadow costs {_ratio(cost)}× the noisy calibration: **{found}**.")
    if verdicts:
        lines += ["", "**Verdict** on the models trained without noise (where the attacks "
                  "have something to find; with noise both calibrations sit near chance, "
                  "and matching there says little): " + "; ".join(
                      f"{task}: **{found}**" for task, found in verdicts.items()) + "."]
    return lines


def _ratio(cost: Interval) -> str:
    mean, half, n = cost
    if n >= 2 and math.isfinite(half):
        return f"{fmt(mean, 3)} [{fmt(mean - half, 3)}, {fmt(mean + half, 3)}]"
    return fmt(mean, 3)
