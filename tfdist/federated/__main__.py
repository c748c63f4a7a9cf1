"""Command line: ``python -m tfdist.federated --config configs/fl_fedavg_digits.yaml``.

Exit codes: 0 when the experiment ran; 2 for a bad config or command line
(the message names the field, before any data is loaded); 1 for other errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from tfdist.errors import ConfigError
from tfdist.federated.config import load_experiment

PROG = "python -m tfdist.federated"


def _configure(args):
    """The experiment of ``--config`` with the command line's overrides, validated."""
    cfg = load_experiment(args.config)
    overrides = {"rounds": args.rounds, "num_workers": args.num_workers, "seed": args.seed}
    flags = []
    for name, value in overrides.items():
        if value is not None:
            setattr(cfg.simulation, name, value)
            flags.append(f"--{name.replace('_', '-')} {value}")
    if args.no_progress:
        cfg.simulation.progress = False
    try:
        cfg.simulation.__post_init__()
    except ConfigError as e:
        raise ConfigError(f"{e} (set on the command line: {' '.join(flags)})") from None
    return cfg


def _check_output(path: str, setting: str) -> None:
    """Makes sure the history JSON can be written at ``path`` before the experiment runs (its folder is created).

    Raises:
        ConfigError: naming ``setting`` (``--output`` or ``output``): the path is a folder, or its folder
            cannot be created (a file is in the way, no permission).
    """
    if os.path.isdir(path):
        raise ConfigError(f"Invalid {setting}: {path!r} is a folder. Give a file path for the history JSON, "
                          f"e.g. {os.path.join(path, 'history.json')!r}.")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"Invalid {setting}: cannot create the folder {folder!r} for the history JSON "
                          f"({e.strerror or e}). Give a path whose folder exists or can be created.") from None
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"Invalid {setting}: the folder {folder!r} is not writable by this user. Give a path "
                          "in a folder you can write.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="experiment YAML (see configs/fl_*.yaml)")
    parser.add_argument("--rounds", type=int, help="override simulation.rounds")
    parser.add_argument("--num-workers", type=int, help="override simulation.num_workers (0 = in-process)")
    parser.add_argument("--seed", type=int, help="override simulation.seed")
    parser.add_argument("--output", help="write the history JSON here (overrides output)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        type=str.upper)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = _configure(args)
        output = args.output or cfg.output
        if output:  # checked before hours of simulation, not after
            _check_output(output, "--output" if args.output else "output (in the config)")
        history = cfg.build().run()
    except ConfigError as e:  # also a mistake found only once the data is loaded
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if output:
        history.save_json(output)
    summary = history.summary()
    summary["accuracy"] = history.accuracy
    json.dump(summary, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
