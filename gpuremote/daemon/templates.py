"""Call templates: a call a loop makes again and again, remembered once and replayed by id.

A training step issues the same few dozen calls every iteration, on new arrays of the same
shapes. The client sends such a call once in full with `Call.define_template`; after that a
`Replay` op names the template and the handles to use (a few integers per call), and the daemon
skips decoding the call, looking up its name and bounding its allocation again: the bound is
kept per shape of the slot arrays, which is all it depends on besides the template's constants.
"""

from __future__ import annotations

from typing import Any

import numpy

from gpuremote._config import DEFAULTS
from gpuremote.errors import ProtocolError
from gpuremote.wire import pb
from gpuremote.wire.codec import decode


class Slot:
    """Where a handle stood in the defining call: the index-th handle, in encoding order."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class Template:
    __slots__ = ("plan", "device", "stream", "site", "args", "kwargs", "slots", "results", "tail", "metas",
                 "need", "op", "direct", "fixed")

    def fill(self, arrays: list) -> tuple[tuple, dict]:
        """The call's (args, kwargs) with `arrays` in its slots."""
        tail = self.tail
        if tail is not None:     # the slots lead the arguments, constants follow: `x + 1`, `a @ b`
            return (*arrays, *tail), self.kwargs
        return _fill(self.args, arrays), {k: _fill(v, arrays) for k, v in self.kwargs.items()}


def _fill(value: Any, arrays: list) -> Any:
    t = type(value)
    if t is Slot:
        return arrays[value.index]
    if t is tuple or t is list:
        return t(_fill(v, arrays) for v in value)
    if t is slice:
        return slice(_fill(value.start, arrays), _fill(value.stop, arrays), _fill(value.step, arrays))
    return value


def set_direct(t: Template, fn) -> None:
    """Make `fn` the template's direct call where the call is fn(*slot arrays, *t.tail, **t.kwargs),
    one call on the arrays with the constants after them (`x + 1`: fn(x, 1)), a function of
    constants alone (`arange(n)`), or an indexing call whose key is slots alone (_indexing);
    otherwise (or with fn None) the template keeps none."""
    if fn is None or not (t.slots or t.plan.kind == "function"):
        return
    if t.tail is None:
        fn = _indexing(t, fn)
        if fn is None:
            return
    t.direct = fn
    # In the order native/replay.c reads it (FX_*).
    t.fixed = (fn, t.slots, t.results, t.device, t.stream, t.tail or (), t.kwargs)


def _indexing(t: Template, fn) -> Any:
    """`x[i, j]` (arguments x, (i, j)) or `x[i, j] = v` (x, (i, j), v), the key's items all slots, as
    one function of the slot arrays that calls fn with the key rebuilt: fn(x, (i, j)[, v]), as the
    filled arguments would. None for any other arguments."""
    args = t.args
    if t.kwargs or len(args) not in (2, 3) or type(args[0]) is not Slot or type(args[1]) is not tuple:
        return None
    key = args[1]
    if not key or any(type(s) is not Slot or s.index != i + 1 for i, s in enumerate(key)):
        return None
    if len(args) == 2:
        return lambda a, *key: fn(a, key)
    value = args[2]
    if type(value) is not Slot:
        return lambda a, *key: fn(a, key, value)
    if value.index != len(key) + 1:
        return None
    return lambda a, *rest: fn(a, rest[:-1], rest[-1])


def _check_constants(value: Any) -> None:
    """Constants are reused by every replay, so they must be immutable: no host arrays, no dicts."""
    t = type(value)
    if t is tuple or t is list:
        for v in value:
            _check_constants(v)
    elif t is slice:
        _check_constants(value.start), _check_constants(value.stop), _check_constants(value.step)
    elif t is dict or isinstance(value, numpy.ndarray):
        raise ProtocolError("a call template's arguments may hold handles, scalars, dtypes, slices and "
                            "tuples or lists of them, not host arrays or dicts")


def define(op: pb.Op, plan, n_devices: int) -> Template:
    """The template op `op` defines (its Call.define_template), checked; raises ProtocolError."""
    call = op.call
    if op.reply:
        raise ProtocolError("only an asynchronous call (reply = false) may define a call template")
    if plan.kind not in ("method", "function", "random") or plan.rule == "value":
        raise ProtocolError(f"{plan.name} cannot be a call template: only array functions and methods can")
    if call.ByteSize() > DEFAULTS.max_template_bytes:
        raise ProtocolError(f"a call template is at most {DEFAULTS.max_template_bytes} bytes encoded; "
                            f"this {plan.name} call is {call.ByteSize()}")
    if len(call.kwarg_names) != len(call.kwarg_values) or len(set(call.kwarg_names)) != len(call.kwarg_names):
        raise ProtocolError("malformed call: kwarg_names and kwarg_values do not pair up uniquely")
    if op.device >= n_devices:
        raise ProtocolError(f"a call template names device {op.device}; this daemon has {n_devices}")
    slots: list[Slot] = []

    def slot(handle: int) -> Slot:
        s = Slot(len(slots))
        slots.append(s)
        return s

    t = Template()
    t.plan = plan
    t.device, t.stream, t.site = op.device, op.stream, op.site[:512]
    t.args = tuple(decode(v, slot) for v in call.args)
    t.kwargs = {k: decode(v, slot) for k, v in zip(call.kwarg_names, call.kwarg_values)}
    _check_constants(t.args)
    _check_constants(list(t.kwargs.values()))
    t.slots = len(slots)
    t.results = len(call.results)
    # Slots that are the first positional arguments, in order, and nothing else: filled by joining.
    leading = len(t.args) >= t.slots \
        and all(type(a) is Slot and a.index == i for i, a in enumerate(t.args[:t.slots])) \
        and not any(type(a) is Slot for a in t.args[t.slots:])
    t.tail = t.args[t.slots:] if leading else None
    t.metas = None          # the slot arrays' [(shape, dtype)] the bound `need` was computed for
    t.need = 0
    t.op = pb.Op(device=op.device, stream=op.stream, site=t.site)   # what _invoke reads of an op
    t.op.call.name = plan.name
    t.direct = None
    t.fixed = None          # set with `direct`: what the compiled replay loop reads (native/replay.c)
    return t
