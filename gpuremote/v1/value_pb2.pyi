from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Value(_message.Message):
    __slots__ = ("handle", "bool_value", "int_value", "float_value", "complex_value", "str_value", "none", "dtype", "slice", "ellipsis", "tuple", "list", "dict", "array")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    COMPLEX_VALUE_FIELD_NUMBER: _ClassVar[int]
    STR_VALUE_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SLICE_FIELD_NUMBER: _ClassVar[int]
    ELLIPSIS_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    DICT_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    handle: int
    bool_value: bool
    int_value: int
    float_value: float
    complex_value: Complex
    str_value: str
    none: Empty
    dtype: str
    slice: Slice
    ellipsis: Empty
    tuple: Sequence
    list: Sequence
    dict: Mapping
    array: HostArray
    def __init__(self, handle: _Optional[int] = ..., bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., complex_value: _Optional[_Union[Complex, _Mapping]] = ..., str_value: _Optional[str] = ..., none: _Optional[_Union[Empty, _Mapping]] = ..., dtype: _Optional[str] = ..., slice: _Optional[_Union[Slice, _Mapping]] = ..., ellipsis: _Optional[_Union[Empty, _Mapping]] = ..., tuple: _Optional[_Union[Sequence, _Mapping]] = ..., list: _Optional[_Union[Sequence, _Mapping]] = ..., dict: _Optional[_Union[Mapping, _Mapping]] = ..., array: _Optional[_Union[HostArray, _Mapping]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Complex(_message.Message):
    __slots__ = ("real", "imag")
    REAL_FIELD_NUMBER: _ClassVar[int]
    IMAG_FIELD_NUMBER: _ClassVar[int]
    real: float
    imag: float
    def __init__(self, real: _Optional[float] = ..., imag: _Optional[float] = ...) -> None: ...

class Slice(_message.Message):
    __slots__ = ("start", "stop", "step")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    start: Value
    stop: Value
    step: Value
    def __init__(self, start: _Optional[_Union[Value, _Mapping]] = ..., stop: _Optional[_Union[Value, _Mapping]] = ..., step: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class Sequence(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, items: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Mapping(_message.Message):
    __slots__ = ("keys", "values")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class HostArray(_message.Message):
    __slots__ = ("dtype", "shape", "data", "scalar")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SCALAR_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    scalar: bool
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., scalar: _Optional[bool] = ...) -> None: ...

class ArrayMeta(_message.Message):
    __slots__ = ("dtype", "shape")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...
