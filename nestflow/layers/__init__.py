"""nf.layers: build programs by appending ops (the catalogue users expect)."""

from nestflow.layers import initializer, variable_ops
from nestflow.layers.control_flow import *  # noqa: F403
from nestflow.layers.control_flow import __all__ as _control_flow_all
from nestflow.layers.initializer import ParamAttr
from nestflow.layers.nn import *  # noqa: F403
from nestflow.layers.nn import __all__ as _nn_all
from nestflow.layers.rnn import RNN

variable_ops.install()

__all__ = ["RNN", "ParamAttr", "initializer", *_nn_all, *_control_flow_all]
