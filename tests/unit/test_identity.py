"""CanonicalNames: a variable's name in the job does not depend on Keras's auto-name counters (issue #21 item 7a)."""

from tfdist.ps.identity import CanonicalNames

CHIEF = [  # the chief built an Adam and a Dense before its model: Keras counted them
    "sequential/dense_1/kernel", "sequential/dense_1/bias", "sequential/dense_2/kernel",
    "adam_1/iteration", "adam_1/sequential_dense_1_kernel_momentum", "adam_1/sequential_dense_2_kernel_velocity",
]
OTHER = [
    "sequential/dense/kernel", "sequential/dense/bias", "sequential/dense_1/kernel",
    "adam/iteration", "adam/sequential_dense_kernel_momentum", "adam/sequential_dense_1_kernel_velocity",
]


def _canonical(names):
    c = CanonicalNames()
    return [c.canonical(n) for n in names]


def test_the_same_variables_get_the_same_names_whatever_was_counted_before():
    assert _canonical(CHIEF) == _canonical(OTHER) == OTHER


def test_a_second_model_in_one_process_is_named_as_a_fresh_process_names_it():
    second = ["sequential_1/dense_3/kernel", "sequential_1/batch_normalization_1/moving_mean", "sequential_1/dense_4/bias"]
    assert _canonical(second) == ["sequential/dense/kernel", "sequential/batch_normalization/moving_mean",
                                  "sequential/dense_1/bias"]


def test_distinct_names_stay_distinct_and_unnumbered_ones_are_kept():
    names = ["model/encoder/conv2d_3x3/kernel", "model/block_7/kernel", "model/block_9/kernel", "model/head/kernel"]
    assert _canonical(names) == ["model/encoder/conv2d_3x3/kernel", "model/block/kernel", "model/block_1/kernel",
                                 "model/head/kernel"]


def test_weights_created_without_a_name_are_renumbered_too():
    first = ["model/tracker/variable_4", "model/tracker/variable_5", "adam/model_tracker_variable_5_momentum"]
    assert _canonical(first) == ["model/tracker/variable", "model/tracker/variable_1",
                                 "adam/model_tracker_variable_1_momentum"]
