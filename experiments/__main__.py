"""``python -m experiments NAME``: see `experiments.cli`."""

from experiments.cli import main

raise SystemExit(main())
