"""A consistency mode is a policy plus one descriptor (issue 21 item 3).

The variant below (SSP whose bound defaults to 5) is added by nothing but a
policy class and a ``register_mode`` call, and the config, the launcher's
failure rule and a real PS store take it as they take the built-in modes.
Nothing in the library branches on a mode's name.
"""

import ast
import pathlib

import numpy as np
import pytest

from tfdist.cluster.failure import decide_worker_failure
from tfdist.config import JobConfig
from tfdist.consistency import MODES, ConsistencyMode, SSPPolicy, policy_from_spec, register_mode
from tfdist.errors import ConfigError
from tfdist.ps.placement import VariableSpec
from tfdist.ps.protocol import RequestError
from tfdist.ps.server import ParameterService
from tfdist.ps.store import ParameterStore

LIBRARY = pathlib.Path(__file__).resolve().parents[2] / "tfdist"


class WideSSP(SSPPolicy):
    """The variant's policy: SSP's rules under another name."""

    name = "ssp_wide"


WIDE = ConsistencyMode("ssp_wide", "update", {"staleness": 5, "refresh_every_step": False},
                       lambda p, n: WideSSP(int(p["staleness"]), bool(p["refresh_every_step"])),
                       "SSP with a bound of 5 by default")


@pytest.fixture
def wide_mode():
    register_mode(WIDE)
    yield WIDE
    MODES.pop(WIDE.name)


def _config(**strategy):
    return JobConfig.from_dict({"cluster": {"ps": 1, "worker": 2}, "strategy": strategy})


def test_a_registered_variant_is_a_mode_of_the_config_with_its_own_defaults(wide_mode):
    spec = _config(consistency="ssp_wide").strategy.policy_spec(2)
    assert spec == {"policy": "ssp_wide", "staleness": 5, "refresh_every_step": False}
    assert _config(consistency="ssp_wide", staleness=7).strategy.policy_spec(2)["staleness"] == 7
    assert type(policy_from_spec(spec)) is WideSSP and policy_from_spec(spec).path == "update"
    with pytest.raises(ConfigError, match="exchange_every"):
        _config(consistency="ssp_wide", exchange_every=2)
    decision = decide_worker_failure(_config(consistency="ssp_wide"), 1, [])
    assert not decision.stop and "ssp_wide can do without it" in decision.reason


def test_a_ps_store_runs_the_variant_by_its_descriptor(wide_mode):
    spec = _config(consistency="ssp_wide").strategy.policy_spec(2)
    store = ParameterStore(None, num_workers=2, max_wait_s=0.0)
    svc = ParameterService(store)
    svc.call("Init", {"w": np.zeros(3, np.float32)}, worker=0, specs=[VariableSpec("w", "float32", (3,)).to_dict()],
             num_workers=2, policy=spec)
    for clock in range(1, 7):
        svc.call("Push", {"w": np.ones(3, np.float32)}, worker=0, clock=clock)
    svc.call("Pull", worker=0, clock=5)  # 5 ahead of worker 1 (clock 0): within the default bound
    with pytest.raises(RequestError, match="bound 5") as e:
        svc.call("Pull", worker=0, clock=6)
    assert e.value.grpc_code == "ABORTED"


def test_unknown_modes_are_refused_naming_the_registered_ones():
    with pytest.raises(ConfigError, match="ssp_wide.*Use one of \\['async'"):
        _config(consistency="ssp_wide")


def test_nothing_outside_the_consistency_package_branches_on_a_mode_name():
    names = set(MODES)
    offenders = []
    for path in LIBRARY.rglob("*.py"):
        if "consistency" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                constants = [c for c in [node.left, *node.comparators] if isinstance(c, (ast.Constant, ast.Tuple))]
                for c in constants:
                    values = [c.value] if isinstance(c, ast.Constant) else [
                        e.value for e in c.elts if isinstance(e, ast.Constant)]
                    if names & {v for v in values if isinstance(v, str)}:
                        offenders.append(f"{path.relative_to(LIBRARY)}:{node.lineno}")
    assert not offenders, offenders
