"""Launch a Triton kernel without Triton's per-call host path, once its specialisation has been compiled.

    launch(kernel, grid, args, constexprs)      # the same as kernel[grid](*args, **constexprs)

`kernel[grid](...)` (JITFunction.run) binds every argument, computes the specialisation, builds a cache key
from a string of the options and checks the kernel's globals on every call: ~30 us of host time per launch
on the H100 machine's host, against ~8 us for calling the compiled kernel's launcher itself (measured
2026-11-25; kernels/NOTES_flash.md, Session 13). An eager training step makes four such launches per
attention layer, and at the BERT and GPT-2 shapes the host time of a launch is as long as its kernel.

The first call of a specialisation goes through JITFunction.run (compiling if needed); the compiled kernel
is then kept under a key made of
  - the constexprs and launch options (num_warps, num_stages, ...), as given;
  - per leading tensor argument, its dtype and whether its address is 16-byte aligned (what Triton
    specialises a pointer on); per leading host TMA descriptor (Triton's or Gluon's TensorDescriptor), its
    type, dtype, block shape, shared layout and padding (what Triton specialises a descriptor on; its shape and
    strides are run-time arguments, encoded into a CUtensorMap by the launcher on every call);
  - the exact value of every other argument, except those the kernel declares `do_not_specialize` (per-
    batch values such as a varlen LSE stride), which Triton compiles for by width only: they stay out of
    the key, and the direct path is taken only while they fit in 32 bits (as when the kernel was kept).
Triton's own specialisation depends on no more than this (an int's value only through ==1, %16 and its
width), so one key always means one compiled kernel; a new value only costs one call through
JITFunction.run. Arguments laid out otherwise than tensors/descriptors-then-numbers, a launch hook (profilers
such as proton add one), and the interpreter always take `kernel[grid](...)`.

A kept kernel is called past Triton's Python wrapper of its CUDA launcher where the wrapper's layout is the one
`_runner` knows (Triton 3.6: no scratch memory, host TMA descriptors first): the wrapper walks every argument to
find the descriptors on each call, and a Gluon backward passes seven of them (session 47,
results/attention/host_profile/).

`Prepared` is a launch worked out once for a call geometry but for its tensors (kernels/flash.py's plans). Reused, it
binds to the runner launch() keeps and skips the key as well (session 48, results/attention/host_plans/).
"""
from __future__ import annotations

import os
from operator import itemgetter

import torch
from triton import knobs
from triton.runtime import driver


def _descriptor_types() -> tuple:
    """The host TMA descriptor classes this Triton has (Gluon's only where its experimental API imports)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    types = [TensorDescriptor]
    try:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
        types.append(GluonDescriptor)
    except ImportError:
        pass
    return tuple(types)


# id(kernel) -> (kernel, its layout, {device: {key: (runner, values of the parameters after args, in signature
# order)}}). The layout: (argument count, leading tensor / descriptor count, getter of the keyed numbers, getter of the
# do_not_specialize ints), or None when the kernel's arguments are not laid out as tensors and descriptors then numbers
# (never keyed). Keyed by id, the kernel held in the value so that its id stays its own: a JITFunction hashes through
# its cache_key property, under a lock, and three such lookups a launch cost ~5 us of host time on the H100's host.
_KERNELS: dict = {}
_NUMBERS = (int, float, bool)
_DESCRIPTORS = _descriptor_types()
_INT32 = (-2**31, 2**31 - 1)
# Entries per (kernel, device) before the cache starts over: every new value of a keyed argument (a new shape's
# strides, a varlen batch's rounded longest sequence) adds one, and a long run must not grow without bound.
_MAX_ENTRIES = 4096


# os.environ.get encodes the name and decodes the value on every call, and raises and catches a KeyError when the
# name is unset: a few us on the H100's host, asked ~10 times a forward+backward. The dict behind os.environ answers
# at a lookup's cost and holds every change made through os.environ (monkeypatch.setenv's too). It is looked up on
# each call, never kept: libraries rebind os.environ (HF datasets' multiprocess map sets it to a copy).
_ENCODED: dict = {}  # (name, value) -> the two as that dict holds them


def _env_is(name: str, value: str) -> bool:
    """os.environ.get(name) == value."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    if data is None:
        return environ.get(name) == value
    encoded = _ENCODED.get((name, value))
    if encoded is None:
        encoded = _ENCODED[name, value] = (environ.encodekey(name), environ.encodevalue(value))
    return data.get(encoded[0]) == encoded[1]


def _interpreting() -> bool:
    """Whether Triton runs kernels under its interpreter (TRITON_INTERPRET=1); kernels/flash.py asks here too."""
    return _env_is("TRITON_INTERPRET", "1")


def _hook_set(hook) -> bool:
    # Triton 3.6 keeps each launch hook as a HookChain, never None, with its functions in .calls; older
    # releases kept one function or None. Testing `is not None` alone made every launch look hooked on 3.6,
    # so none took the direct path (found in session 26's host profile).
    if isinstance(hook, getattr(knobs, "HookChain", ())):
        return bool(hook.calls)
    return hook is not None


def _launch_hooked() -> bool:
    return _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook)


def _current_device() -> int:
    return driver.active.get_current_device()


def _current_stream(device: int):
    return driver.active.get_current_stream(device)


def _getter(indices: list[int]):
    """args -> tuple of args[i] for i in indices (itemgetter returns a bare value for one index)."""
    if not indices:
        return lambda rest: ()
    if len(indices) == 1:
        i = indices[0]
        return lambda rest: (rest[i],)
    return itemgetter(*indices)


def _leading_key(a) -> tuple:
    """What Triton specialises a leading argument on: a tensor's dtype and 16-byte alignment; a host TMA
    descriptor's type, dtype, block shape, shared layout (Gluon's) and padding."""
    if type(a) in _DESCRIPTORS:
        return type(a), a.base.dtype, tuple(a.block_shape), getattr(a, "layout", None), a.padding
    return a.dtype, a.data_ptr() % 16 == 0


def _state(kernel, args) -> tuple:
    """(kernel, layout, compiled specialisations by device) of kernel, made at its first launch (from these args)."""
    state = _KERNELS.get(id(kernel))
    if state is None:
        state = _KERNELS[id(kernel)] = (kernel, _layout(kernel, args), {})
    return state


def _layout(kernel, args):
    n = 0
    while n < len(args) and (isinstance(args[n], torch.Tensor) or type(args[n]) in _DESCRIPTORS):
        n += 1
    layout = None
    if all(type(a) in _NUMBERS for a in args[n:]):
        params = kernel.params[n:len(args)]
        keyed = [i for i, p in enumerate(params) if not p.do_not_specialize]
        unkeyed = [i for i, p in enumerate(params) if p.do_not_specialize]
        layout = (len(args), n, _getter(keyed), _getter(unkeyed))
    return layout


def _fits_int32(values: tuple) -> bool:
    return all(type(v) is not int or _INT32[0] <= v <= _INT32[1] for v in values)


def _tail(kernel, nargs: int, constexprs: dict) -> tuple:
    """The values of the kernel's parameters after the positional ones, in signature order (what the
    compiled launcher takes after them: the constexprs, given or defaulted)."""
    out = []
    for p in kernel.params[nargs:]:
        if p.name in constexprs:
            out.append(constexprs[p.name])
        elif p.has_default:
            out.append(p.default)
        else:
            raise TypeError(f"{getattr(kernel, '__name__', kernel)}: no value for parameter {p.name!r}")
    return tuple(out)


def _tma_filler():
    """Triton's CUtensorMap encoder (`fill_tma_descriptor`, through the CUDA driver): the one its wrapper calls."""
    return driver.active.utils.fill_tma_descriptor


def _runner(compiled, leading: tuple):
    """(grid x, y, z, stream, args, tail) -> launch of `compiled` on them, for launches whose leading arguments have
    the keys `leading` (`_leading_key`). Where the launcher is Triton 3.6's CUDA one as known here (no scratch
    memory; its host TMA descriptors, if any, lead the arguments and come with their metadata), its compiled launch
    function is called directly, the descriptors encoded here; else through compiled.run."""
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata

    def generic(gx, gy, gz, stream, args, tail):
        run(gx, gy, gz, stream, function, metadata, None, None, None, *args, *tail)

    launcher = getattr(run, "launch", None)
    if launcher is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return generic
    coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    n_desc = sum(key[0] in _DESCRIPTORS for key in leading)
    if n_desc == 0:
        if getattr(launcher, "__closure__", None):  # a wrapper: the kernel takes descriptors these calls do not give
            return generic

        def direct(gx, gy, gz, stream, args, tail):
            launcher(gx, gy, gz, stream, function, coop, pdl, None, None, metadata, None, None, None, *args, *tail)
        return direct
    # Triton's wrapper (`wrap_handle_tensordesc`) holds the compiled launch function and each descriptor's metadata
    code = getattr(launcher, "__code__", None)
    if code is None:
        return generic
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in launcher.__closure__ or ())))
    raw, metas = cells.get("launcher"), cells.get("tensordesc_meta")
    if (raw is None or not metas or len(metas) != n_desc or cells.get("tensordesc_indices") != set(range(n_desc))
            or any(k[0] not in _DESCRIPTORS for k in leading[:n_desc])
            or any(m is None or m.get("fp4_padded") for m in metas)):
        return generic
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    fill = _tma_filler()
    encodings = [(m["swizzle"], m["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]], m["block_size"])
                 for m in metas]

    def from_parts(gx, gy, gz, stream, parts, rest, tail):
        expanded = []
        for (base, shape, strides, padding), (swizzle, elem_size, elem_type, block) in zip(parts, encodings):
            expanded.append(fill(base.data_ptr(), swizzle, elem_size, elem_type, block, shape, strides,
                                 1 if padding == "nan" else 0))
            expanded += shape
            expanded += strides
        raw(gx, gy, gz, stream, function, coop, pdl, None, None, metadata, None, None, None, *expanded, *rest, *tail)

    def with_descriptors(gx, gy, gz, stream, args, tail):
        from_parts(gx, gy, gz, stream, [(d.base, d.shape, d.strides, d.padding) for d in args[:n_desc]],
                   args[n_desc:], tail)
    # a bound Prepared hands the descriptors' parts (base tensor, shape, strides, padding) without building them
    with_descriptors.from_parts = from_parts
    return with_descriptors


def _slot(kernel, args: tuple, constexprs: dict):
    """(device, its cache of kernel, key, whether the unkeyed ints fit 32 bits, the arguments after the leading
    tensors / descriptors) of this launch, or None where it always takes kernel[grid](...): another layout of the
    arguments, a launch hook."""
    _, layout, by_device = _state(kernel, args)
    if layout is None or layout[0] != len(args) or _launch_hooked():
        return None
    _, n, keyed, unkeyed = layout
    rest = args[n:]
    try:
        leading = tuple(map(_leading_key, args[:n]))
        key = (tuple(constexprs.items()), leading, keyed(rest))
        small = _fits_int32(unkeyed(rest))
    except (AttributeError, IndexError):  # a call laid out unlike the first one: no key for it
        return None
    device = _current_device()
    cache = by_device.get(device)
    if cache is None:
        cache = by_device[device] = {}
    return device, cache, key, small, rest


def launch(kernel, grid: tuple, args: tuple, constexprs: dict) -> None:
    """kernel[grid](*args, **constexprs), through the compiled kernel's own launcher when this specialisation
    was launched before. `constexprs` holds the constexpr parameters and the launch options (num_warps, ...)."""
    slot = None if _interpreting() else _slot(kernel, args, constexprs)
    if slot is None:
        kernel[grid](*args, **constexprs)
        return
    device, cache, key, small, rest = slot
    entry = cache.get(key) if small else None
    if entry is None:
        compiled = kernel[grid](*args, **constexprs)
        if hasattr(compiled, "result"):  # an asynchronous compile's future
            compiled = compiled.result()
        # Never keep a tensor (or its memory) in a key, nor a NaN (it equals nothing, so its entry would never
        # be found again).
        if small and all(type(a) in _NUMBERS and a == a for a in rest):
            if len(cache) >= _MAX_ENTRIES:
                cache.clear()
            compiled._init_handles()
            cache[key] = (_runner(compiled, key[1]), _tail(kernel, len(args), constexprs))
        return
    runner, tail = entry
    runner(*_grid3(grid), _current_stream(device), args, tail)


_NEVER_BIND = -(2**62)  # a Prepared's call count that never reaches 2


def _unkeyed(kernel, n_numbers: int, positions: tuple) -> bool:
    """Whether the kernel declares do_not_specialize the parameters at these positions of its trailing numbers (never
    asked of the interpreter's kernels, which have no params and never bind: say no)."""
    if not hasattr(kernel, "params"):
        return False
    params = [p for p in kernel.params if not p.is_constexpr]
    numbers = params[len(params) - n_numbers:]
    return all(numbers[i].do_not_specialize for i in positions)


def _grid3(grid: tuple) -> tuple:
    """(x, y, z) of a grid of one to three dimensions."""
    return (*grid, 1, 1)[:3]


class Prepared:
    """A launch worked out but for its leading tensors: `prepared(*tensors)` is launch(kernel, grid, (*tensors,
    *numbers), constexprs), where `descriptors` (functions tensor -> host TMA descriptor) turn the first tensors into
    the descriptors the kernel takes. A launcher prepares it once per call geometry (kernels/flash.py's plans), so a
    call does only what its tensors change.

    Reused, it binds: from its third call on it calls the kept specialisation's runner itself (what launch() would
    find), without working out launch()'s key again. That is exact for tensors of the geometry it was prepared for,
    which is the contract: the key's other parts are the prepared numbers and constexprs, and what it reads of the
    tensors is their dtypes and 16-byte alignment, both fixed by a plan's geometry (its inputs' are part of the plan's
    key, and the buffers it allocates come from torch's allocator, aligned to 512 bytes on CUDA). A launch hook, the
    interpreter or another current device take launch() again.

    `run(tensors, values)` is the same launch with values of its own at the `varying` positions of the numbers: a
    varlen plan is made without the packed length, and each call passes the strides made of it. A varying number the
    kernel specialises on would make the kept runner wrong for other values, so such a Prepared never binds."""

    __slots__ = ("kernel", "grid", "numbers", "constexprs", "descriptors", "varying", "_bound", "_calls")

    def __init__(self, kernel, grid: tuple, numbers: tuple, constexprs: dict, descriptors: tuple = (),
                 varying: tuple = ()):
        self.kernel, self.grid, self.numbers, self.constexprs = kernel, grid, numbers, constexprs
        self.descriptors = descriptors
        self.varying = varying  # positions in numbers that `run` gives anew each call
        self._bound = None  # (device, runner, tail, (grid x, y, z), the runner's descriptor-parts entry or None)
        self._calls = 0 if not varying or _unkeyed(kernel, len(numbers), varying) else _NEVER_BIND

    def _args(self, tensors: tuple, numbers: tuple) -> tuple:
        """The kernel's arguments: the first tensors as descriptors, then the other tensors, then the numbers."""
        n = len(self.descriptors)
        return (*(make(t) for make, t in zip(self.descriptors, tensors)), *tensors[n:], *numbers)

    def __call__(self, *tensors) -> None:
        self._launch(tensors, self.numbers)

    def run(self, tensors: tuple, values: tuple) -> None:
        """The launch with `values` at the `varying` positions of the numbers, in their order."""
        numbers = self.numbers
        for i, value in zip(self.varying, values):
            numbers = (*numbers[:i], value, *numbers[i + 1:])
        if self._bound is not None and not _fits_int32(values):  # the kept runner takes them as 32-bit ints
            launch(self.kernel, self.grid, self._args(tensors, numbers), self.constexprs)
            return
        self._launch(tensors, numbers)

    def _launch(self, tensors: tuple, numbers: tuple) -> None:
        bound = self._bound
        if bound is not None and not _launch_hooked() and _current_device() == bound[0]:
            device, runner, tail, grid3, from_parts = bound
            if from_parts is not None:  # the descriptors' parts straight to the runner: no descriptor objects
                n = len(self.descriptors)
                from_parts(*grid3, _current_stream(device),
                           [(t, *make.parts) for make, t in zip(self.descriptors, tensors)],
                           (*tensors[n:], *numbers), tail)
            else:
                runner(*grid3, _current_stream(device), self._args(tensors, numbers), tail)
            return
        args = self._args(tensors, numbers)
        launch(self.kernel, self.grid, args, self.constexprs)
        self._calls += 1
        if self._calls == 2 and not _interpreting():  # a one-off launch (the public launchers) does not bind
            self._bind(args)

    def _bind(self, args: tuple) -> None:
        state = _KERNELS.get(id(self.kernel))
        if state is None or not any(state[2].values()):  # nothing kept (launch() replaced, as tools on the CPU do)
            return
        slot = _slot(self.kernel, args, self.constexprs)
        entry = slot[1].get(slot[2]) if slot is not None and slot[3] else None
        if entry is not None:
            # the parts path where the runner takes them and every descriptor maker says its parts (`.parts`:
            # shape, strides, padding, as kernels/flash_gluon.py's HeadTiles does)
            from_parts = getattr(entry[0], "from_parts", None)
            n_desc = sum(leading[0] in _DESCRIPTORS for leading in slot[2][1])
            if (not self.descriptors or n_desc != len(self.descriptors)
                    or not all(hasattr(make, "parts") for make in self.descriptors)):
                from_parts = None
            self._bound = (slot[0], *entry, _grid3(self.grid), from_parts)


def compiled_entries(kernel, device: int = 0) -> int:
    """How many specialisations of kernel launch() holds on device (tests)."""
    state = _KERNELS.get(id(kernel))
    return len(state[2].get(device, {})) if state else 0


def cached_specialisations() -> int:
    """How many compiled specialisations launch() holds (tests)."""
    return sum(len(c) for _, _, by_device in _KERNELS.values() for c in by_device.values())
