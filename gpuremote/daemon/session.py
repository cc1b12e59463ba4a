"""One client session on the daemon: its handle table, memory, streams, events and op execution.

Ops arrive in order and run in order. An op that fails does not stop the stream: its error
is kept (bounded) and reported at the client's next sync point, and the handles it should
have produced are poisoned, so ops that use them fail with the same original error instead
of a confusing second one. All memory is accounted by buffer owner (views share their
owner's bytes) and handed back to the device ledger when the session closes.
"""

from __future__ import annotations

import itertools
import math
import os
import time
import traceback
from typing import Any, Callable, Iterator

import numpy

from gpuremote._config import DEFAULTS
from gpuremote.daemon import growth, native, templates
from gpuremote.daemon.admission import Tenancy
from gpuremote.daemon.backends.base import Backend
from gpuremote.daemon.ledger import SessionCap
from gpuremote.daemon.scheduler import Hold
from gpuremote.errors import (LimitExceededError, ProtocolError, UnsupportedOperationError,
                              wire_type_name)
from gpuremote.meta import NOT_ARRAY, RANDOM_GENERATOR, array_method, derive, without_generator
from gpuremote.surface import PROPERTIES, SURFACE, is_service
from gpuremote.transport import buffers, grpc_chunks
from gpuremote.wire import pb
from gpuremote.wire.codec import ARRAY_KINDS, checked_shape, decode, dtype_from_wire, encode, fill_array

_STRICT_META = os.environ.get("GPUREMOTE_STRICT_META") == "1"

_compiled = native.replay     # the compiled replay loop (native/replay.c), or None where not built


def replay_loop(backend: Backend) -> str:
    """Which loop runs replayed calls on `backend`: "compiled" or why the Python one (start-up line)."""
    if _compiled is None:
        return "Python (gpuremote._replay was not built: no C compiler at install?)"
    if not DEFAULTS.native:
        return "Python (GPUREMOTE_NATIVE=0)"
    if backend.scoped:
        return "Python (the backend makes its device current per call)"
    return "compiled"


class _Plan:
    """What the daemon needs to know of a surface name to run it, looked up once per name.

    `fast` marks elementwise names of one result, run by Session._fast_call when their arguments
    are plain (handles and numbers): `method` is the ndarray method's name, or None for a module
    function (resolved by the backend). `kind` is how Session._invoke runs it (_dispatch_kind)."""

    __slots__ = ("name", "entry", "rule", "kind", "fast", "method")

    def __init__(self, name: str, entry):
        self.name = name
        self.entry = entry
        self.rule = entry.rule
        self.kind = _dispatch_kind(name, entry)
        self.fast = entry.rule == "elementwise" and entry.nout == 1 and name != "where" and \
            self.kind in ("method", "function")
        self.method = entry.attr if self.kind == "method" else None


_PLANS: dict[str, _Plan] = {}


def _dispatch_kind(name: str, entry) -> str:
    """How the daemon runs a surface name: a service of its own, an array method, a random
    generator call, or a function of the backend's array module."""
    if is_service(name):
        return "service"
    if name.startswith("ndarray."):
        return "method"
    if name.startswith("random."):
        return "random"
    return "function"
_ids = itertools.count(1)


class Poisoned(Exception):
    """An op used a handle whose producing op failed; carries that op's error."""

    def __init__(self, error: pb.Error):
        super().__init__(error.message)
        self.error = error


class Session:
    def __init__(self, backend: Backend, opened: pb.OpenSession, limits: pb.Limits, tenancy: Tenancy | None = None):
        self.id = f"s{next(_ids)}-{os.getpid()}"
        self.backend = backend
        # What the session may use (gpuremote/daemon/admission.py): per device a memory ledger
        # (the device's own, or its lease's under a pool grant) and a compute-scheduler flow
        # (None for a device it has no grant for).
        self.tenancy = tenancy if tenancy is not None else Tenancy.whole(backend, self.id)
        self.memory = list(self.tenancy.memory)    # the tenancy's ledgers, or a cap this session set over one
        self.flows = self.tenancy.flows
        self.lease_id = self.tenancy.lease_id
        self.cancel: Callable[[], object] = lambda: None   # set by the server: ends the session's stream
        self.bytes_h2d = 0
        self.bytes_d2h = 0
        self.client = opened
        self.limits = limits
        self._max_handles, self._max_rank = limits.max_handles, limits.max_rank   # read per op: plain ints
        self.started = time.monotonic()
        self.ops = 0
        self.handles: dict[int, Any] = {}
        self.poisoned: dict[int, pb.Error] = {}
        self._handle_owner: dict[int, int] = {}
        self._owners: dict[int, list] = {}      # id(owner) -> [owner, refcount, nbytes, device]
        self.memory_used = [0] * len(backend.props)
        self.memory_peak = [0] * len(backend.props)    # the most memory_used has been (session.memory_peak)
        self._deferred: list[pb.Error] = []
        self._dropped = 0
        self.streams: dict = {}
        self._events: dict[int, Any] = {}
        self._random: dict[tuple[int, int], Any] = {}     # (device, generator id) -> RandomState
        self._generators: dict[tuple[int, int], Any] = {}     # (device, generator id) -> Generator
        self._kernels: dict = {}
        self._chunks_taken = False   # whether the current upload op has read its chunks
        self._bulk = None            # bulk-byte adapter of a data-plane connection (daemon/dataplane.py)
        self._functions: dict[str, Callable] = {}     # backend functions resolved (_function)
        self._templates: dict[int, templates.Template] = {}   # call templates by id (daemon/templates.py)
        self._array_type, self._scoped = backend.array_type, backend.scoped    # read per op
        # The compiled replay loop runs plain replayed calls (native/replay.c says which) where the
        # backend needs no device context per call; what it reads of the session, fetched once.
        self._compiled = None
        if replay_loop(backend) == "compiled":
            self._compiled = _compiled.replay
            self._compiled_state = (self.handles, self.poisoned, self._handle_owner, self._owners, self.memory,
                                    self.memory_used, self.memory_peak, self.flows, self._templates, self._array_type,
                                    limits.max_ops_per_batch, self._max_handles, self._max_rank, ARRAY_KINDS,
                                    None if backend.owner_by_base else backend.owner,
                                    self._check_replay if _STRICT_META else None, backend.xp.asarray)
        # Shutdown (daemon/server.py drain): the monotonic time by which the session will be ended,
        # told to the client in every reply; then `ending`, the reason, ends it between two ops.
        self.drain_deadline: float | None = None
        self.ending: str | None = None

    # -- handles and memory ---------------------------------------------------------------
    def _resolve(self, handle: int) -> Any:
        arr = self.handles.get(handle)
        if arr is None:
            err = self.poisoned.get(handle)
            if err is not None:
                raise Poisoned(err)
            raise KeyError(f"unknown handle {handle}: no such array in this session")
        return arr

    def _decode_arg(self, v):
        kind = v.WhichOneof("kind")
        if kind == "handle":
            return self._resolve(v.handle)
        if kind == "float_value":
            return v.float_value
        if kind == "int_value":
            return v.int_value
        return decode(v, self._resolve)

    def _meta_of(self, obj):
        if self.backend.is_array(obj) or isinstance(obj, numpy.ndarray):
            return tuple(obj.shape), obj.dtype
        return NOT_ARRAY

    def _bind(self, handles, arrays, device: int) -> None:
        """Bind arrays to new handles, all or nothing (an OOM unbinds what this call bound)."""
        done = []
        try:
            for h, arr in zip(handles, arrays):
                self._bind_one(h, arr, device)
                done.append(h)
        except BaseException:
            for h in done:
                self._release(h)
            raise

    def _bind_one(self, h: int, arr, device: int) -> None:
        table = self.handles
        if h == 0 or h in table or h in self.poisoned:
            raise ProtocolError(f"handle {h} is already in use or reserved")
        if len(table) >= self._max_handles:
            raise LimitExceededError(f"session holds {len(table)} arrays, the limit is "
                                     f"{self._max_handles}: free arrays you no longer need")
        if arr.dtype.kind not in ARRAY_KINDS:  # e.g. zeros(3, dtype='U3') on the NumPy backend
            raise TypeError(f"dtype {arr.dtype} is not supported on the device: use bool, integer, "
                            "float or complex")
        if arr.ndim > self._max_rank:
            raise LimitExceededError(f"array rank {arr.ndim} exceeds the limit of {self._max_rank}")
        owner, nbytes = self.backend.owner(arr)
        key = id(owner)
        rec = self._owners.get(key)
        if rec is None:
            self.memory[device].charge(nbytes)
            self._owners[key] = [owner, 1, nbytes, device]
            used = self.memory_used[device] = self.memory_used[device] + nbytes
            if used > self.memory_peak[device]:
                self.memory_peak[device] = used
        else:
            rec[1] += 1
        table[h] = arr
        self._handle_owner[h] = key

    def _room(self, device: int) -> int:
        """Bytes the session may still allocate on `device`: its ledger's (a lease's) and the device's."""
        memory, whole = self.memory[device], self.backend.memory[device]
        return min(memory.capacity - memory.used, whole.capacity - whole.used)

    def _release(self, handle: int) -> None:
        if self.poisoned.pop(handle, None) is not None:
            return
        if self.handles.pop(handle, None) is None:
            raise KeyError(f"release of unknown handle {handle}")
        key = self._handle_owner.pop(handle)
        rec = self._owners[key]
        rec[1] -= 1
        if rec[1] == 0:
            del self._owners[key]
            self.memory[rec[3]].credit(rec[2])
            self.memory_used[rec[3]] -= rec[2]

    def close(self) -> None:
        """Free everything the session holds."""
        for key, (owner, _, nbytes, device) in list(self._owners.items()):
            self.memory[device].credit(nbytes)
        self._owners.clear()
        self.handles.clear()
        self._handle_owner.clear()
        self.poisoned.clear()
        self.memory_used[:] = [0] * len(self.memory_used)    # in place: the compiled loop holds the list
        self.streams.clear()
        self._events.clear()
        self._kernels.clear()
        self._templates.clear()     # a template may hold a bound method of this session (_getitem)
        self.tenancy.close()

    # -- ops ------------------------------------------------------------------------------
    def run_batch(self, batch: pb.OpBatch, next_message: Callable[[], pb.ClientMessage],
                  bulk=None) -> Iterator[pb.ServerMessage]:
        # bulk: None on the gRPC stream (Chunk messages); a data-plane connection's adapter otherwise.
        self._bulk = bulk
        if len(batch.ops) > self.limits.max_ops_per_batch:
            yield from self._refuse_batch(batch, next_message)
            return
        async_call = self._async_call
        for op in batch.ops:
            if self.ending is not None:     # the daemon is shutting down: stop between two ops
                raise SessionEnded(self.ending)
            kind = op.WhichOneof("kind")
            if op.reply:
                if self.quiet():
                    reply = self._quiet(op, kind)   # the common sync points, answered directly
                    if reply is not None:
                        yield reply
                        continue
                yield from self.run_op(op, next_message)
            elif kind == "call":
                async_call(op)              # the hot path: no reply, so no generator either
            elif kind == "replay":
                self._async_replay(op)
            else:
                yield from self.run_op(op, next_message)

    def _quiet(self, op: pb.Op, kind: str) -> pb.ServerMessage | None:
        """run_op's reply to a sync, or to a fetch of a small contiguous array, on a usable device
        when there is nothing else to report; None when the op is not that simple (run_op then
        answers it, errors included)."""
        if kind == "sync":
            done = self.quiet_sync(op.device, op.stream, op.sync.all_streams)
            host = None
        elif kind == "fetch":
            host = self.quiet_fetch(op.device, op.stream, op.fetch.handle, self._inline_bytes())
            done = host is not None
        else:
            return None
        if not done:
            return None
        reply = pb.ServerMessage()
        r = reply.reply
        r.seq = op.seq
        if host is None:
            r.value.none.SetInParent()
        else:
            fill_array(r.value.array, host)
        return reply

    def quiet(self) -> bool:
        """Whether a sync point may be answered with its outcome alone: no deferred errors, no
        shutdown notice, no end under way."""
        return not self._deferred and not self._dropped and self.drain_deadline is None and self.ending is None

    def quiet_sync(self, device: int, stream: int, all_streams: bool) -> bool:
        """Run a sync that needs no reply beyond "done" (the caller checked `quiet`); False when the
        op is not that simple: run_op must answer it, errors included."""
        if device >= len(self.flows) or self.flows[device] is None:
            return False
        try:
            self.backend.synchronize(device, None if all_streams else stream, self.streams)
        except Exception:
            return False
        self.ops += 1
        return True

    def quiet_fetch(self, device: int, stream: int, handle: int, limit: int) -> numpy.ndarray | None:
        """The C-contiguous host copy of a contiguous array of at most `limit` bytes, for a reply
        that carries it alone; None when the fetch is not that simple (run_op answers it)."""
        if device >= len(self.flows) or self.flows[device] is None:
            return None
        arr = self.handles.get(handle)
        if arr is None or not arr.flags.c_contiguous or arr.nbytes > limit:
            return None
        try:
            host = self._on_device(device, stream, lambda: numpy.asarray(self.backend.to_host(arr), order="C"))
        except Exception:
            return None
        self.ops += 1
        self.bytes_d2h += host.nbytes
        return host

    def _refuse_batch(self, batch: pb.OpBatch, next_message) -> Iterator[pb.ServerMessage]:
        """Run none of an oversized batch, but answer it: every op that wants a reply gets the error
        (a client waiting on one must not hang), results are poisoned, and upload chunks are skipped."""
        err = pb.Error(type="gpuremote.LimitExceededError", op="batch",
                       message=f"batch of {len(batch.ops)} ops exceeds the limit of "
                               f"{self.limits.max_ops_per_batch}; none of it was run: send at most "
                               f"{self.limits.max_ops_per_batch} ops per OpBatch (SessionOpened.limits)")
        replied = False
        for op in batch.ops:
            if op.WhichOneof("kind") == "upload":
                self._discard_chunks(op, next_message)
            self._poison(op, err)
            if op.reply:
                reply = pb.ServerMessage()
                reply.reply.seq = op.seq
                reply.reply.error.CopyFrom(err)
                reply.reply.error.seq = op.seq
                reply.reply.deferred_errors.extend(self._deferred)
                reply.reply.dropped_errors = self._dropped
                self._deferred.clear()
                self._dropped = 0
                replied = True
                yield reply
        if not replied:
            self._defer(err)

    def _async_call(self, op: pb.Op) -> None:
        """A call without a reply: its failure poisons its results and waits for the next sync point."""
        self.ops += 1
        try:
            if op.call.define_template:
                self._define(op)
            if not self._fast_call(op):
                self._call(op)
        except _StreamBroken:
            raise
        except Poisoned as exc:
            self._poison(op, exc.error)
        except Exception as exc:
            err = self._error(op, exc)
            self._poison(op, err)
            self._defer(err)

    # -- call templates (daemon/templates.py) ---------------------------------------------------
    def _define(self, op: pb.Op) -> None:
        """Remember op's call as template Call.define_template (before the call itself runs)."""
        tid = op.call.define_template
        self._templates.pop(tid, None)      # a refused redefinition leaves no stale template behind
        if tid > self.limits.max_templates:
            raise ProtocolError(f"call template id {tid} is past this session's limit of "
                                f"{self.limits.max_templates} (SessionOpened.limits.max_templates)")
        plan = self._plan(op.call.name)
        if op.call.results and plan.rule in ("none", "self", "value"):
            raise ProtocolError(f"{plan.name} returns no array, but the op names result handles")
        t = templates.define(op, plan, len(self.backend.props))
        templates.set_direct(t, self._direct_callable(plan))
        self._templates[tid] = t

    def _direct_callable(self, plan: _Plan) -> Callable | None:
        """What _invoke would call for `plan` with the arrays first (an array method, unbound, a
        property's getter, _getitem, or a backend function); None for random and services."""
        if plan.kind == "method":
            attr = plan.entry.attr
            if attr == "__getitem__":
                return self._getitem
            found = getattr(self._array_type, attr, None)   # None for the FUNCTION_METHODS (meta.array_method)
            if attr in PROPERTIES:      # `x.T`: the descriptor's getter, called on the array
                return getattr(found, "__get__", None)
            return found
        if plan.kind == "function":
            try:
                return self._function(plan.name)
            except Exception:   # _invoke raises it, as the op's own error, when the template is replayed
                return None
        return None

    def _async_replay(self, op: pb.Op) -> None:
        """A Replay op that wants no reply: a malformed one is reported at the next sync point."""
        try:
            self._replay(op)
        except _StreamBroken:
            raise
        except Exception as exc:
            self._defer(self._error(op, exc))

    def _replay(self, op: pb.Op) -> None:
        """Run the calls of a Replay op in order; each fails (poisons, defers) on its own, as a Call.
        A template id this session has not defined, or a run that ends inside a call, stops the run."""
        calls = list(op.replay.calls)
        hold = Hold(self.streams)
        try:
            self._run_replay(op, calls, hold)
        finally:
            hold.drop()

    def _run_replay(self, op: pb.Op, calls: list, hold: Hold) -> None:
        found = self._templates.get
        limit = self.limits.max_ops_per_batch
        compiled = self._compiled
        n, i, count = len(calls), 0, 0
        bad_release = False
        while i < n:
            if compiled is not None:
                # The compiled loop runs the releases and plain calls it can (native/replay.c), with
                # the same effects as the code below, and stops before the first it leaves to it.
                i, count = compiled(self, self._compiled_state, op, calls, i, count, hold)
                if i >= n:
                    break
            if self.ending is not None:
                raise SessionEnded(self.ending)
            tid = calls[i]
            if tid == 0:            # a release: the next integer is the handle
                if i + 1 == n:
                    raise ProtocolError("the Replay op ends inside a release (id 0 and no handle)")
                try:
                    self._release(calls[i + 1])
                except KeyError as exc:     # reported once per run: a broken client may send millions
                    if bad_release:
                        self._dropped += 1
                    else:
                        bad_release = True
                        self._defer(self._error_at("release", op.seq + count, "", exc))
                i += 2
                continue
            t = found(tid)
            if t is None:
                raise ProtocolError(f"replayed call {count} names call template {calls[i]}, which this "
                                    "session has not defined; the rest of the Replay op was not run")
            j = i + 1 + t.slots
            k = j + t.results
            if k > n:
                raise ProtocolError(f"the Replay op ends inside call {count} (template {calls[i]} takes "
                                    f"{t.slots} handle(s) and {t.results} result(s))")
            if count >= limit:
                raise LimitExceededError(f"a Replay op holds more than {limit} calls "
                                         "(SessionOpened.limits.max_ops_per_batch); the rest was not run")
            results = calls[j:k]
            self.ops += 1
            try:
                self._replay_call(t, calls[i + 1:j], results, hold)
            except Exception as exc:
                self._replay_failed(op, t, results, count, exc)
            hold.call_done()
            count += 1
            i = k

    def _replay_failed(self, op: pb.Op, t: templates.Template, results: list, count: int, exc: Exception) -> None:
        """Replayed call `count` of `op` raised `exc`: poison its results and report it at the next sync."""
        if isinstance(exc, _StreamBroken):
            raise exc
        if isinstance(exc, Poisoned):
            self._poison_handles(results, exc.error)
            return
        err = self._error_at(t.plan.name, op.seq + count, t.site, exc)
        self._poison_handles(results, err)
        self._defer(err)

    def _replay_call(self, t: templates.Template, handles: list, results: list, hold: Hold) -> None:
        table = self.handles
        try:
            arrays = [table[h] for h in handles]
        except KeyError:
            arrays = [self._resolve(h) for h in handles]    # raises Poisoned, or names the handle
        metas = [(a.shape, a.dtype) for a in arrays]
        if metas != t.metas:        # the bound depends on nothing else that can change
            args, kwargs = t.fill(arrays)
            t.need = growth.bound(t.plan.entry, args, kwargs, self._meta_of)
            t.metas = metas
        device = t.device
        flow = self.flows[device]
        if flow is None:
            raise self.tenancy.not_granted(device)
        if t.need:
            self.memory[device].check(t.need)
        hold.take(flow, t.stream)
        direct = t.direct
        if direct is not None and (not arrays or type(arrays[0]) is self._array_type):
            # The call as one Python call on the arrays (templates.set_direct): no argument list to fill,
            # no dispatch on the surface name. Same function, same arguments as _invoke's.
            result = self._on_device(device, t.stream, direct, *arrays, *(t.tail or ()), **t.kwargs)
            if result is NotImplemented:
                raise TypeError(f"unsupported operand type(s) for {t.plan.entry.attr}")
            if not results:     # in place (`w -= lr * g`): nothing to bind
                return
            if len(results) == 1 and type(result) is self._array_type:
                if _STRICT_META:
                    self._check_replay(t, arrays, result)
                self._bind_one(results[0], result, device)
                return
            self._bind_replayed(t, arrays, result, results)
            return
        args, kwargs = t.fill(arrays)
        result = self._on_device(device, t.stream, self._invoke, t.plan, args, kwargs, t.op)
        self._bind_result(t.plan, result, results, device, args, kwargs)

    def _check_replay(self, t: templates.Template, arrays: list, result) -> None:
        """GPUREMOTE_STRICT_META: the metadata the client derived for a replayed call, checked."""
        self._check_meta(t.plan.entry, *t.fill(arrays), [result])

    def _bind_replayed(self, t: templates.Template, arrays: list, result, results: list) -> None:
        """Bind what a direct call returned other than one array (a NumPy scalar: a 0-d array), as _invoke's."""
        self._bind_result(t.plan, result, results, t.device, *t.fill(arrays))

    def run_op(self, op: pb.Op, next_message) -> Iterator[pb.ServerMessage]:
        kind = op.WhichOneof("kind")
        if kind == "call" and not op.reply:
            self._async_call(op)
            return
        self.ops += 1
        reply = pb.ServerMessage()
        r = reply.reply
        r.seq = op.seq
        extra: Iterator[pb.ServerMessage] = iter(())
        self._chunks_taken = False
        try:
            if op.device >= len(self.backend.props):
                raise ValueError(f"device {op.device} does not exist: this daemon has "
                                 f"{len(self.backend.props)} device(s)")
            if self.flows[op.device] is None and kind != "release":   # releases name device 0 whatever
                raise self.tenancy.not_granted(op.device)
            if kind == "call":
                if op.call.define_template:
                    self._define(op)        # refused: a template is an asynchronous call
                value = self._call(op)
                if op.reply:
                    encode(value, r.value, lambda obj: None)
            elif kind == "release":
                for h in op.release.handles:
                    self._release(h)
            elif kind == "upload":
                self._upload(op, next_message)
            elif kind == "fetch":
                extra = self._fetch(op, r)
            elif kind == "describe":
                arr = self._resolve(op.describe.handle)
                r.meta.dtype = arr.dtype.str
                r.meta.shape.extend(arr.shape)
            elif kind == "replay":
                self._replay(op)
            elif kind == "sync":
                self.backend.synchronize(op.device, None if op.sync.all_streams else op.stream, self.streams)
                r.value.none.SetInParent()
            else:
                raise ProtocolError("op names no operation")
        except _StreamBroken:
            raise
        except Poisoned as exc:
            self._poison(op, exc.error)
            if op.reply:
                r.error.CopyFrom(exc.error)
        except Exception as exc:
            if kind == "upload" and not self._chunks_taken:
                self._discard_chunks(op, next_message)  # keep the stream in step after a refused upload
            err = self._error(op, exc)
            self._poison(op, err)
            if op.reply:
                r.error.CopyFrom(err)
            else:
                self._defer(err)
        if op.reply:
            r.deferred_errors.extend(self._deferred)
            r.dropped_errors = self._dropped
            self._deferred.clear()
            self._dropped = 0
            if self.drain_deadline is not None:
                left = max(0.0, self.drain_deadline - time.monotonic())
                r.notice = (f"the gpuremote daemon is shutting down: this session keeps working for at most "
                            f"{left:.0f} s more, then its arrays are gone; save what you need and finish, or "
                            "start again on another device")
            yield reply
            yield from extra

    def _poison(self, op: pb.Op, err: pb.Error) -> None:
        if op.WhichOneof("kind") == "call":
            self._poison_handles(op.call.results, err)
        elif op.WhichOneof("kind") == "upload":
            self._poison_handles([op.upload.handle], err)

    def _poison_handles(self, targets, err: pb.Error) -> None:
        for h in targets:
            if h and h not in self.handles and len(self.poisoned) < self.limits.max_handles:
                self.poisoned[h] = err

    def _defer(self, err: pb.Error) -> None:
        if len(self._deferred) < DEFAULTS.max_deferred_errors:
            self._deferred.append(err)
        else:
            self._dropped += 1

    @classmethod
    def _error(cls, op: pb.Op, exc: Exception) -> pb.Error:
        name = op.call.name if op.WhichOneof("kind") == "call" else (op.WhichOneof("kind") or "op")
        return cls._error_at(name, op.seq, op.site, exc)

    @staticmethod
    def _error_at(name: str, seq: int, site: str, exc: Exception) -> pb.Error:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8))
        message = str(exc) if not isinstance(exc, KeyError) else str(exc.args[0] if exc.args else exc)
        return pb.Error(type=wire_type_name(exc), message=message[:4096], seq=seq, op=name[:128],
                        site=site[:512], traceback=tb[-4096:])

    def _fast_call(self, op: pb.Op) -> bool:
        """The hot path of an asynchronous elementwise call (`y = x + 1` in a training loop): what
        _call does, with fewer steps. Returns False, having done nothing, whenever the op is not
        plain (keywords, values other than handles and numbers, an unknown or poisoned handle, a
        device it may not use, a result that may not fit): the general path then runs it, and
        raises what it must. Errors of the op itself propagate as from _call."""
        call = op.call
        plan = _PLANS.get(call.name)
        if plan is None or not plan.fast or call.kwarg_names or len(call.results) != 1:
            return False
        device = op.device
        flows = self.flows
        if device >= len(flows) or flows[device] is None:
            return False
        handles = self.handles
        args = []
        shape = None
        for v in call.args:
            kind = v.WhichOneof("kind")
            if kind == "handle":
                arr = handles.get(v.handle)
                if arr is None:
                    return False
                if shape is None:
                    shape = arr.shape
                elif arr.shape != shape:        # broadcasting: the general path bounds it exactly
                    return False
                args.append(arr)
            elif kind == "float_value":
                args.append(v.float_value)
            elif kind == "int_value":
                args.append(v.int_value)
            else:
                return False
        if shape is None:
            return False
        # The result has the inputs' shape: at most 32 bytes an element (growth.py's loose bound).
        if math.prod(shape) * 32 > self._room(device):
            return False
        method = plan.method
        if method is not None:
            if not self.backend.is_array(args[0]):
                return False
            fn = getattr(args[0], method)
            operands = args[1:]
        else:
            fn = self._function(plan.name)
            operands = args
        flow = flows[device]
        mark = flow.enter(op.stream, self.streams)
        try:
            result = self._on_device(device, op.stream, fn, *operands)
        finally:
            flow.leave(mark, op.stream, self.streams)
        if result is NotImplemented:
            raise TypeError(f"unsupported operand type(s) for {method}")
        if not self.backend.is_array(result):
            result = self.backend.xp.asarray(result)
        if _STRICT_META:
            self._check_meta(plan.entry, tuple(args), {}, [result])
        self._bind_one(call.results[0], result, device)
        return True

    def _call(self, op: pb.Op) -> Any:
        """Run a call op in its turn on the device (the compute scheduler: gpuremote/daemon/scheduler.py)."""
        device = op.device
        flow = self.flows[device] if device < len(self.flows) else None
        if flow is None:
            if device >= len(self.backend.props):
                raise ValueError(f"device {device} does not exist: this daemon has {len(self.backend.props)} device(s)")
            raise self.tenancy.not_granted(device)
        mark = flow.enter(op.stream, self.streams)
        try:
            return self._run_call(op)
        finally:
            flow.leave(mark, op.stream, self.streams)

    def _run_call(self, op: pb.Op) -> Any:
        call = op.call
        name = call.name
        plan = self._plan(name)
        args = tuple([self._decode_arg(v) for v in call.args])
        kwargs = self._decode_kwargs(call) if call.kwarg_names or call.kwarg_values else {}
        results = call.results
        if results and plan.rule in ("none", "self", "value"):
            raise ProtocolError(f"{name} returns no array, but the op names result handles")
        return self._on_device(op.device, op.stream, self._execute, plan, args, kwargs, results, op)

    def _on_device(self, device: int, stream: int, fn: Callable, *args, **kwargs) -> Any:
        """fn(*args, **kwargs) with the op's device and stream made current where the backend has such
        a context (cupy); called plainly where it has none (emulated: no context manager per op)."""
        if not self._scoped:
            return fn(*args, **kwargs)
        with self.backend.activate(device, stream, self.streams):
            return fn(*args, **kwargs)

    @staticmethod
    def _plan(name: str) -> _Plan:
        plan = _PLANS.get(name)
        if plan is None:
            entry = SURFACE.get(name)
            if entry is None:
                raise UnsupportedOperationError(f"{name[:100]!r} is not in gpuremote's API surface table; "
                                                "the daemon runs only the names listed there")
            plan = _PLANS[name] = _Plan(name, entry)
        return plan

    def _execute(self, plan: "_Plan", args: tuple, kwargs: dict, results, op: pb.Op) -> Any:
        device = op.device
        entry = plan.entry
        # Before anything is allocated: an upper bound of what the op allocates, against what
        # the device (or the lease) has free. On the emulated backend that memory is the
        # daemon's own, so one oversized result would take every session down (growth.py).
        need = growth.bound(entry, args, kwargs, self._meta_of, self._room(device))
        if need:
            self.memory[device].check(need)     # a lease's check covers its device too
        result = self._invoke(plan, args, kwargs, op)
        if plan.rule == "value":
            return self._to_value(result)
        self._bind_result(plan, result, results, device, args, kwargs)
        return None

    def _bind_result(self, plan: _Plan, result, results, device: int, args: tuple, kwargs: dict) -> None:
        """Bind what a call returned to its result handles."""
        if not results:
            return
        is_array = self.backend.is_array
        if is_array(result):
            if len(results) == 1:       # the common case: one array for one handle
                if _STRICT_META:
                    self._check_meta(plan.entry, args, kwargs, [result])
                self._bind_one(results[0], result, device)
                return
            items = (result,)
        else:
            items = list(result) if isinstance(result, (tuple, list)) else [result]
            items = [x if is_array(x) else self.backend.xp.asarray(x) for x in items]
        if len(items) != len(results):
            raise ProtocolError(f"{plan.name} returned {len(items)} array(s), the client expected "
                                f"{len(results)}")
        if _STRICT_META:
            self._check_meta(plan.entry, args, kwargs, items)
        self._bind(results, items, device)

    def _decode_kwargs(self, call: pb.Call) -> dict:
        if len(call.kwarg_names) != len(call.kwarg_values):
            raise ProtocolError("malformed call: kwarg_names and kwarg_values differ in length")
        kwargs = {k: decode(v, self._resolve) for k, v in zip(call.kwarg_names, call.kwarg_values)}
        if len(kwargs) != len(call.kwarg_names):
            raise ProtocolError("malformed call: a keyword argument is repeated")
        return kwargs

    def _check_meta(self, entry, args, kwargs, items) -> None:
        metas = derive(entry, args, kwargs, self._meta_of)
        if metas is not None:
            actual = [(tuple(x.shape), x.dtype) for x in items]
            if actual != list(metas):
                raise AssertionError(f"metadata rule for {entry.name} derived {metas}, the op produced {actual}")

    def _invoke(self, plan: _Plan, args: tuple, kwargs: dict, op: pb.Op) -> Any:
        entry, name, kind = plan.entry, plan.name, plan.kind
        if kind == "method":
            if not args or not self.backend.is_array(args[0]):
                got = type(args[0]).__name__ if args else "nothing"
                raise TypeError(f"{name} needs an array as its first argument, got {got}")
            attr = entry.attr
            if attr in PROPERTIES:
                return getattr(args[0], attr)
            if attr == "__getitem__":
                return self._getitem(args[0], args[1])
            result = array_method(args[0], attr, self.backend.xp)(*args[1:], **kwargs)
            if result is NotImplemented:
                raise TypeError(f"unsupported operand type(s) for {attr}")
            return result
        if kind == "function":
            return self._function(name)(*args, **kwargs)
        if kind == "random":
            generator = 0
            if RANDOM_GENERATOR in kwargs:          # a cupy.random.RandomState's call
                generator = kwargs[RANDOM_GENERATOR]
                kwargs = without_generator(kwargs)
            if name == "random.default_rng":         # (re)make generator `generator` as a Generator
                self._generators[(op.device, generator)] = self._new_generator(op.device, generator, args, kwargs)
                return None
            if name.startswith("random.Generator."):
                rs = self._generators.get((op.device, generator))
                if rs is None:
                    raise ValueError(f"this session has no Generator {generator!r} on device {op.device}: "
                                     "make one with cupy.random.default_rng()")
            else:
                rs = self._random_state(op.device, generator)
            attr = entry.attr
            if attr == "seed":
                return rs.seed(*args, **kwargs)
            if attr == "randint" and len(args) > 3:  # randint(low, high, size, dtype): pass dtype by name
                args, kwargs = args[:3], dict(kwargs, dtype=args[3])
            return getattr(rs, attr)(*args, **kwargs)
        return self._service(name, args, kwargs, op)

    def _function(self, name: str) -> Callable:
        """The backend's function for surface name `name`, resolved once per session."""
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self.backend.resolve(name)
        return fn

    def _getitem(self, arr, key):
        result = arr[key]
        if not self.backend.is_array(result):
            # CuPy returns a 0-d view for an integer index; NumPy a scalar copy. Keep CuPy's view.
            result = arr[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
        return result

    def _new_generator(self, device: int, generator: int, args: tuple, kwargs: dict):
        if kwargs or len(args) > 1:
            raise TypeError("default_rng takes one argument, the seed")
        seed = args[0] if args else None
        if type(generator) is not int or not 0 < generator < 2**31:
            raise TypeError(f"a Generator's id is an int in [1, 2**31), not {generator!r}")
        if seed is not None and (type(seed) is not int or seed < 0):
            raise TypeError(f"default_rng(seed): a non-negative int or None through gpuremote, not {seed!r}")
        if (device, generator) not in self._generators and \
                sum(1 for d, _ in self._generators if d == device) >= DEFAULTS.max_generators:
            raise LimitExceededError(f"this session draws from {DEFAULTS.max_generators} Generators on device "
                                     f"{device} already, the limit: reuse one")
        return self.backend.generator(seed)

    def _random_state(self, device: int, generator: int):
        """The device's generator `generator`: 0 is its own (cupy.random.seed and the module's functions),
        others are RandomState objects of the client, made at their first call (their seed())."""
        key = (device, generator)
        rs = self._random.get(key)
        if rs is None:
            if type(generator) is not int or not 0 <= generator < 2**31:
                raise TypeError(f"a RandomState's generator id is an int in [0, 2**31), not {generator!r}")
            if generator and sum(1 for d, g in self._random if d == device and g) >= DEFAULTS.max_generators:
                raise LimitExceededError(f"this session draws from {DEFAULTS.max_generators} RandomState objects on "
                                         f"device {device} already, the limit: reuse one and reseed it with .seed()")
            rs = self._random[key] = self.backend.random_state(None)
        return rs

    def _to_value(self, result):
        if self.backend.is_array(result):
            return numpy.asarray(self.backend.to_host(result))
        return result

    def _service(self, name: str, args: tuple, kwargs: dict, op: pb.Op) -> Any:
        backend, device = self.backend, op.device
        if name == "ndarray.item":
            return args[0].item(*args[1:])
        if name == "cuda.runtime.getDeviceCount":
            return len(backend.props)
        if name == "cuda.runtime.getDeviceProperties":
            index = int(args[0])
            if not 0 <= index < len(backend.props):
                raise ValueError(f"device {index} does not exist: this daemon has {len(backend.props)} device(s)")
            return backend.props[index].as_properties()
        if name == "cuda.runtime.memGetInfo":
            free, total = backend.mem_info(device)
            mem = self.tenancy.memory[device]
            if mem is not backend.memory[device]:    # under a pool grant: what the lease may still use
                free, total = min(free, mem.capacity - mem.used), mem.capacity
            return free, total
        if name == "cuda.memory.layout":            # ndarray.strides and .flags (and whether .data may be)
            if len(args) != 1 or not hasattr(args[0], "flags"):
                raise TypeError("cuda.memory.layout takes one device array")
            arr = args[0]
            return (tuple(int(s) for s in arr.strides), bool(arr.flags.c_contiguous), bool(arr.flags.f_contiguous),
                    bool(arr.flags.owndata))
        if name in ("cuda.MemoryPool.used_bytes", "cuda.MemoryPool.total_bytes"):
            return self.memory_used[device]
        if name == "session.memory_peak":           # `gpuremote run --stats`: the most this session held here
            if args:
                raise TypeError("session.memory_peak takes no arguments")
            return self.memory_peak[device]
        if name == "cuda.MemoryPool.free_all_blocks":
            return None  # released arrays are freed at once: there are no cached blocks
        if name == "cuda.MemoryPool.set_limit":
            return self._set_limit(device, args)
        if name == "cuda.MemoryPool.get_limit":
            if args:
                raise TypeError("cuda.MemoryPool.get_limit takes no arguments")
            cap = self.memory[device]
            return cap.capacity if isinstance(cap, SessionCap) else 0
        if name == "cuda.Event.record":
            if len(self._events) >= 65536 and args[0] not in self._events:
                raise LimitExceededError("too many events in one session (65536)")
            self._events[int(args[0])] = backend.record_event(device, op.stream, self.streams)
            return None
        if name in ("cuda.Event.elapsed", "cuda.Event.query"):
            events = []
            for a in args:
                if int(a) not in self._events:
                    raise ValueError("the event has not been recorded yet: call record() first")
                events.append(self._events[int(a)])
            if name == "cuda.Event.query":
                return backend.event_done(events[0])
            return backend.elapsed_ms(events[0], events[1])
        if name.startswith("kernel."):
            return self._kernel(name.partition(".")[2], args, kwargs)
        raise UnsupportedOperationError(f"{name} is not served by this daemon")

    def _set_limit(self, device: int, args: tuple) -> None:
        """Cap what this session holds on `device` at args[0] bytes (0: no cap), above the ledger of
        its tenancy; what it holds already counts, and may be above the cap (then only credits pass)."""
        if len(args) != 1 or type(args[0]) is not int or not 0 <= args[0] < 2**63:
            raise ValueError("cuda.MemoryPool.set_limit takes one number of bytes, 0 to 2**63 - 1")
        if self.flows[device] is None:
            raise self.tenancy.not_granted(device)
        base = self.tenancy.memory[device]
        self.memory[device] = SessionCap(args[0], base, self.memory_used[device]) if args[0] else base
        return None

    def _kernel(self, kind: str, args: tuple, kwargs: dict) -> Any:
        spec = args[0]
        if not isinstance(spec, dict) or not all(isinstance(v, (str, tuple, list, type(None), bool, int))
                                                 for v in spec.values()):
            raise TypeError("malformed kernel description")
        size = sum(len(v) for v in spec.values() if isinstance(v, str))
        if size > DEFAULTS.max_kernel_source_bytes:
            raise LimitExceededError(f"kernel source of {size} bytes exceeds the limit of "
                                     f"{DEFAULTS.max_kernel_source_bytes}")
        kind = "elementwise" if kind == "elementwise_into" else kind
        key = (kind, tuple(sorted((k, str(v)) for k, v in spec.items())))
        fn = self._kernels.get(key)
        if fn is None:
            fn = self.backend.kernel(kind, spec)
            if len(self._kernels) < 1024:
                self._kernels[key] = fn
        return fn(*args[1:], **kwargs)

    # -- bulk bytes -----------------------------------------------------------------------
    def _upload(self, op: pb.Op, next_message) -> None:
        up = op.upload
        dtype = dtype_from_wire(up.meta.dtype)
        memory = self.memory[op.device]
        shape = checked_shape(up.meta.shape, dtype.itemsize)
        nbytes = math.prod(shape) * dtype.itemsize
        memory.check(nbytes)  # OutOfMemoryError, as CuPy, for more than the device has free
        if up.chunks == 0:
            if len(up.data) != nbytes:
                raise ValueError(f"upload of {len(up.data)} bytes for shape {shape} of {dtype} ({nbytes} bytes)")
            host = numpy.frombuffer(up.data, dtype).reshape(shape)
            owned = False
        else:
            host = buffers.pool("daemon").take(nbytes)   # page-aligned, reused: fresh memory is slow to touch
            offset = 0
            self._chunks_taken = True
            if self._bulk is not None:       # the data plane moves the bytes (raw frames, shared memory)
                offset = self._bulk.receive(op.seq, up.chunks, host)
            for _ in range(up.chunks if self._bulk is None else 0):
                msg = next_message()
                if msg is None or msg.WhichOneof("kind") != "chunk" or msg.chunk.seq != op.seq \
                        or msg.chunk.offset != offset or offset + len(msg.chunk.data) > nbytes:
                    raise _StreamBroken(f"upload for op {op.seq}: expected chunk at offset {offset}, got "
                                        "something else; the session's stream is out of step")
                host[offset:offset + len(msg.chunk.data)] = numpy.frombuffer(msg.chunk.data, numpy.uint8)
                offset += len(msg.chunk.data)
            if offset != nbytes:
                raise ValueError(f"upload for op {op.seq} delivered {offset} of {nbytes} bytes")
            host = host.view(dtype).reshape(shape)
            owned = True
        with self.backend.activate(op.device, op.stream, self.streams):
            arr = self.backend.from_host(host, op.device, owned)
            self._bind([up.handle], [arr], op.device)
        self.bytes_h2d += nbytes

    def _discard_chunks(self, op: pb.Op, next_message) -> None:
        """Read and drop the chunks announced by an upload that was refused before reading them."""
        self._chunks_taken = True
        if self._bulk is not None:
            self._bulk.discard(op.seq, op.upload.chunks)
            return
        for _ in range(op.upload.chunks):
            msg = next_message()
            if msg is None or msg.WhichOneof("kind") != "chunk" or msg.chunk.seq != op.seq:
                raise _StreamBroken(f"upload for op {op.seq} announced {op.upload.chunks} chunk(s), but the "
                                    "stream holds something else; the session's stream is out of step")

    def _inline_bytes(self) -> int:
        """Largest array a reply carries inline on this session's channel."""
        return DEFAULTS.inline_bytes if self._bulk is None else self._bulk.inline_bytes

    def _fetch(self, op: pb.Op, r: pb.Reply) -> Iterator[pb.ServerMessage]:
        arr = self._resolve(op.fetch.handle)
        if not arr.flags.c_contiguous:  # copied to a contiguous buffer first, as CuPy's get() does
            self.memory[op.device].check(arr.nbytes)
        if op.fetch.land_segment:
            return self._land(op, r, arr)
        with self.backend.activate(op.device, op.stream, self.streams):
            host = numpy.asarray(self.backend.to_host(arr), order="C")
        self.bytes_d2h += host.nbytes
        chunk = self.limits.chunk_bytes
        if host.nbytes <= self._inline_bytes():
            fill_array(r.value.array, host)
            return iter(())
        n = -(-host.nbytes // chunk)
        r.chunked.meta.dtype = host.dtype.str
        r.chunked.meta.shape.extend(host.shape)
        r.chunked.chunks = n
        flat = host.reshape(-1).view(numpy.uint8)
        if self._bulk is not None:
            r.chunked.chunks, extra = self._bulk.outgoing(flat)
            return extra
        return self._chunks(op.seq, flat, chunk, n)

    def _land(self, op: pb.Op, r: pb.Reply, arr) -> Iterator:
        """A fetch written straight into the client's shared segment (Fetch.land_segment): one
        copy, from the device array into the client's memory; the reply announces one frame."""
        if self._bulk is None:
            raise ProtocolError("Fetch.land_segment names a shared segment, but this session has no shared-memory "
                                "data plane (its bytes travel on the gRPC stream)")
        segment, offset = op.fetch.land_segment, op.fetch.land_offset
        dest = self._bulk.landing(op.seq, segment, offset, arr.nbytes)     # checked: ProtocolError
        with self.backend.activate(op.device, op.stream, self.streams):
            self.backend.to_host(arr, dest.view(arr.dtype).reshape(arr.shape))
        self.bytes_d2h += arr.nbytes
        r.chunked.meta.dtype = arr.dtype.str
        r.chunked.meta.shape.extend(arr.shape)
        r.chunked.chunks = 1
        return self._bulk.landed(segment, offset, arr.nbytes)

    @staticmethod
    def _chunks(seq: int, flat: numpy.ndarray, chunk: int, n: int) -> Iterator[pb.ServerMessage]:
        for i in range(n):      # pre-encoded ServerMessage{chunk}: one copy (transport/grpc_chunks.py)
            yield grpc_chunks.encode(seq, i * chunk, memoryview(flat[i * chunk:(i + 1) * chunk]))


class _StreamBroken(ProtocolError):
    """The client's stream is out of step (a chunk missing or misplaced): the session must end."""


class SessionEnded(_StreamBroken):
    """The daemon ends the session (it is shutting down); the message says why, for the client."""
