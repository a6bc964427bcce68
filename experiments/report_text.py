"""The prose of docs/RESULTS.md: what the papers report and why ours differs.

Each entry is Markdown. A paragraph may be wrapped over several lines here; `flow` joins
it back into one line, so the generated file has one line per paragraph, list item or
table row.
"""

from __future__ import annotations

__all__ = ["TEXT", "flow"]


def flow(text: str) -> str:
    """Join the wrapped lines of each paragraph and list item; keep code blocks as they are."""
    out: list[str] = []
    fenced = False
    for line in text.strip("\n").splitlines():
        starts_block = not out or not line or not out[-1] or line.startswith(("- ", "|", "```"))
        if fenced or starts_block:
            out.append(line)
        else:
            out[-1] += " " + line
        if line.startswith("```"):
            fenced = not fenced
    return "\n".join(out)


_RAW: dict[str, str] = {
    "write_report-1": """
`gpfl-experiment` is the same command once the package is installed. Each experiment writes
`runs/experiments/<name>/results.csv`, `figures/*.png` and `meta.json`; finished federations
are cached in `runs/experiments/_runs/` (keyed by their run config), so an interrupted sweep
resumes and `leakage` reuses the federations of `accuracy-vs-nu`; `--fresh` runs them again.
""",
    "synthetic-1": """
**Paper (001 §4.1, appendix; 000 §5.1).** 100 users × 10 samples, U = 7 per round, E = 1, s =
0.1, B = 10, ν = 5, patience 6. FedAvg "settles somewhere in between the optimal parameters"
(Fig. 1b); with IFCA "the optimized clients parameters almost overlap the optimal parameters"
(Fig. 1e); with ours "in just a few rounds of training the process converges to values very
close to the two optimal parameters" (Fig. 1h). Each release costs n/ν = 2/5 = 0.4; "the
maximum composed value of the privacy leakage was 2.4" (000).
""",
    "synthetic-2": """
**Differences.** (1) Rounds: the paper's patience of 6 rounds stops our ν = 5 runs long before
the optima (the validation loss under noise is not monotone), so we run 300 rounds (quick) or
up to 300 with a patience of 40 (full), and deliver the best validation round. (2) Leakage:
the maximum composed spend here is {spend} (Σ ε·r = 0.4 × releases) against the paper's 2.4,
because our runs are longer: 7 of 100 users per round over up to 300 rounds gives ~20 releases
per user on average, the paper's short run ~6 at most. The per-release cost, 0.4, is the
paper's. (3) Figure 2's clusters are the users' true groups (the server never learns a
client's cluster).
""",
    "accuracy-1": """
**Paper (001 Table 2; 000 Table 4).** Table 3's CNN (n₀ = 1,206,590) on FEMNIST, half the
users' images rotated, validation accuracy over three seeds: flat from ν = 0 to ν = 3
(0.832-0.843), then 0.812 at ν = 5, 0.692 at ν = 10, 0.561 at ν = 15.
""",
    "accuracy-2": """
**Differences.** The data are scikit-learn's 1,797 8×8 digits (10 classes, 50 training users,
~29 images each) instead of FEMNIST (62 classes, ~3,500 users), and the CNN has 83,562
parameters instead of 1.2 M, so absolute accuracies are not comparable (digits are easier:
~0.94-0.95 without noise). The shape is the paper's: flat for small ν, then a drop at ν = 15;
where the drop starts depends on how many releases are averaged per cluster (U = 7 here; with
≥ 10 users per round the ν = 15 noise averages out on digits) and on the rounds: the quick
profile runs 30 rounds without early stop, the full one the paper's rule (validation every 5
rounds, stop after 5 without improvement, at most 150 rounds instead of 500).
""",
    "leakage-1": """
**Paper (001 Table 1).** Hospital charges (11-parameter network, 100 clients per round),
median and maximum of Σ ε·r over the whole set of clients, averaged over 10 seeds:
""",
    "leakage-2": """
**Differences.** Under the neighbourhood calibration every release costs exactly n/ν, so a
client's spend is (its releases) × n/ν: the table scales as 1/ν and with the number of
parameters, and k matters only through how many rounds a run lasts. On digits the numbers are
7,600× the hospital's for the same releases (83,562 vs 11 parameters): as 001 says for
FEMNIST, no meaningful formal guarantee remains for a CNN, which is what the DLG audit
examines empirically. Our digits users take part more often than the paper's hospitals (7 of
50 per round vs 100 of ~2,000).
""",
    "fairness-1": """
**Paper (004 §2.5.2, Fig. 2.7 and 2.8).** Synthetic data, 800 majority + 200 minority users:
"for all the metrics of fairness and the values of the noise multiplier, the personalized
model is seen to show improved fairness over the non-personalized model", and "fairness
deteriorates as the value of the noise multiplier increases". On FEMNIST with the rotated 20 %
as the minority and parity labels flipped for it (Fig. 2.8): "the personalized model training
harbors significantly better group fairness across all metrics", the effect of ν being less
notable. The thesis gives the figures, not the numbers.
""",
    "fairness-2": """
**Differences.** Synthetic: equal opportunity and equalized odds behave as in the thesis: one
model serves the majority and mislabels the minority (gaps ≈ 0.3-0.4), two models serve both
(gaps near 0). Demographic parity need not improve: it compares P(Ŷ = 1) across groups, and
the two groups' true base rates differ (the minority's rule labels a different share of its
samples 1), so the accurate personalized model inherits that gap while the majority model's
predictions happen to have similar rates in both groups. The thesis does not give U, E, s, B
or the rounds; ours: 20 users per round, E = 1, s = 0.5, B = 10, 100 rounds (60 quick), a
logistic regression on the labels (see `tasks/fairness.py`). Digits: scikit-learn's 8×8 digits
instead of FEMNIST (50 users instead of thousands, ~4 rotated users among the 20 validation
users), Table 3's CNN with two outputs; see `experiments/fairness.py` for the training
settings.
""",
    "budgets-1": """
002 also finds "the larger the privacy budget, the higher accuracy" with uniform budgets, and
C best in most personalized settings (B and C both better than A on IID data; on forest cover
types non-IID neither gains).
""",
    "budgets-2": """
**Ours** (accuracy of the final model after R = 10 rounds, as 002 reports it; mean ± half-width
of the two-sided 95 % Student-t interval over seeds, (seeds); `composed`: ε_i is the client's
total over the run, our semantics; `per-round`: ε_i per release, 002's reading, with the total
the ledgers report in the last column). **The budgets are not 002's.** At 002's own budgets
(ε = (1, 1, 10) on IID data, (5×5, 15×5) with the sign mechanism) the arithmetic mean A stayed
at chance on our 30 users (0.08-0.24 on ten classes in earlier runs), where no aggregation can
show an effect. The rows below use the smallest scale of 002's patterns (of ×2, ×5, ×10 tried
in a simulation of the panel) at which A learns: per release ×10 (IID, Gaussian) and ×4 (non-IID,
sign); in the `composed` reading, the totals those per-release budgets come to over the
R = 10 releases (ε = 10 composes to 52.6 at δ = 1/500, ε = 20 to 102 at δ = 10⁻⁵), so both
readings put about the same noise on every release and differ only in what ε_i means. At such
budgets the formal guarantee is void (a composed ε of 50 bounds nothing); they are here to test
002's aggregation claim, not as a privacy setting. 002 compares B with A on its Gaussian panels
only; the sign panel runs A and C.
""",
    "budgets-3": """
**Differences.** (1) Accounting: 002 calibrates each round's noise to (ε_i, δ_i) and states no
composition; gpfl composes a client's releases with dp-accounting's RDP accountant, so under
our semantics ε_i is the total and every release carries ~√R times more noise. Both are run:
the `per-round` rows reproduce 002's reading and show what it really costs (the composed ε of
R = 10 releases at δ_i), the `composed` rows are what a gpfl user configuring ε_i gets. (2)
Sensitivity: we clip the whole update to L2 norm C and release it (Δ = 2C for the vector,
user-level local privacy); 002's σ formula does not scale with the clipping bound and its sign
mechanism takes Δ₂ = 2c per coordinate. Under our whole-vector accounting a 650-parameter
model keeps little signal at 002's ε, which is why the budgets above are larger than 002's.
(3) Model and data: 002's logistic regression on the same 8×8 digits, trained with 5 local
epochs of SGD (learning rate 0.5) instead of sklearn's "optimal" schedule; 002's N clients are
cycled over 30 of ours (each stands for 10); the Dirichlet α (0.5) is ours, 002 does not give
it. (4) 002 computes C's probabilities once over all N clients; ours per round (identical
here: every client takes part every round). (5) The full profile adds 002's own budgets, the
uniform budgets, the Table 3 CNN (83,562 parameters: no usable signal at any of 002's ε) and
the fairness task's 3-parameter logistic regression (the small-model regime).
""",
    "dlg-1": """
**Paper (001 Fig. 5; 000 §5.4).** "When ν = 10⁻³ the ground truth image is fully
reconstructed. Up to ν = 10⁻¹ we see that at least partial reconstruction is possible. For ν ≥
1 [...] the DLG attack fails to reconstruct input samples" (FEMNIST, per-layer Laplace,
sigmoid network, batch 1, one local step; figure only).
""",
    "dlg-2": """
**Ours** (8×8 digits, `experiments/dlg.py`: Zhu et al.'s sigmoid LeNet sized for 8×8, 9,466
parameters; one client, one image, one SGD step, released with the neighbourhood-calibrated
Euclidean Laplace mechanism). The server knows θ, the step size and ν (the release's cost is
n/ν) and runs five attacks: DLG and iDLG (L2 gradient matching, L-BFGS), Geiping et al.'s
cosine matching with total variation (signed Adam, pixels kept in [0, 1]), the noise's own
negative log-likelihood Σ_b n_b·(‖ĝ_b − g_b‖/(ν‖g_b‖) + log‖g_b‖) (not squared, per noised
block), and that likelihood plus a Gaussian prior fitted to public digits of every class (the
maximum a posteriori image). Every attack but DLG reads the label off the last layer's
gradient first; each keeps, of its restarts, the one with the lowest value of its own
objective. The victims are private digits, one per class (two in the full profile; the quick
profile leaves DLG out: it costs as much as iDLG and did no better in our trials);
"recognised" means that an RBF SVM trained on the public digits reads the true digit in the
reconstruction (chance 0.1 over ten digits); the
class mean (the mean public image of the true digit) is the reference of an attacker who knows
the label and nothing else. The strongest attack of a (mode, ν) is the one with the highest
mean recognised fraction over the images (ties: PSNR), a choice the attacker can make itself
on public images since ν is public.
""",
    "dlg-per-layer": "each layer noised with its own ε_l = n_l/(ν‖δ_l‖), the paper's test",
    "dlg-whole-model": "one draw over the whole update, ε = n/(ν‖δ‖), what a gpfl client "
                       "releases by default",
    "dlg-4": """
**Where reconstruction stops** (from the strongest attack's rows: the largest ν of the grid at
which the 95 % interval clears its reference):
""",
    "dlg-3": """
**Differences.** 8×8 digits and a 9,466-parameter network instead of FEMNIST and Table 3's CNN
(which L-BFGS cannot invert even without noise, see the module's notes); the attacker is given
float64, the learning rate and ν. The paper ran DLG alone and shows images; the attacks that
use the noise's likelihood and a digit prior reconstruct at ν where DLG no longer does, so
"DLG fails for ν ≥ 1" is a statement about DLG, not about what the release protects. The
label is read off the gradient well beyond the ν where the image stops being reconstructed:
at those ν a release still tells the server which digit the client trained on.
""",
    "scale-1": """
Rounds per minute are measured between the first and the last round's log line; startup
(SuperLink, Ray, the apps) is reported apart; each number is the mean ± the half-width of the
two-sided 95 % Student-t interval over the repeats (seeds 0-4). Measured on this project's
2-core machine: a larger one runs more Ray workers at once. The same shape side by side with
Flower's own FedAvg, one command, and where the round's time goes (profiled):
[BENCHMARKS.md](BENCHMARKS.md), "Scale against Flower's FedAvg, side by side" (gpfl 0.97× FedAvg's
round time, ranges overlapping).
""",
    "differences-1": """
- **Data.** No downloads here: scikit-learn's bundled 8×8 digits stand in for FEMNIST and
MNIST (002 itself uses them for its MNIST experiments), the fairness task generates 004's
synthetic data, the hospital table needs the CMS CSV from the user.
""",
    "differences-2": """
- **Models.** Table 3's CNN sized for 8×8 has 83,562 parameters (1.2 M on FEMNIST). 002's
model is the digits task's `model = "logistic"` (650 parameters), its non-IID split `partition
= "dirichlet"`; the thesis's Fig. 2.8 protocol is `labels = "parity"`.
""",
    "differences-3": """
- **Scale and rounds.** 2 shared cores: tens of users per digits federation instead of
thousands; quick profiles run fixed, short round counts; full profiles follow the papers'
stopping rules where those let the runs converge (the synthetic task's patience of 6 does not
under ν = 5, so it is 40 there).
""",
    "differences-4": """
- **Accounting.** Gaussian and sign budgets are composed over all releases with dp-accounting
(RDP), stricter than 002's per-round budgets. d-privacy spend is Σ ε·r as in 001.
""",
    "differences-5": """
- **Delivered model.** Accuracies and fairness gaps are those of the best validation round
(the hypotheses a run delivers), each validation user scored with the hypothesis that fits it
best (001's Eq. 15); personalized-budgets reports the final model after R rounds, as 002 does.
""",
}
#: The prose by name: ``<section>-<n>``, in the order the section uses it.
TEXT: dict[str, str] = {key: flow(text) for key, text in _RAW.items()}
