"""Pure parts of the shared-queue service (no sockets)."""

import functools

import pytest

from tfdist.data.queue_service import _bind_epoch, _load_producers, build_parser
from tfdist.errors import ConfigError


def test_server_producers_get_the_epoch_only_when_they_require_it():
    def read(path, chunk=64):
        return (path, chunk)

    assert _bind_epoch(functools.partial(read, "f"), 3, 5)() == ("f", 64)
    assert _bind_epoch(lambda epoch: epoch, 3, 5)() == 3
    with pytest.raises(ConfigError, match="one epoch"):
        _bind_epoch(iter([1]), 0, 2)


def test_cli_producer_spec_is_checked_and_defaults_are_sane():
    with pytest.raises(ConfigError, match="MODULE:ATTRIBUTE"):
        _load_producers("no_colon")
    assert _load_producers("functools:partial") == [functools.partial]
    args = build_parser().parse_args(["--port", "7070"])
    assert (args.port, args.host, args.num_epochs, args.queue) == (7070, "[::]", 1, "fifo")
