"""The flashattn:: operators that torch.compile sees in place of our launchers.

Each kernel file defines its operators here with `define` and calls them from its own torch.autograd.Function:
in eager mode the call runs the launcher directly, while Dynamo traces it the call is the operator. Dynamo turns the
Function's forward and backward into the compiled graph's two halves, so the operators themselves carry no autograd
formula. Called by hand, they are not differentiable (PyTorch warns when a backward reaches one): differentiate
through the public functions.

Why torch.library.Library and not torch.library.custom_op: a compiled graph calls each operator through the
dispatcher at run time, and a custom_op call passes four Python layers (its autograd kernel, a redispatch, its backend
wrapper and a Dynamo-disable wrapper) before reaching our function. On the CI machine a custom_op costs ~69 us a call
above the floor against ~19 us for an operator defined here and called from a Function; on the H100's host this cut
26-40 us a call (results/training/compile_ops/). A compiled GPT-2 small step makes 25 such calls.
"""
from __future__ import annotations

import torch

NAMESPACE = "flashattn"
# FRAGMENT: other libraries may add to the namespace too
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


def define(schema: str, impl, fake):
    """Define flashattn::<name> from its schema ("name(Tensor q, ...) -> Tensor"), running impl on every device and
    fake (shapes and dtypes only) while torch.compile traces. Returns the function the autograd Functions call: the
    operator while torch.compile traces, impl itself otherwise (eager calls skip the dispatcher)."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema)
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default

    def call(*args):
        return (op if torch.compiler.is_compiling() else impl)(*args)

    return call


def distinct(*args) -> tuple:
    """args, with each tensor that repeats an earlier one replaced by a view of it while torch.compile traces: Dynamo
    cannot trace an autograd.Function given one tensor twice (self-attention's q is k is v, its cu_seqlens_q is
    cu_seqlens_k). The view carries the same gradient, and costs no copy."""
    if not torch.compiler.is_compiling():
        return args
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and any(a is b for b in out):
            a = a.view_as(a)
        out.append(a)
    return tuple(out)
