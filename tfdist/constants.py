"""Names of environment variables and defaults, in one place.

An explicit argument always wins over the environment.
"""

ENV_TF_CONFIG = "TF_CONFIG"
#: JSON of the resolved :class:`tfdist.config.JobConfig` (set by the launcher).
ENV_CONFIG = "TFDIST_CONFIG"
#: The job's secret token (set by the launcher; never logged).
ENV_TOKEN = "TFDIST_TOKEN"
#: Log level for tfdist loggers in launched tasks.
ENV_LOG_LEVEL = "TFDIST_LOG_LEVEL"

#: JSON list of collective-group addresses in worker-id order (overrides TF_CONFIG's).
ENV_COLLECTIVE_ADDRESSES = "TFDIST_COLLECTIVE_ADDRESSES"
#: JSON ``{"worker:2": {"factor": 3}}``: tasks slowed down on purpose (experiments).
ENV_SLOWDOWN = "TFDIST_SLOWDOWN"

#: gRPC metadata key carrying the job token.
AUTH_METADATA_KEY = "tfdist-token"

DEFAULT_RPC_TIMEOUT_S = 30.0
DEFAULT_STARTUP_TIMEOUT_S = 120.0
#: How long a worker tries to reach a lost PS task again (``ps.reconnect_timeout_s``).
DEFAULT_RECONNECT_TIMEOUT_S = 60.0
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
DEFAULT_HEARTBEAT_INTERVAL_S = 2.0
#: A silent worker stops counting as live after this long. Well below the RPC deadline: a barrier
#: (BSP step, SSP bound) that waits for a dead worker must end before the survivors' calls time out.
DEFAULT_HEARTBEAT_TIMEOUT_S = 10.0

#: Training batches a joining worker runs locally before it joins an elastic job (set by the engine).
ENV_WARMUP_BATCHES = "TFDIST_WARMUP_BATCHES"

#: Path of a Unix socket on which another process lends its zygote (``tfdist.cluster.zygote.serve_forks``): with
#: fast start on, a local job forks its tasks from a zygote forked there instead of importing TensorFlow again.
ENV_ZYGOTE_SOCKET = "TFDIST_ZYGOTE_SOCKET"

#: Seconds a task process may take to shut down after its script ended before it exits 1 (0: no bound).
ENV_EXIT_TIMEOUT_S = "TFDIST_EXIT_TIMEOUT_S"

#: Seconds a task's Keras fit/evaluate/predict may go without progress before the task reports its stacks and
#: exits 1 (default 600; 0: never). See tfdist/strategies/_stuck.py.
ENV_STUCK_TIMEOUT_S = "TFDIST_STUCK_TIMEOUT_S"
