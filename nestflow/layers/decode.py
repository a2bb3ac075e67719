"""Decoding (Fluid 1.7): `Decoder`, `BeamSearchDecoder` and `dynamic_decode`, a While loop
running `decoder.step` until every sequence has finished or `max_step_num` is passed.

    cell = MyCell()                                  # cell(inputs, states) -> (out, new_states)
    decoder = nf.layers.BeamSearchDecoder(
        cell, start_token=0, end_token=1, beam_size=4,
        embedding_fn=lambda ids: nf.layers.embedding(ids, [V, E], param_attr="trg_emb"),
        output_fn=lambda h: nf.layers.fc(h, V, num_flatten_dims=2, name="out"))
    ids, final = nf.layers.dynamic_decode(decoder, inits=h0, max_step_num=20)
    # ids: int64 [batch, time, beam], best beam first; final.log_probs: [batch, beam] scores

Beam search (Fluid 1.7's algorithm): the cell's states are tiled to `[batch * beam, ...]`;
each step turns the cell's output into log-probabilities (log_softmax of `output_fn`'s logits
over the last dim), adds them to each beam's score and keeps the `beam_size` best of the
`beam * vocab` candidates of each batch row (top_k; ties to the lower index). A beam that has
emitted `end_token` is finished: it only extends with `end_token`, at no cost, so it keeps its
score and its sequence is padded with `end_token`. Scores are summed log-probabilities, with
no length normalisation (as in Fluid 1.7). `finalize` backtracks each final beam through the
steps' parent beams (the `gather_tree` op). At the first step only beam 0 is live (the others
start at -1e9), so the beams are distinct.

Greedy decoding is `BeamSearchDecoder(..., beam_size=1)`: one beam keeps the arg-max token of
each step (DESIGN's "greedy via argmax"; no GreedyEmbeddingHelper is needed).

As in Fluid, `max_step_num` bounds the step index: decoding stops once every beam has finished
or after step `max_step_num` (so at most max_step_num + 1 steps). `is_test` is accepted for
Fluid programs and changes nothing: a While without a gradient keeps one step's scope anyway.
"""

from __future__ import annotations

import collections
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from nestflow.errors import AttrError, ControlFlowError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers import nn, tensor
from nestflow.layers.cond import flatten, map_structure, pack_sequence_as
from nestflow.layers.control_flow import While, array_to_tensor, array_write
from nestflow.layers.helper import append_op, current_block, layer_error
from nestflow.layers.math import exp, log

# The score a beam that must not be chosen starts with (Fluid's kinf).
_KINF = 1e9


class Decoder:
    """What dynamic_decode runs (Fluid 1.7's interface): `initialize(inits)` gives
    (initial_inputs, initial_states, finished); `step(time, inputs, states, **kwargs)` gives
    (outputs, next_states, next_inputs, finished); optional `finalize(outputs, final_states,
    sequence_lengths)` gives (final_outputs, final_states); `tracks_own_finished` says whether
    step's `finished` already accounts for earlier steps (beams reorder, so beam search does).

    >>> class CountDown(nf.layers.Decoder):       # emits n-1, n-2, ... until 0
    ...     def initialize(self, n):
    ...         one = nf.layers.fill_constant([1], "int64", 1)
    ...         return n, n, nf.layers.less_than(n, one)
    ...     def step(self, time, inputs, states):
    ...         left, one = states - 1, nf.layers.fill_constant([1], "int64", 1)
    ...         return left, left, left, nf.layers.less_than(left, one)
    >>> n = nf.layers.data("n", [-1], "int64")
    >>> outputs, final = nf.layers.dynamic_decode(CountDown(), inits=n)
    >>> nf.Executor().run(feed={"n": np.array([2, 3])}, fetch_list=[outputs])[0].tolist()
    [[1, 0, -1], [2, 1, 0]]
    """

    def initialize(self, inits: Any) -> tuple[Any, Any, VarDesc]:
        raise NotImplementedError

    def step(self, time: VarDesc, inputs: Any, states: Any, **kwargs: Any) -> tuple:
        raise NotImplementedError

    def finalize(self, outputs: Any, final_states: Any, sequence_lengths: VarDesc) -> tuple:
        raise NotImplementedError

    @property
    def tracks_own_finished(self) -> bool:
        return False


class BeamSearchDecoder(Decoder):
    """Beam search over a cell (Fluid 1.7 `BeamSearchDecoder`; algorithm in the module doc).

    `cell(inputs, states, **kwargs) -> (outputs, new_states)` is any callable (a GRUCell, an
    LSTMCell, a function); its inputs are `embedding_fn(ids)` of the chosen ids (int64
    `[batch * beam]` ids themselves when embedding_fn is None) and its states those given to
    dynamic_decode's `inits`, tiled to `[batch * beam, ...]`. `output_fn` maps the cell's
    outputs, shaped `[batch, beam, ...]`, to logits `[batch, beam, vocab]` (the outputs are the
    logits when None); the vocabulary size must be known when the step is built. Other
    `[batch, ...]` values the cell reads (an encoder's output for attention) must be tiled
    with `tile_beam_merge_with_batch`.

    Errors (at the user's line): AttrError for beam_size < 1 or non-integer tokens,
    ShapeError for an end_token outside the vocabulary (when the step is built) or a cell
    output that is not `[batch, beam, vocab]`.

    >>> decoder = nf.layers.BeamSearchDecoder(
    ...     nf.layers.GRUCell(8), start_token=0, end_token=1, beam_size=3,
    ...     embedding_fn=lambda ids: nf.layers.embedding(ids, [5, 4], param_attr="emb.w"),
    ...     output_fn=lambda out: nf.layers.fc(out, 5, num_flatten_dims=2))
    >>> h0 = nf.layers.data("h0", [-1, 8])
    >>> ids, final = nf.layers.dynamic_decode(decoder, inits=h0, max_step_num=4)
    >>> ids.shape, final.log_probs.shape
    ((-1, -1, 3), (-1, 3))
    >>> exe = nf.Executor()
    >>> _ = exe.run(nf.default_startup_program())
    >>> got, scores = exe.run(feed={"h0": np.zeros((2, 8), "float32")},
    ...                       fetch_list=[ids, final.log_probs])
    >>> got.shape[0], got.shape[2], bool((np.diff(scores, axis=1) <= 0).all())
    (2, 3, True)
    """

    class OutputWrapper(collections.namedtuple("OutputWrapper", "scores predicted_ids parent_ids")):
        """A step's outputs, each [batch, beam]: the beams' scores (float), the tokens they
        chose and the beams they extend (int64)."""

    class StateWrapper(
        collections.namedtuple("StateWrapper", "cell_states log_probs finished lengths")
    ):
        """The decoding state: the cell's states [batch, beam, ...], each beam's score
        (summed log-probabilities, [batch, beam]), whether it has finished (bool) and its
        length (int64: the tokens up to and including the end token)."""

    def __init__(
        self,
        cell: Callable,
        start_token: int,
        end_token: int,
        beam_size: int,
        embedding_fn: Callable | None = None,
        output_fn: Callable | None = None,
    ):
        for what, value in (("start_token", start_token), ("end_token", end_token)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
                raise layer_error(
                    AttrError,
                    "BeamSearchDecoder",
                    f"{what} must be a non-negative int (a token id), got {value!r}",
                )
        if not isinstance(beam_size, numbers.Integral) or isinstance(beam_size, bool):
            raise layer_error(
                AttrError, "BeamSearchDecoder", f"beam_size must be an int, got {beam_size!r}"
            )
        if beam_size < 1:
            raise layer_error(
                AttrError, "BeamSearchDecoder", f"beam_size must be at least 1, got {beam_size}"
            )
        if not callable(cell):
            raise layer_error(
                AttrError,
                "BeamSearchDecoder",
                f"cell must be callable as cell(inputs, states), got {type(cell).__name__}",
            )
        self.cell = cell
        self.start_token = int(start_token)
        self.end_token = int(end_token)
        self.beam_size = int(beam_size)
        self.embedding_fn = embedding_fn
        self.output_fn = output_fn

    # ---- reshaping between [batch, beam, ...] and [batch * beam, ...] ----

    @staticmethod
    def tile_beam_merge_with_batch(x: VarDesc, beam_size: int) -> VarDesc:
        """`x` [batch, ...] with each row repeated beam_size times: [batch * beam_size, ...]
        (rows x[0], x[0], ..., x[1], x[1], ...), the layout the cell sees in beam search."""
        tiled = _expand_to_beam(x, beam_size)
        return _merge_batch_beams(tiled)

    def _split_batch_beams(self, x: VarDesc) -> VarDesc:
        """x [batch * beam, ...] as [batch, beam, ...]."""
        if all(d >= 0 for d in x.shape[1:]):
            return nn.reshape(x, [-1, self.beam_size, *x.shape[1:]])
        # Unknown dims after the first: moved first, they are copied by reshape's 0.
        rest = x.ndim - 1
        moved = nn.transpose(x, [*range(1, x.ndim), 0])
        split = nn.reshape(moved, [0] * rest + [-1, self.beam_size])
        return nn.transpose(split, [rest, rest + 1, *range(rest)])

    def _merge_inputs(self, x: VarDesc) -> VarDesc:
        # nf.layers.embedding (Fluid's lookup_table) drops a last ids dim of 1: with one beam
        # the embedded [batch, 1] ids come as [batch, dim], already one row per beam.
        if self.beam_size == 1 and x.ndim >= 2 and x.shape[1] != 1:
            return x
        return _merge_batch_beams(x)

    # ---- the decoder interface ----

    def initialize(self, initial_cell_states: Any) -> tuple[Any, StateWrapper, VarDesc]:
        """(start-token inputs, StateWrapper of the tiled cell states and fresh beams,
        finished [batch, beam] all False) for `initial_cell_states` ([batch, ...] each)."""
        first = flatten(initial_cell_states)[0]
        if not isinstance(first, VarDesc):
            raise layer_error(
                AttrError,
                "BeamSearchDecoder",
                f"inits must be the cell's initial states (variables), got {first!r}",
            )
        beam = self.beam_size
        cell_states = map_structure(lambda s: _expand_to_beam(s, beam), initial_cell_states)
        score_dtype = first.dtype if first.dtype in ("float32", "float64") else "float32"
        ids = tensor.fill_constant_batch_size_like(first, [-1, beam], "int64", self.start_token)
        zeros = tensor.fill_constant_batch_size_like(first, [-1, beam], score_dtype, 0.0)
        first_live = nn.assign(np.array([[0.0] + [-_KINF] * (beam - 1)], score_dtype))
        log_probs = nn.elementwise_add(zeros, first_live)
        finished = tensor.fill_constant_batch_size_like(first, [-1, beam], "bool", 0.0)
        lengths = tensor.fill_constant_batch_size_like(first, [-1, beam], "int64", 0.0)
        # The coordinates gather_nd picks [batch, beam] rows with: (row, chosen beam) pairs.
        batch = nn.cast(nn.slice(tensor.shape(first), [0], [0], [1]), "int64")
        rows = tensor.range(0, batch, 1, "int64")
        self._rows = tensor.expand(tensor.unsqueeze(rows, [1]), [1, beam])
        inputs = self.embedding_fn(ids) if self.embedding_fn is not None else ids
        state = self.StateWrapper(cell_states, log_probs, finished, lengths)
        return inputs, state, finished

    def _gather(self, x: VarDesc, beams: VarDesc) -> VarDesc:
        """x [batch, beam, ...] with each row's beams taken in the order `beams` names."""
        coordinates = tensor.stack([self._rows, beams], axis=2)
        return tensor.gather_nd(x, coordinates)

    def _log_probs(self, logits: VarDesc) -> VarDesc:
        """log_softmax over the last dim, written out (log(softmax) gives -inf for a
        probability that underflows)."""
        shifted = nn.elementwise_sub(logits, tensor.reduce_max(logits, dim=-1, keep_dim=True))
        total = tensor.reduce_sum(exp(shifted), dim=-1, keep_dim=True)
        return nn.elementwise_sub(shifted, log(total))

    def _beam_search_step(self, logits: VarDesc, next_cell_states: Any, beam_state: Any):
        if logits.ndim != 3 or logits.shape[1] not in (self.beam_size, -1):
            raise layer_error(
                ShapeError,
                "BeamSearchDecoder",
                f"the logits (output_fn of the cell's outputs) must be [batch, beam_size="
                f"{self.beam_size}, vocab], got '{logits.name}' {list(logits.shape)}",
            )
        vocab = logits.shape[-1]
        if vocab < 0:
            raise layer_error(
                ShapeError,
                "BeamSearchDecoder",
                f"the vocabulary size (last dim of the logits '{logits.name}' "
                f"{list(logits.shape)}) must be known when the step is built",
            )
        if self.end_token >= vocab:
            raise layer_error(
                ShapeError,
                "BeamSearchDecoder",
                f"end_token {self.end_token} is outside the vocabulary of {vocab} tokens "
                f"(the logits '{logits.name}' are {list(logits.shape)})",
            )
        beam = self.beam_size
        dtype = logits.dtype
        step_log_probs = self._log_probs(logits)
        # A finished beam extends only with the end token, at no cost.
        only_end = np.full([vocab], -_KINF, dtype)
        only_end[self.end_token] = 0.0
        finished = tensor.unsqueeze(beam_state.finished, [2])
        step_log_probs = tensor.where(finished, nn.assign(only_end), step_log_probs)
        log_probs = nn.elementwise_add(step_log_probs, beam_state.log_probs, axis=0)
        scores = nn.reshape(log_probs, [-1, beam * vocab])
        top_scores, top_indices = tensor.topk(scores, beam)
        vocab_size = nn.fill_constant([1], "int64", vocab)
        beams = nn.elementwise_div(top_indices, vocab_size)  # integers: truncating division
        tokens = nn.elementwise_sub(top_indices, nn.elementwise_mul(beams, vocab_size))
        next_cell_states = map_structure(lambda s: self._gather(s, beams), next_cell_states)
        was_finished = self._gather(beam_state.finished, beams)
        lengths = nn.elementwise_add(
            self._gather(beam_state.lengths, beams),
            nn.cast(nn.logical_not(was_finished), "int64"),
        )
        end = nn.fill_constant([1], "int64", self.end_token)
        finished = nn.logical_or(was_finished, nn.equal(tokens, end))
        output = self.OutputWrapper(top_scores, tokens, beams)
        state = self.StateWrapper(next_cell_states, top_scores, finished, lengths)
        return output, state

    def step(self, time: VarDesc, inputs: Any, states: StateWrapper, **kwargs: Any) -> tuple:
        """One step of beam search: (OutputWrapper, StateWrapper, next inputs, finished)."""
        inputs = map_structure(self._merge_inputs, inputs)
        cell_states = map_structure(_merge_batch_beams, states.cell_states)
        cell_outputs, next_cell_states = self.cell(inputs, cell_states, **kwargs)
        cell_outputs = map_structure(self._split_batch_beams, cell_outputs)
        next_cell_states = map_structure(self._split_batch_beams, next_cell_states)
        logits = self.output_fn(cell_outputs) if self.output_fn is not None else cell_outputs
        if not isinstance(logits, VarDesc):
            raise layer_error(
                ShapeError,
                "BeamSearchDecoder",
                f"the logits (output_fn of the cell's outputs) must be one variable, got "
                f"{type(logits).__name__}",
            )
        output, state = self._beam_search_step(logits, next_cell_states, states)
        ids = output.predicted_ids
        next_inputs = self.embedding_fn(ids) if self.embedding_fn is not None else ids
        return output, state, next_inputs, state.finished

    def finalize(self, outputs: OutputWrapper, final_states: StateWrapper, sequence_lengths):
        """(predicted_ids [time, batch, beam] backtracked with gather_tree, final_states)."""
        predicted = append_op(
            "gather_tree",
            {"Ids": outputs.predicted_ids, "Parents": outputs.parent_ids},
            stop_gradient=True,
        )
        return predicted, final_states

    @property
    def tracks_own_finished(self) -> bool:
        return True


def _expand_to_beam(x: VarDesc, beam: int) -> VarDesc:
    """x [batch, ...] as [batch, beam, ...], each row repeated."""
    x = tensor.unsqueeze(x, [1])
    return tensor.expand(x, [1, beam] + [1] * (x.ndim - 2))


def _merge_batch_beams(x: VarDesc) -> VarDesc:
    """x [batch, beam, ...] as [batch * beam, ...]."""
    if all(d >= 0 for d in x.shape[2:]):
        return nn.reshape(x, [-1, *x.shape[2:]])
    # Unknown dims after the first two: moved first, they are copied by reshape's 0.
    rest = x.ndim - 2
    moved = nn.transpose(x, [*range(2, x.ndim), 0, 1])
    merged = nn.reshape(moved, [0] * rest + [-1])
    return nn.transpose(merged, [rest, *range(rest)])


def _copy(x: Any) -> VarDesc:
    if not isinstance(x, VarDesc):
        raise layer_error(
            ControlFlowError,
            "dynamic_decode",
            f"the decoder's inputs and states must be variables, got {type(x).__name__}",
        )
    return nn.assign(x)


def _keep_finished(finished: VarDesc, old: VarDesc, new: VarDesc) -> VarDesc:
    """new where the row has not finished, else old (impute_finished)."""
    mask = finished
    if old.ndim > finished.ndim:
        mask = tensor.unsqueeze(finished, list(range(finished.ndim, old.ndim)))
    return tensor.where(mask, old, new)


def _not_all(finished: VarDesc) -> VarDesc:
    """[1] bool: whether some row has not finished."""
    return nn.logical_not(nn.reshape(tensor.reduce_all(finished), [1]))


def _new_array(parent, x: VarDesc) -> VarDesc:
    """A tensor array made in `parent` (before the While op, which is appended later)."""
    array = parent.create_var(
        unique_name.generate("decode.outputs"), dtype=x.dtype, type="tensor_array"
    )
    parent.append_op("create_array", outputs={"Out": [array]}, attrs={"dtype": x.dtype})
    return array


def dynamic_decode(
    decoder: Decoder,
    inits: Any = None,
    max_step_num: int | None = None,
    output_time_major: bool = False,
    impute_finished: bool = False,
    is_test: bool = False,
    return_length: bool = False,
    **kwargs: Any,
) -> tuple:
    """Run `decoder.step` in a While loop until every `finished` holds, or after step
    `max_step_num` (None: no bound); returns (final_outputs, final_states), plus the int64
    sequence lengths with `return_length` (Fluid 1.7's dynamic_decode).

    The steps' outputs are stacked along time (`[batch, time, ...]`, or `[time, batch, ...]`
    with output_time_major) and passed through `decoder.finalize` when it has one; for a
    BeamSearchDecoder the final outputs are the predicted ids `[batch, time, beam]` and the
    final states its StateWrapper (`log_probs`: each beam's score). `kwargs` are passed to
    `decoder.step` (and on to the cell). With impute_finished (for decoders that do not track
    their own finished state) the states of finished rows stop changing.
    Errors: AttrError for a negative max_step_num.

    >>> cell = lambda ids, h: (nf.one_hot(ids, 4) * 2.0 + h, h)   # logits 2 at the input id
    >>> decoder = nf.layers.BeamSearchDecoder(cell, start_token=2, end_token=1, beam_size=1,
    ...     output_fn=lambda logits: logits + nf.layers.assign(np.array([0, 0, 0, 3.0], "float32")))
    >>> h0 = nf.layers.data("h0", [-1, 4])
    >>> ids, final, lengths = nf.layers.dynamic_decode(
    ...     decoder, inits=h0, max_step_num=2, return_length=True)
    >>> feed = {"h0": np.array([[0, 9, 0, 0], [0, 0, 0, 0]], "float32")}
    >>> got, n = nf.Executor().run(feed=feed, fetch_list=[ids, lengths])
    >>> got[:, :, 0].tolist(), n.tolist()      # row 0 ends at once, row 1 keeps choosing 3
    ([[1, 1, 1], [3, 3, 3]], [[1], [3]])
    """
    if max_step_num is not None:
        if not isinstance(max_step_num, numbers.Integral) or max_step_num < 0:
            raise layer_error(
                AttrError,
                "dynamic_decode",
                f"max_step_num must be a non-negative int or None, got {max_step_num!r}",
            )
    parent = current_block()
    initial_inputs, initial_states, initial_finished = decoder.initialize(inits)
    # Fresh variables the loop carries (initialize may return one variable in two places).
    inputs = map_structure(_copy, initial_inputs)
    states = map_structure(_copy, initial_states)
    finished = _copy(initial_finished)
    lengths = append_op("fill_any_like", {"X": finished}, {"value": 0.0, "dtype": "int64"})
    step = nn.fill_constant([1], "int64", 0)
    limit = nn.fill_constant([1], "int64", max_step_num) if max_step_num is not None else None
    cond = _not_all(finished)
    loop = While(cond)
    with loop.block():
        outputs, next_states, next_inputs, next_finished = decoder.step(
            step, inputs, states, **kwargs
        )
        if not decoder.tracks_own_finished:
            next_finished = nn.logical_or(next_finished, finished)
            next_lengths = nn.elementwise_add(lengths, nn.cast(nn.logical_not(finished), "int64"))
            if impute_finished:
                next_states = map_structure(
                    lambda old, new: _keep_finished(finished, old, new), states, next_states
                )
        else:
            next_lengths = getattr(next_states, "lengths", lengths)
        flat_outputs = flatten(outputs)
        arrays = [_new_array(parent, x) for x in flat_outputs]
        for x, array in zip(flat_outputs, arrays):
            array_write(x, step, array)
        nn.increment(step)
        nn.assign(next_finished, output=finished)
        nn.assign(next_lengths, output=lengths)
        for old, new in zip(flatten(inputs), flatten(next_inputs)):
            nn.assign(new, output=old)
        for old, new in zip(flatten(states), flatten(next_states)):
            nn.assign(new, output=old)
        going = _not_all(finished)
        if limit is not None:
            going = nn.logical_and(going, append_op("less_equal", {"X": step, "Y": limit}))
        nn.assign(going, output=cond)
    stacked = [array_to_tensor(array, axis=0) for array in arrays]
    final_outputs = pack_sequence_as(outputs, stacked)
    final_states = states
    try:
        final_outputs, final_states = decoder.finalize(final_outputs, final_states, lengths)
    except NotImplementedError:
        pass
    if not output_time_major:
        final_outputs = map_structure(
            lambda x: nn.transpose(x, [1, 0, *range(2, x.ndim)]), final_outputs
        )
    if return_length:
        return final_outputs, final_states, lengths
    return final_outputs, final_states


__all__ = ["BeamSearchDecoder", "Decoder", "dynamic_decode"]
