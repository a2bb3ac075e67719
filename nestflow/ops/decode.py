"""gather_tree: the full sequences of a beam search, backtracked from the last step through each
step's parent beams (Fluid 1.7's gather_tree op; used by BeamSearchDecoder.finalize)."""

from __future__ import annotations

from nestflow.errors import DTypeError, ShapeError
from nestflow.ops.indexing import check_index_range
from nestflow.ops.registry import VarInfo, register_op


@register_op
class gather_tree:
    """Out[t, b, k] = Ids[t, b, p_t] where p_{T-1} = k and p_{t-1} = Parents[t, b, p_t]: the
    token at step t of the beam that ends as beam k. Ids and Parents are int32/int64 of one
    shape [T, batch, beam]; a parent outside [0, beam) is an ExecutionError at run time."""

    inputs = ("Ids", "Parents")
    outputs = ("Out",)

    def infer(Ids: VarInfo, Parents: VarInfo) -> VarInfo:
        for slot, info in (("Ids", Ids), ("Parents", Parents)):
            if info.dtype not in ("int32", "int64"):
                raise DTypeError(f"{slot} must be int32 or int64, got {info.dtype}")
            if info.ndim != 3:
                raise ShapeError(
                    f"{slot} must be [max_time, batch, beam_size], got {list(info.shape)}"
                )
        if Ids.dtype != Parents.dtype:
            raise DTypeError(f"Ids is {Ids.dtype} but Parents is {Parents.dtype}")
        if any(a != b and -1 not in (a, b) for a, b in zip(Ids.shape, Parents.shape)):
            raise ShapeError(
                f"Ids {list(Ids.shape)} and Parents {list(Parents.shape)} must have one shape"
            )
        return Ids

    def forward(Ids, Parents, xp, device):
        if Ids.shape != Parents.shape:
            raise ShapeError(
                f"Ids {list(Ids.shape)} and Parents {list(Parents.shape)} must have one shape"
            )
        steps, batch, beam = Ids.shape
        # One host read the op needs: CuPy wraps an out-of-range parent where nestflow raises.
        if bool(((Parents < 0) | (Parents >= beam)).any()):
            check_index_range(device.to_host(Parents), beam, "gather_tree: Parents")
        out = xp.empty_like(Ids)
        rows = xp.arange(batch)[:, None]
        beams = xp.broadcast_to(xp.arange(beam, dtype=Parents.dtype), (batch, beam))
        for t in range(steps - 1, -1, -1):
            out[t] = Ids[t, rows, beams]
            beams = Parents[t, rows, beams]
        return out
