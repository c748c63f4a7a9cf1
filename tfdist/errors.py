"""One picklable exception family for tfdist.

Every error says what is wrong, what was received, and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "TfdistError",
    "ConfigError",
    "ClusterError",
    "PSError",
    "PSUnavailableError",
    "PSRejectedError",
    "PSWaitTimeoutError",
    "JobMismatchError",
    "AuthError",
    "WireFormatError",
    "PlacementError",
    "LaunchError",
    "TaskConfigError",
]


class TfdistError(Exception):
    """Base class of every error tfdist raises on purpose."""


class ConfigError(TfdistError, ValueError):
    """A configuration value is malformed or inconsistent.

    The message names the field (dotted path, e.g. ``cluster.ps``), the value
    received, and what to write instead.
    """


class ClusterError(TfdistError):
    """The cluster cannot be formed (missing role, wrong task index, ...)."""


class PSError(TfdistError):
    """Base class of parameter-server errors seen by a worker."""


class PSUnavailableError(PSError):
    """A parameter server did not answer within its deadline.

    The message names the address and the timeout setting that expired.
    """


class PSRestartedError(PSUnavailableError):
    """A parameter-server task restarted (a new incarnation) since this worker last talked to it.

    Workers recover from it by themselves (``ps.reconnect_timeout_s``); it
    reaches user code only when recovery is not possible.
    """

    def __init__(self, message: str, ps: int | None = None):
        super().__init__(message)
        self.ps = ps


class PSRejectedError(PSError):
    """A parameter server refused a request (bad variable, dtype, shape, ...).

    The server's values are unchanged when this is raised.
    """


class JobMismatchError(PSRejectedError, ConfigError):
    """A worker cannot join its job: its model, tables, consistency settings or worker count differ.

    The parameter servers refused its ``Init``/``WaitInit``. Starting it again
    cannot help (a :class:`ConfigError`: the task exits with the config-error
    code and the launcher stops the job instead of training on without it).
    """


class TLSConfigError(PSError, ConfigError):
    """TLS between a client and a server fails for a reason that waiting cannot fix.

    No CA on a client of a TLS server, a CA that did not sign the server's
    certificate, a certificate for other names, an expired one, a server
    without TLS for a client with a CA. The message says TLS and names the
    file or setting to fix (:mod:`tfdist.tls`). A :class:`ConfigError`: the
    task exits with the config-error code and is not restarted.
    """


class PSWaitTimeoutError(PSError):
    """A wait on a parameter server ran out of time; the server itself is fine.

    The consistency policy made the call wait (a barrier for other workers'
    gradients, an SSP bound, the chief's initialisation) longer than the
    job's RPC timeout. The message says what it waited for and names the
    setting (``ps.rpc_timeout_s``).
    """


class AuthError(TfdistError):
    """The job's secret token was missing or wrong (any tfdist gRPC service)."""


class WireFormatError(TfdistError, ValueError):
    """A message on the wire could not be decoded."""


class PlacementError(TfdistError, ValueError):
    """Variables cannot be placed on the parameter servers as asked."""


class LaunchError(TfdistError):
    """A task of a launched cluster failed or could not be started."""


class TaskConfigError(LaunchError):
    """A launched task exited with :data:`tfdist.exit_status.EXIT_CONFIG_ERROR` (its script raised a ConfigError).

    The failure is deterministic: the launcher never restarts the task, stops
    the others and exits 2, as for a config it refuses itself.
    """
