"""Command line: ``python -m tfdist.federated --config configs/fl_fedavg_digits.yaml``.

Exit codes: 0 when the experiment ran; 2 for a bad config or command line
(the message names the field, before any data is loaded); 1 for other errors.
"""

from __future__ import annotations

import argparse
import json
import logging
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
        history = cfg.build().run()
    except ConfigError as e:  # also a mistake found only once the data is loaded
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    output = args.output or cfg.output
    if output:
        history.save_json(output)
    summary = history.summary()
    summary["accuracy"] = history.accuracy
    json.dump(summary, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
