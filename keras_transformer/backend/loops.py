"""`while_loop`, whose condition and body a torch decoding call traces once
per shapes and replays.

Under torch nothing compiles a search: every step would run the model's
layers from Python, a few microseconds of Keras and torch dispatch around
each of about 190 kernels of about as long (a greedy step of the small
model). In a decoding call with `TracedLoops`, `while_loop` records its
condition and body with torch.fx's `make_fx` the first time it meets them
with given shapes (the torch operations one call runs, as a graph module),
and replays the records at every step and in later calls: the same torch
operations, without Keras's Python between them. Eager loops decoded at
0.70-0.92x the speed (small and base, batch 1 and 32, greedy and beam 4,
on 2 cores of an AMD EPYC). Everywhere else it is `keras.ops.while_loop`.
"""

import collections
import contextlib
import functools
import types
import warnings

import keras
import numpy as np



def while_loop(cond, body, loop_vars, maximum_iterations=None, loops=None):
    """`keras.ops.while_loop(cond, body, loop_vars, maximum_iterations)`,
    recorded and replayed by `loops` (a `TracedLoops`) where given."""
    if _is_named(loop_vars):
        # One structure, not a tuple of loop variables: Keras would spread a
        # named tuple over the arguments of `cond` and `body`.
        return while_loop(cond, lambda state: (body(state),), (loop_vars,), maximum_iterations, loops)[0]
    if loops is None:
        return keras.ops.while_loop(cond, body, loop_vars, maximum_iterations=maximum_iterations)
    is_tuple = isinstance(loop_vars, (tuple, list))
    loop_vars = tuple(loop_vars) if is_tuple else (loop_vars,)
    # A trace is kept per shapes, not strides: the loop variables enter it
    # contiguous (a search's first state can be a broadcast view), so that
    # the caches it writes in place are writable at every replay.
    loop_vars = keras.tree.map_structure(_contiguous, loop_vars)
    # Both are met each time, so that both are recorded at the same meeting.
    traced_body = loops.function(body, loop_vars)
    traced_cond = loops.function(cond, loop_vars)
    if traced_body is None or traced_cond is None:
        return keras.ops.while_loop(
            cond, body, loop_vars if is_tuple else loop_vars[0], maximum_iterations=maximum_iterations
        )
    flat = keras.tree.flatten(loop_vars)
    iterations = 0
    while (maximum_iterations is None or iterations < maximum_iterations) and bool(traced_cond(*flat)[0]):
        flat = traced_body(*flat)
        iterations += 1
    loop_vars = keras.tree.pack_sequence_as(loop_vars, list(flat))
    return loop_vars if is_tuple else loop_vars[0]


class TracedLoops:
    """The traced conditions and bodies of one `CompiledFunction`'s loops.

    `make_fx` records the torch operations that one call of a function
    runs. The tensors it is given become the record's inputs; any
    other tensor the function reads becomes a constant of the trace. A loop
    body reads more than its loop variables: the model's weights, and
    tensors of the functions around it (the encoder's keys and values, each
    sentence's length limit), which change from call to call. So those are
    found and given to the trace as inputs too: the tensors in the
    function's closure, in the functions, lists, tuples and dicts there, in
    turn, and the model's variables. A trace is kept for everything else
    those closures hold: the code of each function, Python numbers and
    strings by value, and other objects (the model, its layers) by identity,
    taken as they are when first traced, as TensorFlow and JAX take them
    when they compile a function for the first time. A function that cannot
    be traced (a loop variable that is not a tensor, an operation the
    tracer refuses) runs through Keras's loop.

    Args:
        model: the model whose weights the loops read.
        size: the most traces kept; the least recently used goes first.
            A translator meets a condition and a body per phase of the
            growing caches (up to 7) per bucket of source lengths (10 up to
            256 tokens): 140 shapes. With 16 kept, a file of many buckets
            traced its loops again at every pass (the quick start's test
            set under torch: 36 traces a pass, half the speed).

    A loop is recorded the second time it is met with the same key, and
    runs eagerly the first time; inside `recording_at_once()` (a warm-up,
    which meets each shape to reuse it), the first time. `count` counts the
    functions recorded; `refused`, those the recorder refused; `eager`, the
    first meetings.
    """

    def __init__(self, model, size=256):
        self.model = model
        self.size = size
        self.record_at_once = False
        self.count = 0
        self.refused = 0
        self.eager = 0
        self._traces = collections.OrderedDict()  # key -> (traced function or None, objects)
        self._met = collections.OrderedDict()  # key -> objects, for keys met once

    @contextlib.contextmanager
    def recording_at_once(self):
        """Loops met inside are recorded at their first meeting."""
        self.record_at_once = True
        try:
            yield
        finally:
            self.record_at_once = False

    def function(self, function, loop_vars):
        """`function(*loop_vars)` as a function of the flat loop variables
        that returns its flat outputs: traced, or an earlier trace; None if
        it cannot be traced."""
        import torch

        flat = keras.tree.flatten(loop_vars)
        if not all(type(x) is torch.Tensor for x in flat):
            return None
        key = [_structure(loop_vars)] + [(x.shape, x.dtype, x.device) for x in flat]
        extra, places, pinned = [], {}, []

        def place(tensor):  # the closure's tensors and the weights, once each
            if id(tensor) not in places:
                places[id(tensor)] = len(extra)
                extra.append(tensor)
            return places[id(tensor)]

        if not _closure_key(function, place, key, pinned, set()):
            return None
        variables = self.model.variables
        key.append(tuple((id(v), tuple(v.shape), v.dtype) for v in variables))
        for variable in variables:
            place(variable.value)
        key = tuple(key)
        if key in self._traces:
            self._traces.move_to_end(key)
            traced = self._traces[key][0]
        elif key not in self._met and not self.record_at_once:
            # Met once: run eagerly, and recorded if met again. A record costs
            # dozens of runs (a tiny model's beam search: 1.4 s against 0.08 s
            # a call), which a loop run once never pays back.
            self._met[key] = pinned
            while len(self._met) > self.size:
                self._met.popitem(last=False)
            self.eager += 1
            return None
        else:
            self._met.pop(key, None)
            traced = self._trace(function, loop_vars, flat, extra)
            if traced is None:
                self.refused += 1
            else:
                self.count += 1
            # The objects are kept with the trace, so that no identity in
            # its key is reused by another object.
            self._traces[key] = traced, pinned
            while len(self._traces) > self.size:
                self._traces.popitem(last=False)
        if traced is None:
            return None
        return lambda *flat_vars: traced(*flat_vars, *extra)

    @staticmethod
    def _trace(function, loop_vars, flat, extra):
        def flat_function(*inputs):
            flat_vars = inputs[: len(flat)]
            outputs = function(*keras.tree.pack_sequence_as(loop_vars, flat_vars))
            return tuple(keras.tree.flatten(outputs))

        # Each loop variable enters as a new tensor object (`detach` makes
        # one without copying), so that the tracer tells it apart from
        # another loop variable or a tensor of the closure that is the same
        # object now but may not be at a later step.
        inputs = tuple(x.detach() for x in flat) + tuple(extra)
        record = _recorder()
        if record is None:
            return None
        try:
            return record(flat_function)(*inputs)
        except Exception:  # noqa: BLE001 - what the recorder refuses runs eagerly (`refused` counts it)
            return None


@functools.cache
def _recorder():
    """torch.fx's `make_fx`, which records the torch operations a call runs
    as a graph module; None, with one warning, in a torch without it."""
    try:
        from torch.fx.experimental.proxy_tensor import make_fx
    except ImportError as error:
        warnings.warn(
            f"torch.fx's make_fx is missing ({error}); decoding under torch runs "
            "its loops eagerly, at about 0.7x the speed.",
            stacklevel=3,
        )
        return None
    return make_fx


def _is_named(value):
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _contiguous(x):
    import torch

    x = keras.ops.convert_to_tensor(x)
    return x if type(x) is not torch.Tensor or x.is_contiguous() else x.contiguous()


def _structure(nest):
    """The shape of a nest of lists, tuples and dicts, without its leaves."""
    kind = type(nest)
    if kind in (list, tuple):
        return kind, tuple(_structure(item) for item in nest)
    if kind is dict:
        return dict, tuple((name, _structure(nest[name])) for name in sorted(nest))
    return None


def _closure_key(value, place, key, pinned, seen):
    """Adds to `key` what the trace of a function takes as fixed in
    `value`, and `place`s the tensors it must take as inputs. False if
    `value` holds something neither fixed nor a tensor."""
    import torch

    kind = type(value)
    if isinstance(value, torch.Tensor):
        key.append(("tensor", place(value), value.shape, value.dtype, value.device))
    elif isinstance(value, keras.Variable):
        key.append(("variable", place(value.value), tuple(value.shape), value.dtype))
    elif value is None or kind in (bool, int, float, complex, str, bytes) or isinstance(value, np.generic):
        key.append((kind, value))
    elif kind in (list, tuple, dict):
        items = [value[name] for name in sorted(value)] if kind is dict else value
        key.append((kind, tuple(sorted(value)) if kind is dict else len(value)))
        return all(_closure_key(item, place, key, pinned, seen) for item in items)
    elif kind is types.FunctionType:
        key.append(("function", value.__code__))
        if id(value) in seen:  # a function that refers to itself
            return True
        seen.add(id(value))
        # Not pinned: its code and contents are the key, not its identity,
        # and a trace must not keep the tensors of its closure alive.
        cells = value.__closure__ or ()
        parts = [value.__defaults__ or (), value.__kwdefaults__ or {}]
        for cell in cells:
            try:
                parts.append(cell.cell_contents)
            except ValueError:  # a name not yet bound
                parts.append(None)
        return all(_closure_key(part, place, key, pinned, seen) for part in parts)
    elif kind is types.MethodType:
        key.append(("method", value.__func__.__code__, id(value.__self__)))
        pinned.append(value.__self__)
    elif isinstance(value, np.ndarray):
        return False  # neither fixed nor a tensor the trace can take in
    else:  # modules, classes, the model and its layers: by identity
        key.append(("object", id(value)))
        pinned.append(value)
    return True
