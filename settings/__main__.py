"""``python -m settings --pyproject | --markdown``: print a generated view of the declarations."""

from __future__ import annotations

import argparse

from settings.render import markdown, pyproject_block


def main() -> None:
    """Print the pyproject table or the markdown table."""
    parser = argparse.ArgumentParser(prog="python -m settings", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--pyproject", action="store_true", help="[tool.flwr.app.config]")
    group.add_argument("--markdown", action="store_true", help="docs/SETTINGS.md")
    args = parser.parse_args()
    print(pyproject_block() if args.pyproject else markdown(), end="")


if __name__ == "__main__":
    main()
