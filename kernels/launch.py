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


# (kernel, device) -> {key: (compiled kernel, values of the parameters after args, in signature order)}
_COMPILED: dict = {}
# kernel -> (argument count, leading tensor / descriptor count, getter of the keyed numbers, getter of the
# do_not_specialize ints), or None when the kernel's arguments are not laid out as tensors and descriptors then numbers
# (never keyed)
_LAYOUT: dict = {}
_NUMBERS = (int, float, bool)
_DESCRIPTORS = _descriptor_types()
_INT32 = (-2**31, 2**31 - 1)
# Entries per (kernel, device) before the cache starts over: every new value of a keyed argument (a new shape's
# strides, a varlen batch's rounded longest sequence) adds one, and a long run must not grow without bound.
_MAX_ENTRIES = 4096


def _interpreting() -> bool:
    """Whether Triton runs kernels under its interpreter (TRITON_INTERPRET=1); kernels/flash.py asks here too."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


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


def _layout(kernel, args):
    if kernel in _LAYOUT:
        return _LAYOUT[kernel]
    n = 0
    while n < len(args) and (isinstance(args[n], torch.Tensor) or type(args[n]) in _DESCRIPTORS):
        n += 1
    layout = None
    if all(type(a) in _NUMBERS for a in args[n:]):
        params = kernel.params[n:len(args)]
        keyed = [i for i, p in enumerate(params) if not p.do_not_specialize]
        unkeyed = [i for i, p in enumerate(params) if p.do_not_specialize]
        layout = (len(args), n, _getter(keyed), _getter(unkeyed))
    _LAYOUT[kernel] = layout
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


def launch(kernel, grid: tuple, args: tuple, constexprs: dict) -> None:
    """kernel[grid](*args, **constexprs), through the compiled kernel's own launcher when this specialisation
    was launched before. `constexprs` holds the constexpr parameters and the launch options (num_warps, ...)."""
    if _interpreting():
        kernel[grid](*args, **constexprs)
        return
    layout = _layout(kernel, args)
    if layout is None or layout[0] != len(args) or _launch_hooked():
        kernel[grid](*args, **constexprs)
        return
    _, n, keyed, unkeyed = layout
    rest = args[n:]
    try:
        tensors = tuple(map(_leading_key, args[:n]))
        key = (tuple(constexprs.items()), tensors, keyed(rest))
        small = _fits_int32(unkeyed(rest))
    except (AttributeError, IndexError):  # a call laid out unlike the first one: no key for it
        kernel[grid](*args, **constexprs)
        return
    device = _current_device()
    cache = _COMPILED.setdefault((kernel, device), {})
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
            cache[key] = (compiled, _tail(kernel, len(args), constexprs))
        return
    compiled, tail = entry
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, _current_stream(device),
                 compiled.function, compiled.packed_metadata, None, None, None, *args, *tail)


def cached_specialisations() -> int:
    """How many compiled specialisations launch() holds (tests)."""
    return sum(len(c) for c in _COMPILED.values())
