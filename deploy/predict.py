"""``gpfl predict RUN --data FILE``: a run's delivered models on a user's own data.

The file is read as the run's task reads a device's data (the tabular task: a CSV or Parquet
file with the run's columns; the other tasks: an ``.npz`` with arrays ``x`` and ``y``). Every
delivered hypothesis is scored on it; the one with the lowest loss serves it, as in validation
(`tasks.delivered`), unless ``--hypothesis`` names one. One line per hypothesis with its loss and
metric, one for the choice; ``--out FILE.csv`` writes a prediction per record.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.delivered import Delivered

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``gpfl predict``'s arguments."""
    parser.add_argument("run_dir", help="the run directory (it holds models/models.json)")
    parser.add_argument("--data", required=True, metavar="FILE",
                        help="the records to score and predict: a CSV or Parquet file with the "
                             "run's columns (tabular task), else an .npz with arrays x and y")
    parser.add_argument("--hypothesis", type=int, default=None, metavar="J",
                        help="predict with hypothesis J (default: the one with the lowest loss "
                             "on the data, as validation assigns a user)")
    parser.add_argument("--out", default=None, metavar="FILE.csv",
                        help="write one row per record: its index, the prediction and the "
                             "record's own label or target")


def run(args: argparse.Namespace) -> int:
    """Run ``gpfl predict``; return the exit code (1 with a one-line reason on bad input)."""
    # Imported here: the parser of every gpfl command is built with this module loaded.
    from tasks.config import TaskSettingsError
    from tasks.delivered import load_delivered

    try:
        delivered = load_delivered(args.run_dir)
        data = delivered.task.file_dataset(Path(args.data))
    except (FileNotFoundError, TaskSettingsError, ValueError) as err:
        print(f"gpfl predict: {err}", file=sys.stderr)
        return 1
    k = len(delivered.hypotheses)
    if args.hypothesis is not None and not 0 <= args.hypothesis < k:
        print(f"gpfl predict: --hypothesis must be in [0, {k - 1}], got {args.hypothesis}",
              file=sys.stderr)
        return 1
    fit = delivered.fit(data)
    chosen = fit.hypothesis if args.hypothesis is None else args.hypothesis
    metric = delivered.metric
    print(f"gpfl predict: {len(data)} records of {args.data}; {k} delivered hypotheses of "
          f"round {delivered.manifest.get('best_round')}")
    for j, metrics in enumerate(fit.metrics):
        shown = f"loss {metrics['loss']:.4f}" + (
            f", {metric} {metrics[metric]:.4f}" if metric != "loss" and metric in metrics
            else "")
        mark = "  <- fits best (lowest loss)" if j == fit.hypothesis else ""
        print(f"gpfl predict: hypothesis {j}: {shown}{mark}")
    why = "--hypothesis" if args.hypothesis is not None else "the lowest loss on these records"
    print(f"gpfl predict: predicting with hypothesis {chosen} ({why})")
    if args.out:
        path = _write_predictions(Path(args.out), delivered, data.x, data.y, chosen)
        print(f"gpfl predict: wrote {path}")
    return 0


def _write_predictions(path: Path, delivered: Delivered, x: object, y: object,
                       hypothesis: int) -> Path:
    import numpy as np

    features, truth = np.asarray(x), np.asarray(y)
    if delivered.task.is_classifier:
        predicted: list[object] = delivered.predict_labels(features, hypothesis)
        names = delivered.task.class_names()
        actual: list[object] = [names[int(v)] if names is not None else int(v) for v in truth]
    else:
        predicted = [float(v) for v in np.ravel(delivered.predict(features, hypothesis))]
        actual = [float(v) for v in np.ravel(truth)]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["record", "prediction", "label"])
        writer.writerows([i, p, a] for i, (p, a) in enumerate(zip(predicted, actual, strict=True)))
    return path
