"""Command line: ``python -m tfdist.federated --config configs/fl_fedavg_digits.yaml``."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from tfdist.federated.config import load_experiment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdist.federated", description=__doc__)
    parser.add_argument("--config", required=True, help="experiment YAML (see configs/fl_*.yaml)")
    parser.add_argument("--rounds", type=int, help="override simulation.rounds")
    parser.add_argument("--num-workers", type=int, help="override simulation.num_workers (0 = in-process)")
    parser.add_argument("--seed", type=int, help="override simulation.seed")
    parser.add_argument("--output", help="write the history JSON here (overrides output)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_experiment(args.config)
    if args.rounds is not None:
        cfg.simulation.rounds = args.rounds
    if args.num_workers is not None:
        cfg.simulation.num_workers = args.num_workers
    if args.seed is not None:
        cfg.simulation.seed = args.seed
    if args.no_progress:
        cfg.simulation.progress = False
    cfg.simulation.__post_init__()
    history = cfg.build().run()
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
