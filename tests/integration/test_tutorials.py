"""TensorFlow's distributed-training tutorials, as written, on tfdist strategies (``examples/tutorials/``, issue #25).

Each tutorial keeps the tutorial's code; only the strategy line, the launch
(``LocalCluster``: 2 real worker processes on 127.0.0.1, plus one PS task for
the parameter-server strategies) and the data (8x8 digits, offline) differ,
and the sizes are small. Each is asserted on what it prints (recorded beside
each ``print``): the loss falls, the reduced loss is the job's (compared
against MultiWorkerMirroredStrategy running the same code), the checkpoint
the chief wrote loads and training resumes from it.
"""

import json
import os

import pytest

from tfdist.testing import LocalCluster

pytestmark = pytest.mark.timeout(600)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUTORIALS = os.path.join(ROOT, "examples", "tutorials")


def run_tutorial(script, strategy, work, epochs, tag, **extra_env):
    """Runs ``script`` on 2 workers (+1 PS for PS strategies); returns each worker's recorded rows."""
    ps = 0 if strategy in ("mwms", "all_reduce") else 1
    env = {f"worker:{i}": {"TUTORIAL_STRATEGY": strategy, "TUTORIAL_DIR": str(work), "TUTORIAL_EPOCHS": str(epochs),
                           "TUTORIAL_OUT": str(work / f"{tag}-worker-{i}.json"), **extra_env} for i in (0, 1)}
    with LocalCluster(workers=2, ps=ps, env=env, log_dir=str(work / f"logs-{tag}")) as cluster:
        cluster.start(os.path.join(TUTORIALS, script))
        try:
            cluster.wait(300)
        finally:
            logs = {t: cluster.log(t)[-2500:] for t in ("worker:0", "worker:1")}
    rows = []
    for i in (0, 1):
        path = work / f"{tag}-worker-{i}.json"
        assert path.exists(), logs
        rows.append(json.loads(path.read_text()))
    return rows


@pytest.fixture(scope="module")
def ctl_reference(tmp_path_factory):
    """The custom-training-loop tutorial under MultiWorkerMirroredStrategy (2 epochs)."""
    work = tmp_path_factory.mktemp("ctl-mwms")
    return run_tutorial("custom_training_loop.py", "mwms", work, 2, "run")


#: One strategy per tutorial runs by default; the others are slow (test_tf_distribute_contract and
#: test_keras_matrix cover what they add in the default run).
CTL = [pytest.param("all_reduce"), pytest.param("bsp", marks=pytest.mark.slow),
       pytest.param("async", marks=pytest.mark.slow)]
FIT = [pytest.param("bsp"), pytest.param("all_reduce", marks=pytest.mark.slow),
       pytest.param("async", marks=pytest.mark.slow)]


@pytest.mark.parametrize("strategy", CTL)
def test_custom_training_loop_tutorial(tmp_path, strategy, ctl_reference):
    first = run_tutorial("custom_training_loop.py", strategy, tmp_path, 2, "first")
    for rows in first:
        assert rows[0] == {"restored_epoch": 0, "task": rows[0]["task"]}, rows
        epochs = [r for r in rows if "epoch" in r]
        assert [r["epoch"] for r in epochs] == [0, 1], rows
        assert epochs[1]["train_loss"] < epochs[0]["train_loss"], rows  # it learns
    if strategy in ("all_reduce", "bsp"):
        # strategy.reduce(SUM) of the per-replica losses is the job's: the same number on both workers, and
        # the job's mean loss (MultiWorkerMirroredStrategy's scale), not half of it.
        losses = [[r["train_loss"] for r in rows if "epoch" in r] for rows in first]
        assert losses[0] == losses[1], losses
        reference = [r["train_loss"] for r in ctl_reference[0] if "epoch" in r]
        assert losses[0][0] == pytest.approx(reference[0], rel=0.15), (losses, reference)
    # Run again in the same place with one more epoch: every worker resumes from the chief's checkpoint.
    second = run_tutorial("custom_training_loop.py", strategy, tmp_path, 3, "second")
    for rows in second:
        # The checkpoint of the last epoch (1) is saved before the tutorial counts it done: epoch 1 has no
        # batches left, and epoch 2 trains.
        assert rows[0]["restored_epoch"] == 1, rows
        assert [(r["epoch"], r["batches"]) for r in rows if "epoch" in r] == [(1, 0), (2, 8)], rows
    # worker 1 wrote its checkpoints under workertemp_1 (the tutorial's write_filepath) and removed them
    assert os.listdir(tmp_path / "workertemp_1") == [], os.listdir(tmp_path / "workertemp_1")
    assert sorted(os.listdir(tmp_path / "ckpt"))[0] == "checkpoint", os.listdir(tmp_path / "ckpt")  # the chief's


@pytest.mark.parametrize("strategy", FIT)
def test_keras_fit_tutorial(tmp_path, strategy):
    """fit with BackupAndRestore and ModelCheckpoint on shared paths, a failure, a resume, save/barrier/load."""
    first = run_tutorial("keras_fit.py", strategy, tmp_path, 3, "first", TUTORIAL_FAIL_AFTER_EPOCH="1")
    for rows in first:
        assert rows == [{"stopped": "simulated failure after epoch 1"}], rows
    assert os.path.exists(tmp_path / "backup"), os.listdir(tmp_path)  # the chief's backup of epoch 1
    second = run_tutorial("keras_fit.py", strategy, tmp_path, 3, "second")
    for rows in second:
        assert rows[0]["epochs"] == [2], rows  # every worker resumed from the chief's backup
        assert all(v == v for v in rows[0]["loss"] + rows[1]["loaded_fit_loss"]), rows  # finite
        assert rows[1]["files"] == ["keras-model.keras"], rows  # the chief's model; the tutorial removed its temp dir
    # Only the chief wrote the shared paths; the backup was deleted after the finished fit.
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["best.keras"], os.listdir(tmp_path / "ckpt")
    assert not os.path.exists(tmp_path / "backup"), os.listdir(tmp_path / "backup")


def test_keras_guide_resume_tutorial(tmp_path):
    """The Keras guide's run_training() twice in one process: new strategy and model, resumed from the checkpoint."""
    rows = run_tutorial("keras_guide_resume.py", "all_reduce", tmp_path, 1, "run")
    for worker in rows:
        assert worker[0] == {"restored": None} and worker[2] == {"restored": "ckpt-1.keras"}, worker
        assert worker[4] == {"checkpoints": ["ckpt-1.keras"]}, worker  # the chief's only
    for run in (1, 3):  # both workers end every run as one model (a model built later starts from worker 0's)
        assert rows[0][run]["weights_sum"] == rows[1][run]["weights_sum"], (rows[0][run], rows[1][run])


def _by_section(rows):
    return {r["section"]: r for r in rows}


@pytest.fixture(scope="module")
def input_reference(tmp_path_factory):
    """The distributed-input tutorial under MultiWorkerMirroredStrategy."""
    work = tmp_path_factory.mktemp("input-mwms")
    return [_by_section(rows) for rows in run_tutorial("distributed_input.py", "mwms", work, 0, "run")]


INPUT = [pytest.param("bsp"), pytest.param("all_reduce", marks=pytest.mark.slow),
         pytest.param("async", marks=pytest.mark.slow)]


@pytest.mark.parametrize("strategy", INPUT)
def test_distributed_input_tutorial(tmp_path, strategy, input_reference):
    runs = [_by_section(rows) for rows in run_tutorial("distributed_input.py", strategy, tmp_path, 0, "run")]
    synchronous = strategy != "async"  # async: every worker is a sync group of one (README, the contract test)
    for task, (got, ref) in enumerate(zip(runs, input_reference)):
        batches = got["experimental_distribute_dataset"]["batch_sizes"]
        if synchronous:
            # A dataset whose auto-shard policy is DATA: each worker's per-replica batch is its share of the
            # global batch, as under MultiWorkerMirroredStrategy.
            assert batches == ref["experimental_distribute_dataset"]["batch_sizes"] == [8] * 8
        else:  # one replica per worker: whole batches, every other one
            assert batches == [16] * 4
        # distribute_datasets_from_function: the input context is the worker's: every other element, 8 per batch.
        elements = got["distribute_datasets_from_function"]["elements"]
        assert elements == ref["distribute_datasets_from_function"]["elements"] == list(range(task, 64, 2))
        assert got["iter_next"]["steps"] == 4
        assert got["inside_tf_function"]["total"] == pytest.approx(ref["inside_tf_function"]["total"])
        assert got["element_spec"]["spec"] == ref["element_spec"]["spec"] == "(None, 1)"
        # the input context's per-replica batch: the global batch split over the sync group (async: a group of one)
        assert got["element_spec"]["doubled_shape"] == ([8, 1] if synchronous else [16, 1])
        assert ref["element_spec"]["doubled_shape"] == [8, 1]
        # A dataset left at the default policy is this worker's as given (documented: tfdist does not auto-shard
        # by file); the last partial batch still ends the loop through get_next_as_optional.
        assert got["get_next_as_optional"] == {"section": "get_next_as_optional", "task": task, "count": 9, "last": 8}
        local, replicas = got["values_from_function"]["local_results"], got["values_from_function"]["replicas"]
        if synchronous:  # replica_id_in_sync_group is the worker's place in the job, as under MWMS
            assert local == ref["values_from_function"]["local_results"] == [task + 1]
            assert replicas == ref["values_from_function"]["replicas"] == 2
        else:
            assert (local, replicas) == ([1], 1)


PS_TUTORIAL = [pytest.param("async"), pytest.param("bsp", marks=pytest.mark.slow),
               pytest.param("ssp", marks=pytest.mark.slow)]


@pytest.mark.parametrize("strategy", PS_TUTORIAL)
def test_parameter_server_tutorial_translated(tmp_path, strategy):
    """Both parts of TF's parameter-server tutorial, its coordinator calls translated (the file's docstring)."""
    runs = run_tutorial("parameter_server_training.py", strategy, tmp_path, 4, "run")
    for task, rows in enumerate(runs):
        fit = next(r for r in rows if r["part"] == "fit")
        assert len(fit["loss"]) == 4 and fit["loss"][-1] < fit["loss"][0], fit  # Model.fit learns
        loop = [r for r in rows if r["part"] == "loop"]
        assert [r["epoch"] for r in loop] == [0, 1, 2, 3], rows
        # "avenger in features" is learnable: the last epoch's accuracy beats always answering "no" (~4/7)
        assert loop[-1]["accuracy"] > 0.7, loop
        final = next(r for r in rows if r["part"] == "final")
        assert final["loss"] == final["loss"] and final["loss"] >= 0  # finite, the worker's own
        assert final["checkpoint"]  # ModelCheckpoint's file, the chief's path (read after the fit on every worker)
        assert {ps for _, ps in final["placement"]} == {0}  # one PS task here: everything on it
    assert runs[0][-1]["placement"] == runs[1][-1]["placement"]  # one map for the job
