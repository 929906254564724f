"""The flashattn:: operators that torch.compile sees in place of our launchers.

Each kernel file defines its operators here with `define` and calls them from its own torch.autograd.Function,
which launches the kernels directly in eager mode and calls the operators while Dynamo traces it. Dynamo turns the
Function's forward and backward into the compiled graph's two halves, so the operators themselves carry no autograd
formula: called by hand on tensors that require grad, they return results without a gradient function.

Why torch.library.Library and not torch.library.custom_op: a compiled graph calls each operator through the
dispatcher at run time, and a custom_op call passes four Python layers (its autograd kernel, a redispatch, its backend
wrapper and a Dynamo-disable wrapper) before reaching our function. On the CI machine a custom_op costs ~60 us a call
against ~18 us for an operator defined here and called from a Function (results/training/op_overhead/), and a
compiled GPT-2 small step makes 24 such calls; the GPU machine's host runs Python several times slower.
"""
from __future__ import annotations

import torch

NAMESPACE = "flashattn"
# FRAGMENT: kernels/cross_entropy.py's custom_op adds to the same namespace
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


def define(schema: str, impl, fake) -> torch._ops.OpOverload:
    """Define flashattn::<name> from its schema ("name(Tensor q, ...) -> Tensor"), running impl on every device and
    fake (shapes and dtypes only) while torch.compile traces; return the operator."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema)
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


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
