"""Property-based tests of the parameter-server protocol (hypothesis).

For any request to any RPC — well-formed or not, from any worker id, with
any tensors — either the request is applied, or it is refused with the
protocol's error and the store's whole state (values, versions, clocks,
policy state, membership, the done set, initialised flag, counters) is
exactly as before; and afterwards the store still answers valid requests.
The wire decoder raises only ``WireFormatError`` for any input.
"""

import json
import os
import struct
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tfdist import wire
from tfdist.consistency import AsyncPolicy, BSPPolicy, SSPPolicy
from tfdist.errors import WireFormatError
from tfdist.ps.dynamic import shard_of_ids
from tfdist.ps.placement import VariableSpec
from tfdist.ps.protocol import METHODS, RequestError
from tfdist.ps.server import ParameterService
from tfdist.ps.store import ParameterStore

SPECS = [VariableSpec("a", "float32", (2, 2)), VariableSpec("b", "float32", (3,)),
         VariableSpec("n", "float32", (2,), trainable=False)]
SPEC_DICTS = [s.to_dict() for s in SPECS]
NUM_WORKERS = 3
#: A PS-resident table: shard 0 of 2 of a 10-row table, rows 2 wide (so 5 rows here), Adagrad; and a dynamic
#: one (any int64 id of shard 0 of 2, rows created at first sight), 2 wide, 4 rows at most, admitted at the 2nd push.
TABLES = [{"key": "t", "rows": 10, "dim": 2, "shard": 0, "num_shards": 2,
           "optimizer": {"kind": "adagrad", "learning_rate": 0.1}},
          {"key": "d", "rows": 0, "dim": 2, "shard": 0, "num_shards": 2, "optimizer": {"kind": "adam"},
           "dynamic": {"capacity": 4, "min_count": 2, "filter_width": 16}}]

#: Deterministic in the suite (CI never fails on a newly drawn example); explore more with
#: TFDIST_HYPOTHESIS_EXAMPLES=5000 TFDIST_HYPOTHESIS_RANDOM=1 (a local search for new counter-examples).
_EXAMPLES = int(os.environ.get("TFDIST_HYPOTHESIS_EXAMPLES", "300"))
SETTINGS = settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=os.environ.get("TFDIST_HYPOTHESIS_RANDOM") != "1")


class FrozenClock:
    """Time stands still: liveness cannot change between two snapshots of the state."""

    def __call__(self):
        return 1000.0


#: Ids of shard 0 of 2 of the dynamic table (some huge, some negative).
_CANDIDATES = np.array([0, 1, 2, 3, 5, -1, -7, 2**62 + 1, -2**63, 2**63 - 1], np.int64)
DYNAMIC_IDS = _CANDIDATES[shard_of_ids(_CANDIDATES, 2) == 0][:3]


def initial_values():
    return {"a": np.ones((2, 2), np.float32), "b": np.zeros(3, np.float32), "n": np.full(2, 2.0, np.float32)}


def make_store(kind: str, initialised: bool = True) -> ParameterStore:
    policy = {"async": AsyncPolicy(), "ssp": SSPPolicy(0), "bsp": BSPPolicy(1)}[kind]
    store = ParameterStore(policy, heartbeat_timeout_s=10, startup_grace_s=5, time_fn=FrozenClock(),
                           num_workers=NUM_WORKERS, max_wait_s=0.0)
    if initialised:
        svc = ParameterService(store)
        svc.call("Init", initial_values(), worker=0, specs=SPEC_DICTS, num_workers=1, tables=TABLES)
        # some history: worker 1 is live, worker 2 said it is done
        svc.call("Heartbeat", worker=1)
        svc.call("Done", worker=2)
        if kind == "bsp":
            svc.call("PushGradients", {"b": np.ones(3, np.float32)}, worker=0, step=0)
        else:
            svc.call("Push", {"b": np.ones(3, np.float32)}, worker=1, clock=1)
            for _ in range(2):  # rows in the dynamic table (admitted at the second push), its filter counting
                svc.call("PushRows", {"rows": DYNAMIC_IDS, "grads": np.ones((len(DYNAMIC_IDS), 2), np.float32)},
                         worker=1, key="d")
    return store


def comparable(state):
    """The store's state with arrays as (dtype, shape, bytes): NaN == NaN, exact bit equality."""
    def conv(x):
        if isinstance(x, np.ndarray):
            return (x.dtype.name, x.shape, x.tobytes())
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        return x

    return conv(state)


# ------------------------------------------------------------------ strategies
garbage = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4), st.lists(st.one_of(st.integers(-3, 8), st.text(max_size=2)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-2, 2), max_size=2),
)
worker_id = st.one_of(st.integers(-2, NUM_WORKERS + 1), st.just(1000), garbage)
count = st.one_of(st.integers(-1, 5), garbage)
key_list = st.one_of(st.lists(st.sampled_from(["a", "b", "n", "zzz", "x" * 600]), max_size=4), garbage)
id_list = st.one_of(st.lists(st.one_of(st.integers(-1, NUM_WORKERS + 2), st.just(47)), max_size=3), garbage)
policy_spec = st.one_of(
    st.just({"policy": "async"}), st.just({"policy": "ssp", "staleness": 0, "refresh_every_step": False}),
    st.just({"policy": "bsp", "replicas_to_aggregate": 1}), st.just({"policy": "nope"}),
    st.just({"policy": "ssp", "staleness": -1}), st.just({"policy": "async", "extra": 1}), garbage,
)
NEW_SPEC = {"key": "new", "dtype": "float32", "shape": [2]}
spec_list = st.one_of(
    st.just(SPEC_DICTS), st.just(SPEC_DICTS[:2]), st.just(SPEC_DICTS + SPEC_DICTS[:1]),
    st.just([{**SPEC_DICTS[0], "shape": [2, 3]}] + SPEC_DICTS[1:]),
    st.just([{**SPEC_DICTS[0], "dtype": "object"}] + SPEC_DICTS[1:]), garbage,
    # Extend: a new variable, alone or with one the store holds (the same spec, or another one)
    st.just([NEW_SPEC]), st.just([NEW_SPEC, SPEC_DICTS[0]]), st.just([NEW_SPEC, {**SPEC_DICTS[0], "shape": [2, 3]}]),
)

#: Well-typed values (right type, any range: ids of non-members, unknown keys, future steps ...).
TYPED = {
    "worker": st.one_of(st.integers(0, 1), st.integers(-1, NUM_WORKERS + 1), st.just(1000)),
    "clock": st.integers(0, 6),
    "step": st.integers(0, 3), "steps": st.integers(1, 3), "loss": st.floats(-10, 10),
    "keys": st.lists(st.sampled_from(["a", "b", "n", "zzz"]), unique=True, max_size=4),
    "base_version": st.integers(0, 4), "min_state_step": st.integers(0, 3), "timeout_s": st.floats(0, 0.01),
    "specs": spec_list, "policy": policy_spec, "num_workers": st.integers(1, 4),
    "nonfinite": st.sampled_from(["refuse", "allow"]),
    "excluded": st.lists(st.integers(0, NUM_WORKERS + 1), unique=True, max_size=3),
    "drain": st.lists(st.integers(0, NUM_WORKERS + 1), unique=True, max_size=2),
    "undrain": st.lists(st.integers(0, NUM_WORKERS), unique=True, max_size=2),
    "gone": st.lists(st.integers(0, NUM_WORKERS + 1), unique=True, max_size=2),
    "total_batches": st.integers(0, 5), "brief": st.booleans(), "reset": st.booleans(),
    "at_step": st.integers(0, 4), "incarnation": st.integers(0, 3), "epoch": st.integers(0, 3), "joined": st.booleans(),
    "logs": st.dictionaries(st.sampled_from(["loss", "accuracy", "val_loss"]), st.floats(-5, 5), max_size=3),
    "key": st.sampled_from(["t", "d", "a", "zzz"]), "learning_rate": st.floats(0, 1),
    "seq": st.integers(0, 3), "name": st.sampled_from(["reduce", "barrier:saved"]),
    "values": st.lists(st.floats(-5, 5), max_size=3),
    "sparse": st.lists(st.sampled_from(["a", "b", "zzz"]), unique=True, max_size=2),
    "also": st.lists(st.sampled_from(["t", "d", "a", "zzz"]), max_size=3),
    "tables": st.one_of(st.just(TABLES), st.just([]), st.just([{**TABLES[0], "dim": 3}]),
                        st.just([{**TABLES[0], "shard": 2}]), st.just(TABLES + TABLES), st.just(TABLES[1:]),
                        st.just([TABLES[0], {**TABLES[1], "dynamic": {"eviction": "fifo"}}]),
                        st.just([TABLES[0], {**TABLES[1], "rows": 3}]),
                        st.just([TABLES[0], {**TABLES[1], "dynamic": {"filter_width": 2**40, "min_count": 2}}])),
}
#: Malformed values, for any field.
MALFORMED = {
    "worker": worker_id, "clock": count, "step": count, "steps": count, "loss": garbage, "keys": key_list,
    "base_version": count, "min_state_step": count, "timeout_s": garbage, "specs": spec_list,
    "policy": policy_spec, "num_workers": count, "nonfinite": garbage, "excluded": id_list, "drain": id_list,
    "undrain": id_list, "gone": id_list, "total_batches": count, "brief": garbage, "reset": garbage, "at_step": count, "incarnation": count, "sparse": key_list, "also": key_list,
    "key": garbage, "learning_rate": garbage, "tables": garbage, "seq": count,
    "name": st.one_of(garbage, st.just(""), st.just("x" * 300)),
    "values": st.one_of(garbage, st.just([float("nan")]), st.just([10**400]), st.just([True])),
    "epoch": count, "joined": garbage, "logs": st.one_of(garbage, st.just({"loss": float("nan")}), st.just({"loss": 10**400}),
                                      st.just({"": 1.0}), st.just({"loss": True})),
}
METHOD_FIELDS = {
    "Init": ["worker", "specs", "policy", "num_workers", "step", "nonfinite", "reset", "tables"],
    "Extend": ["worker", "specs", "incarnation"],
    "WaitInit": ["worker", "timeout_s", "specs", "policy", "num_workers"],
    "Pull": ["worker", "clock", "keys", "min_state_step"],
    "Push": ["worker", "clock", "loss", "steps", "incarnation", "sparse"],
    "PushPull": ["worker", "clock", "loss", "steps", "keys", "base_version", "incarnation", "sparse"],
    "PushGradients": ["worker", "step", "incarnation"], "PutState": ["worker", "step", "incarnation"],
    "SetExcluded": ["worker", "excluded"], "Heartbeat": ["worker"], "Status": ["brief"], "Done": ["worker"],
    "Shutdown": ["worker"], "Leave": ["worker"], "Control": ["drain", "undrain", "gone", "total_batches"],
    "Checkpoint": ["worker", "at_step"], "Restore": ["worker", "step"],
    "Lookup": ["worker", "key", "clock", "also"],
    "PushRows": ["worker", "key", "learning_rate", "step", "incarnation", "also"],
    "WriteRows": ["worker", "key", "incarnation"],
    "EpochLogs": ["worker", "epoch", "logs", "joined"],
    "Rendezvous": ["worker", "seq", "name", "values"],
}
assert set(METHOD_FIELDS) == set(METHODS)
#: Fields a method's parser requires (drawn always, so most requests reach the store).
REQUIRED = {"worker", "specs", "step", "excluded", "key", "epoch", "logs", "seq", "name"}


@st.composite
def requests(draw):
    """(method, meta): the method's fields, well-typed or not, sometimes one malformed or unknown field."""
    method = draw(st.sampled_from(METHODS))
    fields = METHOD_FIELDS[method]
    required = {f: TYPED[f] for f in fields if f in REQUIRED and not (method == "WaitInit" and f == "specs")}
    meta = draw(st.fixed_dictionaries(required, optional={f: TYPED[f] for f in fields if f not in required}))
    corrupt = draw(st.integers(0, 4))
    if corrupt == 1:
        field = draw(st.sampled_from(fields))
        meta[field] = draw(MALFORMED[field])
    elif corrupt == 2:
        meta[draw(st.sampled_from(sorted(MALFORMED)))] = draw(garbage)
    return method, meta


elements = st.floats(width=32, allow_nan=True, allow_infinity=True)
arrays = st.one_of(
    hnp.arrays(np.float32, st.sampled_from([(2, 2), (3,), (2,), (4,), (0,)]), elements=elements),
    hnp.arrays(np.float64, st.sampled_from([(2, 2), (3,)])),
    hnp.arrays(np.int32, st.sampled_from([(2, 2), (3,)])),
)
finite = st.floats(-4, 4, width=32)
valid_tensors = st.fixed_dictionaries({}, optional={
    spec.key: hnp.arrays(np.float32, spec.shape, elements=finite) for spec in SPECS})
row_ids = st.one_of(hnp.arrays(np.int64, st.integers(0, 4), elements=st.integers(-2, 6)),
                  hnp.arrays(np.int64, st.integers(0, 6), elements=st.sampled_from(_CANDIDATES.tolist())),
                  hnp.arrays(np.int64, st.integers(0, 3)))  # any int64
row_tensors = st.one_of(
    st.fixed_dictionaries({"rows": row_ids}),
    row_ids.flatmap(lambda r: st.fixed_dictionaries({
        "rows": st.just(r),
        "grads": st.one_of(hnp.arrays(np.float32, (len(r), 2), elements=elements),
                           hnp.arrays(np.float32, (len(r), 3), elements=finite),
                           hnp.arrays(np.float64, (len(r), 2), elements=finite))})),
    row_ids.flatmap(lambda r: st.fixed_dictionaries({  # WriteRows: rows may repeat, be outside, be NaN
        "rows": st.just(r),
        "values": st.one_of(hnp.arrays(np.float32, (len(r), 2), elements=elements),
                            hnp.arrays(np.float32, (len(r), 3), elements=finite),
                            hnp.arrays(np.float64, (len(r), 2), elements=finite))})),
    st.fixed_dictionaries({"rows": hnp.arrays(np.int32, 2, elements=st.integers(0, 4))}),
)
sparse_tensors = st.fixed_dictionaries({
    "a": st.one_of(hnp.arrays(np.float32, (1, 2), elements=elements), hnp.arrays(np.float32, (2, 2), elements=finite),
                   hnp.arrays(np.float32, (1, 3), elements=finite)),
    "a@rows": st.one_of(hnp.arrays(np.int64, 1, elements=st.integers(-1, 2)), hnp.arrays(np.int64, 2, elements=st.integers(0, 1)),
                        hnp.arrays(np.int32, 1, elements=st.integers(0, 1))),
}, optional={"b": hnp.arrays(np.float32, (3,), elements=finite), "b@rows": hnp.arrays(np.int64, 1)})
extend_tensors = st.fixed_dictionaries(
    {"new": st.one_of(hnp.arrays(np.float32, (2,), elements=elements), hnp.arrays(np.float64, (2,)))},
    optional={spec.key: hnp.arrays(np.float32, spec.shape, elements=finite) for spec in SPECS[:1]})
tensor_sets = st.one_of(
    valid_tensors,
    extend_tensors,
    row_tensors,
    sparse_tensors,
    st.dictionaries(st.sampled_from(["a", "b", "n", "zzz", "y" * 700]), arrays, max_size=3),
)


def check_still_serves(store, kind):
    """A valid request of the store's path is applied exactly, and Status answers."""
    svc = ParameterService(store)
    assert svc.call("Status", brief=True)[0]["initialized"] == store.initialized
    if not store.initialized or "b" not in store.state()["values"]:  # (an Init may have stored other specs)
        return
    before = store.state()["values"]["b"].copy()
    if kind == "bsp":  # a gradient could wait for other workers here: a read answers at once
        meta, values = svc.call("Pull", worker=1)
        np.testing.assert_array_equal(values["b"], before)
    else:
        meta, _ = svc.call("Push", {"b": np.full(3, 0.5, np.float32)}, worker=1, clock=5)
        assert meta["applied"]
        np.testing.assert_array_equal(store.state()["values"]["b"], before + np.float32(0.5))


@pytest.mark.parametrize("kind", ["async", "ssp", "bsp"])
@SETTINGS
@given(request=requests(), tensors=tensor_sets, initialised=st.booleans())
def test_a_refused_request_changes_nothing_and_the_store_keeps_serving(kind, request, tensors, initialised):
    method, meta = request
    store = make_store(kind, initialised=initialised or method != "Init")
    before = comparable(store.state())
    try:
        ParameterService(store).handle(method, meta, tensors, budget=0.0)
    except RequestError as e:
        assert isinstance(e.grpc_code, str)
        if method == "EpochLogs" and "logs are counted" in str(e):
            # Not a refusal either: the logs were reported; only the wait for the other workers ran out.
            assert e.grpc_code == "ABORTED" and meta["worker"] in store.state()["epoch_reports"][meta["epoch"]]
        elif method == "Rendezvous" and "arrival is counted" in str(e):
            # Not a refusal: the worker arrived (and was heard from); only the wait for the others ran out.
            assert e.grpc_code == "ABORTED"
        elif method == "PushGradients" and "gradient is counted" in str(e):
            # Not a refusal: the gradient was accepted; only the wait for the rest of the step ran out.
            assert e.grpc_code == "ABORTED" and meta["worker"] in store.state()["contributors"]
        else:
            after = comparable(store.state())
            assert after == before, f"{method} {meta} refused ({e}) but changed the store"
    check_still_serves(store, kind)


@SETTINGS
@given(meta=st.fixed_dictionaries({}, optional={f: st.one_of(TYPED[f], MALFORMED[f]) for f in METHOD_FIELDS["Init"]}),
       tensors=st.one_of(tensor_sets, st.just(initial_values())))
def test_an_init_is_applied_whole_or_not_at_all(meta, tensors):
    store = make_store("async", initialised=False)
    try:
        ParameterService(store).handle("Init", meta, tensors, budget=0.0)
    except RequestError:
        assert not store.initialized and store.version == 0 and store.state()["values"] == {}
        assert store.policy.spec() == {"policy": "async"}  # the refused request's policy was not installed
        return
    state = store.state()
    assert store.initialized and sorted(state["values"]) == sorted(s["key"] for s in meta["specs"])
    for key, value in state["values"].items():
        np.testing.assert_array_equal(value, tensors[key])


JOIN_SPECS = [NEW_SPEC, {"key": "new2", "dtype": "float64", "shape": [1, 2]}, SPEC_DICTS[0], SPEC_DICTS[2],
              {**SPEC_DICTS[0], "shape": [2, 3]}, {**NEW_SPEC, "dtype": "float64"}]


@pytest.mark.parametrize("kind", ["async", "bsp"])
@SETTINGS
@given(data=st.data())
def test_an_extend_is_applied_whole_or_not_at_all(kind, data):
    """Variables joining a running job (item 8): all of them or none; a key held already keeps its value."""
    specs = data.draw(st.lists(st.sampled_from(JOIN_SPECS), min_size=1, max_size=3, unique_by=lambda d: d["key"]))
    tensors = {}
    for spec in specs:
        dtype = np.dtype(spec["dtype"])
        tensors[spec["key"]] = data.draw(st.one_of(
            hnp.arrays(dtype, tuple(spec["shape"]), elements=st.floats(-4, 4, width=32)),  # matches its spec
            hnp.arrays(dtype, tuple(spec["shape"])),  # may hold NaN/Inf (the job refuses them)
            hnp.arrays(np.float32, (3, 1)),  # the wrong shape
        ))
    worker = data.draw(st.one_of(st.integers(0, NUM_WORKERS - 1), st.integers(-2, NUM_WORKERS + 1), garbage))
    meta = {"worker": worker, "specs": specs}
    if data.draw(st.booleans()):
        meta["incarnation"] = data.draw(st.one_of(st.just(None), st.integers(0, 3), garbage))
    store = make_store(kind)
    before = store.state()
    try:
        reply, values = ParameterService(store).call("Extend", tensors, **meta)
    except RequestError:
        assert comparable(store.state()) == comparable(before), f"a refused Extend {meta} changed the store"
        return
    after = store.state()
    for spec in specs:
        held = {s["key"]: s for s in after["specs"]}[spec["key"]]
        assert (held["dtype"], list(held["shape"])) == (spec["dtype"], list(spec["shape"]))
        if spec["key"] in before["values"]:  # held already: unchanged, and that is what the reply gives
            np.testing.assert_array_equal(after["values"][spec["key"]], before["values"][spec["key"]])
            assert spec["key"] not in reply["added"]
        else:
            np.testing.assert_array_equal(after["values"][spec["key"]], tensors[spec["key"]])
            assert spec["key"] in reply["added"] and spec["key"] in after["joined"]
        np.testing.assert_array_equal(values[spec["key"]], after["values"][spec["key"]])
    assert (after["version"] > before["version"]) == bool(reply["added"])
    check_still_serves(store, kind)


# -------------------------------------------------------------------- wire
@settings(max_examples=max(500, _EXAMPLES), deadline=None,
          derandomize=os.environ.get("TFDIST_HYPOTHESIS_RANDOM") != "1")
@given(st.binary(max_size=300))
def test_the_decoder_raises_only_its_error_on_any_bytes(data):
    for message in (data, wire.MAGIC + data):
        try:
            wire.decode(message)
        except WireFormatError:
            pass


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=5)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=6), children,
                                                                             max_size=4)),
    max_leaves=20,
)
entry = st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.text(max_size=3), json_values), "dtype": st.one_of(st.sampled_from(
        ["float32", "int8", "bool", "object", "bfloat16"]), json_values),
    "shape": st.one_of(st.lists(st.integers(-2, 2**65), max_size=3), json_values),
    "offset": st.one_of(st.integers(-2, 20), json_values), "nbytes": st.one_of(st.integers(-2, 20), json_values),
})


@settings(max_examples=max(500, _EXAMPLES), deadline=None,
          derandomize=os.environ.get("TFDIST_HYPOTHESIS_RANDOM") != "1")
@given(header=st.one_of(json_values, st.fixed_dictionaries(
    {"meta": json_values, "tensors": st.one_of(st.lists(entry, max_size=3), json_values)})),
    payload=st.binary(max_size=40))
def test_the_decoder_raises_only_its_error_on_any_header(header, payload):
    text = json.dumps(header).encode()  # NaN/Infinity appear here as JSON constants: refused
    message = wire.MAGIC + struct.pack("<I", len(text)) + text
    message += b"\0" * ((-len(message)) % 8) + payload
    try:
        meta, tensors = wire.decode(message)
    except WireFormatError:
        return
    assert isinstance(meta, dict) and all(isinstance(v, np.ndarray) for v in tensors.values())


def test_deeply_nested_json_is_refused_with_the_decoders_error():
    text = b"[" * 5000 + b"]" * 5000
    message = wire.MAGIC + struct.pack("<I", len(text)) + text
    with pytest.raises(WireFormatError, match="nested too deeply|Malformed"):
        wire.decode(message)


# ---------------------------------------------------------------- concurrency
def test_concurrent_pushes_sum_exactly():
    n_threads, m_pushes = 8, 50
    store = ParameterStore(AsyncPolicy(), num_workers=n_threads)
    svc = ParameterService(store)
    svc.call("Init", {"b": np.zeros(3, np.float64)}, worker=0, specs=[{"key": "b", "dtype": "float64",
                                                                       "shape": [3], "trainable": True}])
    errors = []

    def pusher(worker):
        try:
            for clock in range(1, m_pushes + 1):
                svc.call("Push", {"b": np.full(3, worker + 1, np.float64)}, worker=worker, clock=clock)
        except Exception as e:  # noqa: BLE001 (surfaced below)
            errors.append(e)

    threads = [threading.Thread(target=pusher, args=(w,)) for w in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    expected = m_pushes * sum(range(1, n_threads + 1))
    np.testing.assert_array_equal(store.state()["values"]["b"], np.full(3, expected, np.float64))
    assert store.version == 1 + n_threads * m_pushes and store.progress == n_threads * m_pushes


_JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.integers(10**300, 10**400),
                          st.floats(allow_nan=True), st.floats(0, 7200), st.text(max_size=5),
                          st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(_JSON_SCALARS)
def test_a_push_pull_replys_server_cpu_is_a_plausible_cpu_time_or_dropped_never_an_error(value):
    """What a PS reports of its CPU (``server_cpu_s``) only steers a worker's schedule and comes with a push the
    PS applied: a number of seconds in [0, 3600] is read, anything else (NaN, a negative, a huge integer, a
    string) is dropped, and the reply is read as ever: never a failed exchange, never a NaN in the counters."""
    from tfdist.ps.replies import MAX_REPORTED_CPU_S, PullReply, PushPullReply, PushReply

    push = PushReply(applied=True, dropped=False, version=3, incarnation=1)
    reply = PushPullReply(PullReply(version=3, state_step=5, global_step=5, incarnation=1), push, unchanged=True)
    meta, _ = reply.to_wire()
    assert "server_cpu_s" not in meta and PushPullReply.parse(meta).server_cpu_s is None  # absent: not reported
    meta = json.loads(json.dumps({**meta, "server_cpu_s": value}))  # (as it travels: JSON)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number and value <= 10**20 and np.isfinite(float(value)) and 0 <= value <= MAX_REPORTED_CPU_S
    parsed = PushPullReply.parse(meta)
    assert parsed.unchanged and parsed.version == 3 and parsed.push == push
    assert parsed.server_cpu_s == (float(value) if ok else None)
    again, _ = parsed.to_wire()
    assert PushPullReply.parse(again) == parsed


def test_a_connection_reports_the_cpu_of_its_reporting_requests_only():
    """The stream server's accounting (``_Peer``, on the serving thread's CPU clock): a report holds the
    reporting request's CPU up to the report and what earlier reporting requests spent after theirs (sending
    their replies); requests that do not report (pulls, lookups) are in no report."""
    from tfdist.stream_service import _Peer

    peer = _Peer()
    peer.begin(10.0)
    assert peer.report(10.004) == pytest.approx(0.004)  # a PushPull: read, decoded, applied
    peer.settle(10.006)  # its reply encoded and sent: 2 ms more, for the next report
    peer.begin(10.006)
    peer.settle(10.050)  # a Lookup: 44 ms, never reported
    peer.begin(10.050)
    assert peer.report(10.053) == pytest.approx(0.002 + 0.003)  # the next PushPull: the last one's sending too
    peer.begin(11.0)  # a request refused after its report was read (an error reply): nothing settles
    assert peer.report(11.001) == pytest.approx(0.001)
    peer.settle(11.001)
    peer.begin(11.5)
    assert peer.report(11.5) == 0.0
    peer.begin(12.0)
    assert peer.report(11.9) == 0.0  # a clock that went backwards (never negative)
