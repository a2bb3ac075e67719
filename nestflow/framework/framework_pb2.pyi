from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VarType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOD_TENSOR: _ClassVar[VarType]
    STEP_SCOPES: _ClassVar[VarType]
    TENSOR_ARRAY: _ClassVar[VarType]
    RAW: _ClassVar[VarType]
    SELECTED_ROWS: _ClassVar[VarType]
LOD_TENSOR: VarType
STEP_SCOPES: VarType
TENSOR_ARRAY: VarType
RAW: VarType
SELECTED_ROWS: VarType

class VarDesc(_message.Message):
    __slots__ = ("name", "type", "dtype", "shape", "persistable", "stop_gradient", "is_parameter", "trainable", "is_sequence", "lengths_var")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    PERSISTABLE_FIELD_NUMBER: _ClassVar[int]
    STOP_GRADIENT_FIELD_NUMBER: _ClassVar[int]
    IS_PARAMETER_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    IS_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_VAR_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: VarType
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    persistable: bool
    stop_gradient: bool
    is_parameter: bool
    trainable: bool
    is_sequence: bool
    lengths_var: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[VarType, str]] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., persistable: _Optional[bool] = ..., stop_gradient: _Optional[bool] = ..., is_parameter: _Optional[bool] = ..., trainable: _Optional[bool] = ..., is_sequence: _Optional[bool] = ..., lengths_var: _Optional[str] = ...) -> None: ...

class Attr(_message.Message):
    __slots__ = ("i", "f", "s", "b", "ints", "floats", "strings", "bools", "block_idx", "blocks_idx")
    I_FIELD_NUMBER: _ClassVar[int]
    F_FIELD_NUMBER: _ClassVar[int]
    S_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    INTS_FIELD_NUMBER: _ClassVar[int]
    FLOATS_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    BOOLS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDX_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_IDX_FIELD_NUMBER: _ClassVar[int]
    i: int
    f: float
    s: str
    b: bool
    ints: IntList
    floats: FloatList
    strings: StringList
    bools: BoolList
    block_idx: int
    blocks_idx: IntList
    def __init__(self, i: _Optional[int] = ..., f: _Optional[float] = ..., s: _Optional[str] = ..., b: _Optional[bool] = ..., ints: _Optional[_Union[IntList, _Mapping]] = ..., floats: _Optional[_Union[FloatList, _Mapping]] = ..., strings: _Optional[_Union[StringList, _Mapping]] = ..., bools: _Optional[_Union[BoolList, _Mapping]] = ..., block_idx: _Optional[int] = ..., blocks_idx: _Optional[_Union[IntList, _Mapping]] = ...) -> None: ...

class IntList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class FloatList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class StringList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class BoolList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, values: _Optional[_Iterable[bool]] = ...) -> None: ...

class OpDesc(_message.Message):
    __slots__ = ("type", "inputs", "outputs", "attrs", "source")
    class Slot(_message.Message):
        __slots__ = ("parameter", "arguments")
        PARAMETER_FIELD_NUMBER: _ClassVar[int]
        ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
        parameter: str
        arguments: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, parameter: _Optional[str] = ..., arguments: _Optional[_Iterable[str]] = ...) -> None: ...
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Attr
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Attr, _Mapping]] = ...) -> None: ...
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    type: str
    inputs: _containers.RepeatedCompositeFieldContainer[OpDesc.Slot]
    outputs: _containers.RepeatedCompositeFieldContainer[OpDesc.Slot]
    attrs: _containers.MessageMap[str, Attr]
    source: str
    def __init__(self, type: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[OpDesc.Slot, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[OpDesc.Slot, _Mapping]]] = ..., attrs: _Optional[_Mapping[str, Attr]] = ..., source: _Optional[str] = ...) -> None: ...

class BlockDesc(_message.Message):
    __slots__ = ("idx", "parent_idx", "vars", "ops", "forward_block_idx")
    IDX_FIELD_NUMBER: _ClassVar[int]
    PARENT_IDX_FIELD_NUMBER: _ClassVar[int]
    VARS_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_BLOCK_IDX_FIELD_NUMBER: _ClassVar[int]
    idx: int
    parent_idx: int
    vars: _containers.RepeatedCompositeFieldContainer[VarDesc]
    ops: _containers.RepeatedCompositeFieldContainer[OpDesc]
    forward_block_idx: int
    def __init__(self, idx: _Optional[int] = ..., parent_idx: _Optional[int] = ..., vars: _Optional[_Iterable[_Union[VarDesc, _Mapping]]] = ..., ops: _Optional[_Iterable[_Union[OpDesc, _Mapping]]] = ..., forward_block_idx: _Optional[int] = ...) -> None: ...

class ProgramDesc(_message.Message):
    __slots__ = ("blocks", "random_seed", "version")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RANDOM_SEED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockDesc]
    random_seed: int
    version: int
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockDesc, _Mapping]]] = ..., random_seed: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class NetDesc(_message.Message):
    __slots__ = ("model_type", "ops", "vars", "step_ops", "inlinks", "outlinks", "states", "pre_states", "boot_states", "step_count_from")
    class ModelType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PLAIN: _ClassVar[NetDesc.ModelType]
        RECURRENT: _ClassVar[NetDesc.ModelType]
    PLAIN: NetDesc.ModelType
    RECURRENT: NetDesc.ModelType
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    VARS_FIELD_NUMBER: _ClassVar[int]
    STEP_OPS_FIELD_NUMBER: _ClassVar[int]
    INLINKS_FIELD_NUMBER: _ClassVar[int]
    OUTLINKS_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    PRE_STATES_FIELD_NUMBER: _ClassVar[int]
    BOOT_STATES_FIELD_NUMBER: _ClassVar[int]
    STEP_COUNT_FROM_FIELD_NUMBER: _ClassVar[int]
    model_type: NetDesc.ModelType
    ops: _containers.RepeatedCompositeFieldContainer[OpDesc]
    vars: _containers.RepeatedCompositeFieldContainer[VarDesc]
    step_ops: _containers.RepeatedCompositeFieldContainer[OpDesc]
    inlinks: _containers.RepeatedScalarFieldContainer[str]
    outlinks: _containers.RepeatedScalarFieldContainer[str]
    states: _containers.RepeatedScalarFieldContainer[str]
    pre_states: _containers.RepeatedScalarFieldContainer[str]
    boot_states: _containers.RepeatedScalarFieldContainer[str]
    step_count_from: str
    def __init__(self, model_type: _Optional[_Union[NetDesc.ModelType, str]] = ..., ops: _Optional[_Iterable[_Union[OpDesc, _Mapping]]] = ..., vars: _Optional[_Iterable[_Union[VarDesc, _Mapping]]] = ..., step_ops: _Optional[_Iterable[_Union[OpDesc, _Mapping]]] = ..., inlinks: _Optional[_Iterable[str]] = ..., outlinks: _Optional[_Iterable[str]] = ..., states: _Optional[_Iterable[str]] = ..., pre_states: _Optional[_Iterable[str]] = ..., boot_states: _Optional[_Iterable[str]] = ..., step_count_from: _Optional[str] = ...) -> None: ...
