"""Issue 30's departures from Fluid 1.x, fixed: dropout's two implementations through the layer,
a known time length kept by lstm/gru/layers.rnn (unstack without num=), the one_hot layer's
Fluid 1.8 shape."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf


def test_dropout_layer_behaves_as_fluids_both_implementations():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 50], "float64")
        down = nf.layers.dropout(x, 0.2)
        up = nf.layers.dropout(x, 0.2, dropout_implementation="upscale_in_train")
    test = main.clone(for_test=True)
    xv = np.full((40, 50), 3.0)
    exe = nf.Executor()
    train_down, train_up = exe.run(main, feed={"x": xv}, fetch_list=[down, up])
    assert set(np.unique(train_down)) == {0.0, 3.0}  # kept elements unscaled
    np.testing.assert_allclose(np.unique(train_up), [0.0, 3.0 / 0.8])
    test_down, test_up = exe.run(test, feed={"x": xv}, fetch_list=[down.name, up.name])
    np.testing.assert_allclose(test_down, xv * 0.8)
    np.testing.assert_array_equal(test_up, xv)


def test_lstm_and_rnn_keep_a_known_time_length():
    x = nf.data("x", [-1, 10, 8])
    n = nf.data("n", [-1], "int64")
    out, h, c = nf.layers.lstm(x, 6, n)
    assert out.shape == (-1, 10, 6)
    out2, _ = nf.layers.gru(x, 4, n, num_layers=2, is_bidirec=True)
    assert out2.shape == (-1, 10, 8)
    out3, _ = nf.layers.rnn(nf.layers.GRUCell(3), x, sequence_length=n)
    assert out3.shape == (-1, 10, 3)
    steps = nf.layers.unstack(out, axis=1)  # no num= needed
    assert len(steps) == 10 and steps[0].shape == (-1, 6)
    unknown, _, _ = nf.layers.lstm(nf.data("y", [-1, -1, 8]), 6)
    assert unknown.shape == (-1, -1, 6)


def test_one_hot_layer_is_fluid_1_8s_and_nf_one_hot_is_v2():
    ids = nf.data("ids", [-1, 1], "int64")
    flat = nf.data("flat", [-1], "int64")
    layer, v2, v2_column = nf.layers.one_hot(ids, 4), nf.one_hot(flat, 4), nf.one_hot(ids, 4)
    assert layer.shape == (-1, 4) and v2.shape == (-1, 4) and v2_column.shape == (-1, 1, 4)
    feed = {"ids": np.array([[3], [0]]), "flat": np.array([1, 2])}
    got = nf.Executor().run(feed=feed, fetch_list=[layer, v2, v2_column])
    np.testing.assert_array_equal(got[0], np.eye(4, dtype="float32")[[3, 0]])
    np.testing.assert_array_equal(got[1], np.eye(4, dtype="float32")[[1, 2]])
    np.testing.assert_array_equal(got[2], np.eye(4, dtype="float32")[[3, 0]][:, None])
    with pytest.raises(nf.errors.ShapeError, match="use nf.one_hot"):
        nf.layers.one_hot(flat, 4)


def test_embedding_of_column_ids_is_n_by_dim_as_its_docstring_says():
    ids = nf.data("ids", [-1, 1], "int64")
    out = nf.layers.embedding(ids, size=[10, 3])
    assert out.shape == (-1, 3)
    assert "[N, 1] -> [N, dim]" in nf.layers.embedding.__doc__
    nf.Executor().run(nf.default_startup_program())
    (value,) = nf.Executor().run(feed={"ids": np.array([[1], [4]])}, fetch_list=[out])
    assert value.shape == (2, 3)


def test_ifelse_condition_of_unknown_width_is_checked_at_run_time():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        a = nf.data("a", [-1, -1])
        cond = nf.layers.less_than(a, nf.layers.fill_constant([1], "float32", 0.0))
        ie = nf.layers.IfElse(cond)  # Fluid checks the condition's shape at run time
        with ie.true_block():
            ie.output(ie.input(a))
        with ie.false_block():
            ie.output(ie.input(a) * 2.0)
        (out,) = ie()
    feed = {"a": np.array([[-1.0], [3.0]], "float32")}
    (got,) = nf.Executor().run(main, feed=feed, fetch_list=[out])
    np.testing.assert_array_equal(got, [[-1.0], [6.0]])
    with pytest.raises(nf.errors.NestflowError, match=r"\[N, 1\] or \[N\]"):
        nf.Executor().run(main, feed={"a": np.ones((2, 2), "float32")}, fetch_list=[out])


def test_split_with_a_float_axis_is_a_type_error_as_fluids_test_expects():
    x = nf.data("x", [-1, 4])
    with pytest.raises(TypeError, match="dim must be an int, got float"):
        nf.layers.split(x, 2, dim=3.2)


def test_append_op_without_a_type_names_the_alternative():
    block = nf.Program().global_block()
    with pytest.raises(nf.errors.AttrError, match="give type, inputs, outputs and attrs"):
        block.append_op()
