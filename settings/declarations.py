"""Every gpfl setting, declared once (the table `docs/SETTINGS.md` and the pyproject defaults show).

Each declaration says the setting's name, type, default, bounds and owner (see
:mod:`settings.schema` for what the owners mean). Value checks a type and bounds cannot say
(names, hashes, optima, device strings) are :mod:`settings.checks`; the ranges and value
sets, :mod:`settings.values`.
"""

from __future__ import annotations

from collections.abc import Callable

from settings.checks import (
    check_allowed_tasks,
    check_categories,
    check_column_list,
    check_device,
    check_divergence_factor,
    check_fab_hashes,
    check_ledger_file,
    check_ledger_folder,
    check_log_to,
    check_name,
    check_number_list,
    check_optima,
    check_positive_list,
    check_task_name,
)
from settings.setting import Setting
from settings.values import (
    AGGREGATION_PRIVACY,
    AGGREGATIONS,
    CLIP_MODES,
    CLUSTER_AGGREGATORS,
    MAX_COHORT,
    MAX_COUNT,
    MAX_EPOCHS,
    MAX_HIDDEN_UNITS,
    MAX_HYPOTHESES,
    MAX_LEARNING_RATE,
    MAX_PRIVACY_PARAMETER,
    MAX_RECORD_STEPS,
    MECHANISMS,
    NODE_IDENTITY,
    RECORD_CLIPPING,
    RECORD_RELATIONS,
    SAMPLE_BY,
    SERVER_UPDATES,
)


def _cap(name: str, what: str, device_default: float, group: str = "privacy") -> Setting:
    """Declare a cap on a device's total spend: a run may ask for a lower one (0 = no request)."""
    return Setting(name, float, 0.0, f"cap on {what}; 0 = no request, the device's cap applies",
                   owner="both", stricter="min", device_default=device_default, unset=0.0,
                   group=group, minimum=0.0)


def _task_list(name: str, default: str, text: str,
               check: Callable[[str], None] = check_column_list) -> Setting:
    """Declare a task's comma-separated list (column names unless ``check`` says otherwise)."""
    return Setting(name, str, default, text, group="tasks", check=check)


# ------------------------------------------------------------------------------ declarations
_DECLARATIONS: tuple[Setting, ...] = (
    # -- the run ---------------------------------------------------------------------------------
    # A name, not a fixed list: each side resolves it against the task plugins installed on it
    # (entry-point group gpfl.tasks, docs/TASKS.md); a device also against its allowed-tasks.
    Setting("task", str, "synthetic",
            "the learning task: a name an installed plugin registers (built in: synthetic, "
            "fairness, digits, femnist, hospital, tabular)", check=check_task_name),
    Setting("num-hypotheses", int, 2,
            "k, the number of models (one per group of clients); a device serves at most its "
            "max-hypotheses", minimum=1, maximum=MAX_HYPOTHESES),
    Setting("num-rounds", int, 20, "rounds of training", minimum=1, maximum=MAX_COUNT),
    Setting("clients-per-round", int, 7, "clients sampled each round (fewer if fewer connect)",
            minimum=1),
    Setting("eval-every", int, 1, "validate on held-out users every this many rounds", minimum=1),
    Setting("patience", int, 6,
            "stop after this many validations without a new best loss (0 = never)", minimum=0),
    # Read by the server alone (strategies.divergence), from its own validation: it only ends a
    # run (status "diverged"), so no value can weaken a device's privacy. A factor of 1 or less
    # would end honest runs that merely learn slowly: 0 (off) or more than 1.
    Setting("divergence-factor", float, 100.0,
            "end the run as diverged once divergence-validations validations in a row gave a "
            "loss above this many times the initial hypotheses' (or not finite); 0 = off, else "
            "more than 1",
            minimum=0.0, maximum=1e12, check=check_divergence_factor),
    Setting("divergence-validations", int, 3,
            "how many validations in a row beyond divergence-factor end the run as diverged",
            minimum=1, maximum=MAX_COUNT),
    Setting("seed", int, -1,
            "server-side randomness (sampling, initial hypotheses, client batch order); "
            "-1 = OS entropy; never the privacy noise", minimum=-1),
    Setting("sample-by", str, "node",
            "what keys each round's draw of devices, with the seed and the round: \"node\" "
            "(the node id the SuperLink assigns) or \"name\" (the client-name each device "
            "announces when asked: runs at one seed ask the same devices; for federations "
            "whose names the server trusts)", choices=SAMPLE_BY),
    # Flower 1.39 binds an authenticated SuperNode's key to one node id (strategies.identity).
    Setting("node-identity", str, "name",
            "what a device is across restarts: \"name\" (its client-name; a restarted device, "
            "under a new node id, takes its name over) or \"key\" (the SuperLink runs with "
            "--enable-supernode-auth: a node id is its SuperNode key, a name stays with the "
            "key that first spoke it and another node that announces it is not asked)",
            choices=NODE_IDENTITY),
    Setting("out-dir", str, "", "where the ServerApp writes summary.json (\"\" = runs/<time>)"),
    Setting("log-to", str, "",
            "where the ServerApp also writes each round's metrics: tensorboard:DIR and/or "
            "mlflow:URI, comma-separated (needs gpfl[tracking])", check=check_log_to),
    # The deadline of a round: Flower's ServerConfig(round_timeout) becomes the TTL of every
    # instruction, and the SuperLink answers an instruction still unanswered at its TTL with an
    # error, so the round ends then with the replies that arrived. 60 s is ~8x a real-process
    # round (7.6 s with 20 SuperNodes on 2 cores, docs/BENCHMARKS.md) and ~25x a simulated
    # round of 100 clients: honest devices are not cut off, and a stuck one costs one minute.
    Setting("round-timeout", float, 60.0,
            "seconds a round waits for replies (and, before it starts, for min-replies devices "
            "to connect); a device that has not answered by then is recorded as missing",
            minimum=0.0, open_minimum=True),
    Setting("min-replies", int, 1,
            "usable replies a round needs to change the hypotheses (fewer: they are kept); a "
            "round starts only once this many connected devices answered their last round (or were "
            "never asked yet; or all missed one round, the same: a round lost on the server's "
            "side; or missed only their last round and answer a query, which charges nothing)",
            minimum=1),
    Setting("resume-from", str, "",
            "a run directory whose checkpoint the ServerApp continues from (\"\" = a fresh "
            "run); out-dir defaults to it"),
    Setting("server-device", str, "auto",
            "where the ServerApp validates (torch tasks): auto, cpu, cuda or cuda:N",
            check=check_device),
    # -- local training --------------------------------------------------------------------------
    Setting("local-epochs", int, 1, "E, local epochs per round", group="training", minimum=1,
            maximum=MAX_EPOCHS),
    Setting("learning-rate", float, 0.1, "s, the local SGD step", group="training",
            minimum=0.0, open_minimum=True, maximum=MAX_LEARNING_RATE),
    Setting("batch-size", int, 10, "B, the local batch size", group="training", minimum=1,
            maximum=MAX_COUNT),
    # -- privacy: what the run asks for -----------------------------------------------------------
    Setting("mechanism", str, "laplace",
            "requested mechanism; a device declines one its `mechanisms` do not allow",
            group="privacy", choices=MECHANISMS),
    Setting("calibration", str, "neighbourhood",
            "laplace: neighbourhood (noise ∝ ‖δ‖, the paper's) or fixed (given d-epsilon)",
            group="privacy", choices=("neighbourhood", "fixed")),
    Setting("noise-multiplier", float, 5.0,
            "nu of the neighbourhood calibration (E‖noise‖ = nu·‖δ‖); the device's is a minimum",
            owner="both", stricter="max", device_default=1.0, group="privacy",
            minimum=0.0, open_minimum=True, maximum=MAX_PRIVACY_PARAMETER),
    Setting("d-epsilon", float, 1.0,
            "laplace fixed: epsilon per unit of distance of one release; the device's is a "
            "maximum", owner="both", stricter="min", device_default=10.0, group="privacy",
            minimum=0.0, open_minimum=True, maximum=MAX_PRIVACY_PARAMETER),
    Setting("public-radius", float, 1.0,
            "laplace fixed: the radius r a release is charged at (cost d-epsilon·r); the "
            "device's is a minimum", owner="both", stricter="max", device_default=1.0,
            group="privacy", minimum=0.0, open_minimum=True, maximum=MAX_PRIVACY_PARAMETER),
    Setting("per-layer", bool, False,
            "laplace: sanitize each layer with its own noise (costs add)", group="privacy"),
    Setting("epsilon", float, 1.0,
            "gaussian/sign: the (epsilon, delta) target the planned releases compose to; the "
            "device's is a maximum", owner="both", stricter="min", device_default=10.0,
            group="privacy", minimum=0.0, open_minimum=True, maximum=MAX_PRIVACY_PARAMETER),
    Setting("client-epsilons", str, "",
            "gaussian/sign, simulation: partition p asks for epsilon number p mod len "
            "(e.g. \"1,5,10\")", group="privacy", check=check_positive_list),
    Setting("delta", float, 1e-5,
            "gaussian/sign: the target delta; the device's is a maximum and the delta its "
            "ledger reports at", owner="both", stricter="min", device_default=1e-5,
            group="privacy", minimum=0.0, maximum=1.0, open_minimum=True, open_maximum=True),
    Setting("clip", float, 1.0, "gaussian/sign: the clipping bound C of the update",
            group="privacy", minimum=0.0, open_minimum=True, maximum=MAX_PRIVACY_PARAMETER),
    Setting("clip-mode", str, "l2", "gaussian/sign: clip the L2 norm, or each coordinate",
            group="privacy", choices=CLIP_MODES),
    Setting("planned-releases", int, 0,
            "gaussian/sign: releases the epsilon target is spread over (0 = num-rounds)",
            group="privacy", minimum=0, maximum=MAX_COUNT),
    _cap("cap-d-privacy", "a client's total d-privacy spend Σ epsilon·r (laplace)", 50.0),
    _cap("cap-epsilon", "a client's charged epsilon at its delta (gaussian, sign): the smaller of "
         "its RDP- and PLD-composed ones", 10.0),
    # -- record-level privacy (mechanism dpsgd): DP-SGD on the device ------------------------------
    # Every number here is public and known before training: the charge (q, ν, T, relation) is
    # computed from them alone. batch-size is the public expected batch m that normalizes a
    # step's sum, learning-rate the first step ρ_0; local-epochs does not enter.
    Setting("record-clipping", str, "oso",
            "dpsgd: the clipping strategy: fixed C, Andrew et al.'s quantile-adaptive C, or "
            "OSO-DPSGD (online C and step)", group="record", choices=RECORD_CLIPPING),
    Setting("record-sampling-rate", float, 0.05,
            "dpsgd: q, each record is in a step's batch with this probability (Poisson)",
            group="record", minimum=0.0, open_minimum=True, maximum=1.0),
    Setting("record-steps", int, 50, "dpsgd: T, DP-SGD steps of one release", group="record",
            minimum=1, maximum=MAX_RECORD_STEPS),
    Setting("record-noise-multiplier", float, 1.0,
            "dpsgd: ν, each step's noise over the sensitivity of its clipped sums (the report-"
            "noisy-min's too); the device's is a minimum", owner="both", stricter="max",
            device_default=0.8, group="record", minimum=0.0, open_minimum=True,
            maximum=MAX_PRIVACY_PARAMETER),
    Setting("record-clip", float, 1.0, "dpsgd: C_0, the first per-record clipping bound",
            group="record", minimum=0.0, open_minimum=True, maximum=MAX_PRIVACY_PARAMETER),
    Setting("record-target-quantile", float, 0.5,
            "dpsgd quantile: γ, the share of records whose gradient C should not clip",
            group="record", minimum=0.0, maximum=1.0, open_minimum=True, open_maximum=True),
    Setting("record-clip-rate", float, 2.5e-3,
            "dpsgd: ρ_c of OSO's C update (η_C of the quantile update; Andrew et al. use 0.2)",
            group="record", minimum=0.0, open_minimum=True, maximum=10.0),
    Setting("record-lr-rate", float, 2.5e-3, "dpsgd oso: ρ_r of the step's update",
            group="record", minimum=0.0, open_minimum=True, maximum=10.0),
    Setting("record-query-ratio", float, 7.124,
            "dpsgd quantile/oso: the extra query's noise over ν (7.124: ν_g = 1.01·ν)",
            group="record", minimum=1.0, open_minimum=True, maximum=MAX_PRIVACY_PARAMETER),
    Setting("record-loss-clip", float, 5.0,
            "dpsgd, k >= 2: each record's loss is clipped to [0, this] before the report-"
            "noisy-min chooses the hypothesis", group="record", minimum=0.0, open_minimum=True,
            maximum=MAX_PRIVACY_PARAMETER),
    _cap("cap-record-epsilon", "a device's RDP-composed record-level epsilon at its delta "
         "(dpsgd)", 10.0, group="record"),
    Setting("neighbouring", str, "replace-one",
            "dpsgd: the neighbouring relation of the device's record-level guarantee "
            "(replace-one doubles the sensitivity of every clipped sum)", owner="device",
            group="device", choices=RECORD_RELATIONS),
    # -- aggregation -----------------------------------------------------------------------------
    Setting("aggregation", str, "mean", "how a cluster's releases are weighted",
            group="aggregation", choices=AGGREGATIONS),
    # What the server sees (docs/TRUST.md, "Secure clusters"): each device's noisy model, or,
    # through Flower's SecAgg+, only each cluster's sum, the device having picked its cluster.
    Setting("aggregation-privacy", str, "per-device",
            "per-device: the server sees each device's sanitized model and clusters them "
            "(k-means); secure-clusters: each device picks its cluster and adds its share of "
            "discrete Gaussian noise, and the server learns only each cluster's sum and count "
            "through SecAgg+ (needs mechanism gaussian)",
            group="aggregation", choices=AGGREGATION_PRIVACY),
    Setting("min-cohort", int, 4,
            "secure-clusters: the fewest devices whose shares a secure sum may hold (the "
            "server's SecAgg+ threshold); the central guarantee a device records assumes this "
            "many honest ones, and it declines a round with fewer; the device's is a minimum",
            owner="both", stricter="max", device_default=3, group="aggregation", minimum=2,
            maximum=MAX_COHORT),
    Setting("server-learning-rate", float, 0.01, "sign: step of the majority-vote update",
            group="aggregation", minimum=0.0, open_minimum=True),
    # -- robust aggregation ----------------------------------------------------------------------
    # What a cluster becomes when some of its members may lie (strategies.robust). The app's
    # default is the papers' plain mean (their Algorithm 1, like every other app default);
    # `gpfl launch` asks for clipped-mean with the persistence test (deploy/quickstart.py),
    # which held against adaptive rogues where the mean lost every run (docs/RESULTS.md,
    # "rogue-devices"), and which costs accuracy at a few devices a round with re-seeding
    # ("digits-server-update").
    Setting("cluster-aggregator", str, "mean",
            "what each cluster becomes: the (budget-weighted) mean of its releases, that mean "
            "with each release clipped to its cluster's median distance (at most 3 times the "
            "round's), or a coordinate-wise median, trimmed mean or multi-Krum",
            group="aggregation",
            choices=CLUSTER_AGGREGATORS),
    # Across rounds (strategies.persistence): post-processing of the releases the server holds.
    Setting("persistence-threshold", float, 0.0,
            "set a device aside (its releases left out, not asked again) once its releases' "
            "summed residuals pass this many times the square root of their count, and until "
            "then weigh each release by 1 - (that ratio / this)^2 in its cluster (0 = off)",
            group="aggregation", minimum=0.0, maximum=1e3),
    # Post-processing of the releases by the server (strategies.server_update): nothing is sent
    # to a device and nothing is charged, so no choice here can weaken a device's privacy.
    Setting("server-update", str, "mean",
            "how a hypothesis moves to its cluster's mean: mean (replaced, the papers'), step "
            "(by server-step), anneal (a full step until validation stalls, then a decreasing "
            "one), plateau (a full step; each time validation stalls, the best-validated "
            "hypotheses are restored and the step shrinks by plateau-factor)",
            group="aggregation", choices=SERVER_UPDATES),
    Setting("server-step", float, 0.5, "step: the fraction of the way to the cluster mean",
            group="aggregation", minimum=0.0, maximum=1.0, open_minimum=True),
    Setting("anneal-after", int, 3,
            "anneal, plateau: validations without a new best loss before the step decreases",
            group="aggregation", minimum=1),
    Setting("anneal-rounds", float, 20.0,
            "anneal: rounds after which the decreasing step has halved", group="aggregation",
            minimum=0.0, open_minimum=True),
    Setting("plateau-factor", float, 0.7,
            "plateau: the factor the step is multiplied by at each stall", group="aggregation",
            minimum=0.0, maximum=1.0, open_minimum=True),
    Setting("reseed-after", int, 0,
            "re-seed a hypothesis that drew no release (under a robust cluster-aggregator: too "
            "few to move it) for this many rounds by splitting the largest cluster (0 = never)",
            group="aggregation", minimum=0),
    # -- tasks -----------------------------------------------------------------------------------
    Setting("data-seed", int, 0, "generates or splits the task's data (public)", group="tasks",
            minimum=0),
    Setting("optima", str, "5,6;4,-4.5",
            "synthetic, fairness: one optimum per group, `;`-separated vectors", group="tasks",
            check=check_optima),
    # A model of a chosen size with trivial training (benchmarks at 10^6-10^7 parameters): a
    # 10^7-number optima string would not fit a command line or a run config.
    Setting("optima-repeat", int, 1,
            "synthetic: each optimum's vector repeated this many times (a model of its length "
            "times this many parameters)", group="tasks", minimum=1, maximum=MAX_COUNT),
    Setting("users", int, 0, "training users (0 = one per SuperNode)", group="tasks", minimum=0,
            maximum=MAX_COUNT),
    Setting("samples-per-user", int, 10, "synthetic, fairness: samples of each user",
            group="tasks", minimum=1, maximum=MAX_COUNT),
    Setting("validation-users", int, 20,
            "held-out users the server validates on (>= 1; hospital: at most this many held-out "
            "providers, 0 = all of them)", group="tasks", minimum=0, maximum=MAX_COUNT),
    Setting("rotate-probability", float, 0.5,
            "digits, femnist: probability that a user's images are rotated", group="tasks",
            minimum=0.0, maximum=1.0),
    Setting("model", str, "cnn", "digits: the Table 3 CNN or 002's logistic regression",
            group="tasks", choices=("cnn", "logistic")),
    Setting("partition", str, "contiguous", "digits: equal slices or a Dirichlet label skew",
            group="tasks", choices=("contiguous", "dirichlet")),
    Setting("dirichlet-alpha", float, 0.5,
            "digits, tabular: concentration of the dirichlet partition",
            group="tasks", minimum=1e-6),
    Setting("loss", str, "cross-entropy", "digits: the training loss", group="tasks",
            choices=("cross-entropy", "rmse")),
    Setting("labels", str, "digit", "digits: 10 digit classes, or parity flipped for rotated "
            "users (thesis Fig. 2.8)", group="tasks", choices=("digit", "parity")),
    Setting("minority-fraction", float, 0.2, "fairness: share of minority samples",
            group="tasks", minimum=0.0, maximum=1.0),
    Setting("server-data-path", str, "",
            "femnist, hospital, tabular: the data the ServerApp validates on (a file or folder)",
            group="tasks"),
    # -- task plugins and the tabular task (docs/TASKS.md) -----------------------------------------
    Setting("task-settings", str, "",
            "the task plugin's own settings, as \"key=value key=value\" pairs, each checked "
            "against the plugin's declarations (its Task.settings: type, bounds, default); "
            "`gpfl tasks` lists them", group="tasks"),
    _task_list("label-column", "label", "tabular: the column holding the label"),
    _task_list("feature-columns", "",
               "tabular: the numeric feature columns, comma-separated (at least one)"),
    _task_list("classes", "0,1", "tabular: the label values, comma-separated, in class order "
               "(public: they size the model's output)"),
    Setting("tabular-model", str, "logistic",
            "tabular: multinomial logistic regression, or an MLP with one hidden layer",
            group="tasks", choices=("logistic", "mlp")),
    Setting("hidden-units", int, 16, "tabular mlp: units of the hidden layer", group="tasks",
            minimum=1, maximum=MAX_HIDDEN_UNITS),
    Setting("standardize", str, "device",
            "tabular: scale features with each side's own mean and std (device), the run's "
            "public feature-means/feature-scales (public), or not at all (none)",
            group="tasks", choices=("device", "public", "none")),
    _task_list("categorical-columns", "",
               "tabular: columns of categories and each one's public vocabulary, one-hot "
               "encoded after the numeric features: color=red|green|blue, size=S|M|L (a value "
               "outside its vocabulary is an error naming the row)", check=check_categories),
    Setting("impute", str, "none",
            "tabular: a missing cell is an error (none), or filled: a numeric one with 0 (zero), "
            "with this side's own column mean (mean, like standardize=device) or with the run's "
            "public feature-means (public); a categorical one with no category (all zeros)",
            group="tasks", choices=("none", "zero", "mean", "public")),
    _task_list("feature-means", "",
               "tabular, standardize=public: one mean per feature column, comma-separated",
               check=check_number_list),
    _task_list("feature-scales", "",
               "tabular, standardize=public: one positive scale per feature column",
               check=check_positive_list),
    Setting("tabular-split", str, "none",
            "tabular: the data-path file is the device's own (none), or one file split among "
            "num-partitions devices by Flower Datasets (iid, dirichlet over the label, "
            "natural-id on split-column): the Simulation Engine's virtual devices",
            group="tasks", choices=("none", "iid", "dirichlet", "natural-id")),
    _task_list("split-column", "", "tabular-split=natural-id: the column naming each device"),
    _task_list("validation-column", "", "tabular: rows of server-data-path with one value of "
               "this column are one held-out user (\"\" = the whole file is one)"),
    Setting("allowed-tasks", str, "*",
            "the task names this device serves, comma-separated (* = every task installed on "
            "it); a run naming another is declined", owner="device", group="device",
            check=check_allowed_tasks),
    # -- the device (node config, or the policy file it names) ------------------------------------
    Setting("partition-id", int, 0, "which partition of the task's data this device holds",
            owner="device", group="device", minimum=0),
    Setting("num-partitions", int, 1, "how many partitions the task's data is split into",
            owner="device", group="device", minimum=1),
    Setting("client-name", str, "",
            "the device's name in replies and its ledger's file name (\"\" = "
            "client-<partition-id>)", owner="device", group="device", check=check_name),
    Setting("policy-file", str, "",
            "a TOML file of device settings (node-config keys override it); also "
            "$GPFL_POLICY", owner="device", group="device"),
    Setting("mechanisms", str, "laplace,gaussian,sign",
            "the mechanisms this device releases with; any other request is declined",
            owner="device", group="device", choices=MECHANISMS, is_list=True),
    Setting("ledger-dir", str, "~/.gpfl/ledgers",
            "where the device keeps its privacy ledger (<client-name>.json)", owner="device",
            group="device", check=check_ledger_folder),
    Setting("ledger-path", str, "", "an explicit ledger file (overrides ledger-dir)",
            owner="device", group="device", check=check_ledger_file),
    Setting("allow-seeded-noise", bool, False,
            "let noise-seed make the privacy noise reproducible (experiments only)",
            owner="device", group="device"),
    Setting("noise-seed", int, -1,
            "the device's own noise seed, used only with allow-seeded-noise (-1 = none)",
            owner="device", group="device", minimum=-1),
    Setting("device", str, "auto",
            "where this device trains (torch tasks): auto, cpu, cuda or cuda:N", owner="device",
            group="device", check=check_device),
    Setting("data-path", str, "",
            "femnist, hospital, tabular: this device's data (a file or folder)",
            owner="device", group="device"),
    # Refuses absurd instructions before anything is computed or charged. gpfl's tasks work in
    # units (hospital payments in thousands of dollars, the synthetic optima single digits,
    # network weights O(1)), so 1e6 is far beyond any model they learn, and far below where
    # float32 training overflows (squares of 1e19): a hypothesis of 1e30 would otherwise be
    # trained, charged and then fail or release garbage.
    # The device runner (`gpfl supernode`) serves only runs of the gpfl app installed on the
    # device (its app id and version); this narrows that to FAB releases the owner has reviewed.
    # The FAB is never executed on the device either way (docs/TRUST.md).
    Setting("trusted-fab-hashes", str, "",
            "gpfl supernode: the FAB hashes (sha256, comma-separated) of runs this device "
            "serves, on top of the installed app id and version (\"\" = any FAB of them)",
            owner="device", group="device", check=check_fab_hashes),
    Setting("max-parameter", float, 1e6,
            "the largest |value| in a hypothesis this device accepts; a larger one is refused "
            "before anything is computed or charged", owner="device", group="device",
            minimum=0.0, open_minimum=True, maximum=1e12),
    # The neighbourhood calibration scales the noise with ‖δ‖, and the server chooses much of
    # ‖δ‖ (learning rate, epochs, hypotheses): with a vanishing step δ = 0 and the release would
    # be the hypothesis the device picked. The floor keeps the noise at ν·least-radius at least,
    # so a release always protects a ball of this radius around the device's model. 0.01 is
    # below ~90 % of the honest updates of the synthetic task even at its optima (one epoch:
    # 10th percentile 0.017, median 0.077; five epochs: median 0.32), so the paper's protocol
    # keeps its noise; an owner who wants more protection sets more (docs/TRUST.md).
    Setting("least-radius", float, 0.01,
            "laplace neighbourhood: the least radius a release protects; the noise is "
            "ν·max(‖δ‖, least-radius), never less", owner="device", group="device",
            minimum=0.0, open_minimum=True, maximum=MAX_PRIVACY_PARAMETER),
    # The choice among k hypotheses is made with private data; under Laplace it is protected
    # only at the scale of the hypotheses' distances, and a fine grid of k hypotheses reads the
    # argmin of the device's loss over it. gpfl's tasks use k <= 5.
    Setting("max-hypotheses", int, 8,
            "the most hypotheses (k) this device accepts in one instruction; a run asking for "
            "more is declined before anything is computed", owner="device", group="device",
            minimum=1, maximum=MAX_HYPOTHESES),
    # An instruction is k hypotheses of the task's size; every check of its values is a pass
    # over all of them, in memory the server chose to fill. 5·10^7 values is 8 hypotheses of a
    # 6-million-parameter model (200 MB in float32); the digits CNN needs 83,562 a hypothesis.
    Setting("max-instruction-values", int, 50_000_000,
            "the most values (k hypotheses × parameters) this device accepts in one "
            "instruction; a larger one is refused from its shapes alone, before any value is "
            "read, computed or charged", owner="device", group="device",
            minimum=1, maximum=10**12),
)

#: Every setting by name.
SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARATIONS}
if len(SETTINGS) != len(_DECLARATIONS):  # pragma: no cover - a declaration error
    raise RuntimeError("a setting is declared twice")
