"""nf.layers: build programs by appending ops (the catalogue users expect)."""

from nestflow.layers import initializer, variable_ops
from nestflow.layers.attention import *  # noqa: F403
from nestflow.layers.attention import __all__ as _attention_all
from nestflow.layers.cond import *  # noqa: F403
from nestflow.layers.cond import __all__ as _cond_all
from nestflow.layers.control_flow import *  # noqa: F403
from nestflow.layers.control_flow import __all__ as _control_flow_all
from nestflow.layers.crf import *  # noqa: F403
from nestflow.layers.crf import __all__ as _crf_all
from nestflow.layers.decode import *  # noqa: F403
from nestflow.layers.decode import __all__ as _decode_all
from nestflow.layers.initializer import ParamAttr
from nestflow.layers.learning_rate_scheduler import *  # noqa: F403
from nestflow.layers.learning_rate_scheduler import __all__ as _lr_all
from nestflow.layers.loss import *  # noqa: F403
from nestflow.layers.loss import __all__ as _loss_all
from nestflow.layers.math import *  # noqa: F403
from nestflow.layers.math import __all__ as _math_all
from nestflow.layers.nn import *  # noqa: F403
from nestflow.layers.nn import __all__ as _nn_all
from nestflow.layers.norm import *  # noqa: F403
from nestflow.layers.norm import __all__ as _norm_all
from nestflow.layers.rnn import RNN
from nestflow.layers.rnn_cells import *  # noqa: F403
from nestflow.layers.rnn_cells import __all__ as _rnn_cells_all
from nestflow.layers.rnn_layers import *  # noqa: F403
from nestflow.layers.rnn_layers import __all__ as _rnn_layers_all
from nestflow.layers.sequence import *  # noqa: F403
from nestflow.layers.sequence import __all__ as _sequence_all
from nestflow.layers.sequence_nn import *  # noqa: F403
from nestflow.layers.sequence_nn import __all__ as _sequence_nn_all
from nestflow.layers.tensor import *  # noqa: F403
from nestflow.layers.tensor import __all__ as _tensor_all
from nestflow.layers.vision import *  # noqa: F403
from nestflow.layers.vision import __all__ as _vision_all

variable_ops.install()


def _export_checked() -> None:
    """Every layer function nf.layers exports turns a bare Python error that bad arguments
    cause into an nf.errors error (helper.public_layer); layers calling each other inside
    nestflow use the unwrapped functions."""
    import inspect

    from nestflow.layers.helper import public_layer

    names = globals()
    for name in __all__:
        value = names.get(name)
        if inspect.isfunction(value):
            names[name] = public_layer(value)


__all__ = [
    "RNN",
    "ParamAttr",
    "initializer",
    *_nn_all,
    *_control_flow_all,
    *_vision_all,
    *_norm_all,
    *_math_all,
    *_loss_all,
    *_tensor_all,
    *_lr_all,
    *_rnn_cells_all,
    *_rnn_layers_all,
    *_sequence_all,
    *_sequence_nn_all,
    *_cond_all,
    *_decode_all,
    *_crf_all,
    *_attention_all,
]
_export_checked()


def __getattr__(name: str):
    from nestflow.errors import UnknownNameError, suggest_names

    raise UnknownNameError(
        f"nf.layers has no layer '{name}'{suggest_names(name, __all__)}; the catalogue is "
        "listed by dir(nf.layers) and in the layer reference of the docs"
    )
