"""Run-time cost of an operator call inside a compiled graph, by how the operator is defined (CPU, no GPU needed).

A toy model of 12 layers, each calling one forward operator (and its backward operator in the backward graph), is
compiled with inductor; forward+backward is timed back to back, the variants alternating over 7 rounds:
- none: the same arithmetic without operators (the floor);
- custom_op: torch.library.custom_op with register_autograd (how kernels/flash.py defined its operators);
- library+register_autograd: torch.library.Library operators with the same autograd registration;
- library+Function: Library operators carrying no autograd, called from a torch.autograd.Function that Dynamo
  traces (kernels/ops.py's way).

    python results/training/compile_ops/op_overhead_cpu.py
"""
import time

import torch

torch.set_num_threads(1)


@torch.library.custom_op("toy_custom::fwd", mutates_args=())
def _custom_fwd(x: torch.Tensor, s: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x * s, x.sum(-1)


@_custom_fwd.register_fake
def _(x, s):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1])


@torch.library.custom_op("toy_custom::bwd", mutates_args=())
def _custom_bwd(g: torch.Tensor, s: float) -> torch.Tensor:
    return g * s


@_custom_bwd.register_fake
def _(g, s):
    return g.new_empty(g.shape)


def _setup(ctx, inputs, output):
    ctx.s = inputs[1]


_custom_fwd.register_autograd(lambda ctx, g, gl: (_custom_bwd(g, ctx.s), None), setup_context=_setup)


def _library(ns: str):
    lib = torch.library.Library(ns, "DEF")
    lib.define("fwd(Tensor x, float s) -> (Tensor, Tensor)")
    lib.define("bwd(Tensor g, float s) -> Tensor")
    lib.impl("fwd", lambda x, s: (x * s, x.sum(-1)), "CompositeExplicitAutograd")
    lib.impl("bwd", lambda g, s: g * s, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{ns}::fwd", lambda x, s: (x.new_empty(x.shape), x.new_empty(x.shape[:-1])), lib=lib)
    torch.library.register_fake(f"{ns}::bwd", lambda g, s: g.new_empty(g.shape), lib=lib)
    return lib


_lib_autograd = _library("toy_lib_autograd")
torch.library.register_autograd("toy_lib_autograd::fwd",
                                lambda ctx, g, gl: (torch.ops.toy_lib_autograd.bwd(g, ctx.s), None),
                                setup_context=_setup, lib=_lib_autograd)
_lib_function = _library("toy_lib_function")


class _Toy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        o, lse = torch.ops.toy_lib_function.fwd(x, s)
        ctx.s = s
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, g, glse):
        return torch.ops.toy_lib_function.bwd(g, ctx.s), None


def _model(layer):
    def model(x):
        for _ in range(12):
            x = layer(x + 1)
        return x.sum()
    return model


VARIANTS = {
    "none": _model(lambda x: x * 0.5),
    "custom_op": _model(lambda x: _custom_fwd(x, 0.5)[0]),
    "library+register_autograd": _model(lambda x: torch.ops.toy_lib_autograd.fwd(x, 0.5)[0]),
    "library+Function": _model(lambda x: _Toy.apply(x, 0.5)[0]),
}


def main():
    x = torch.randn(8, 8, requires_grad=True)
    compiled = {}
    for name, model in VARIANTS.items():
        compiled[name] = torch.compile(model, fullgraph=True)
        torch.testing.assert_close(torch.autograd.grad(compiled[name](x), x)[0], torch.autograd.grad(model(x), x)[0])
        for _ in range(50):
            torch.autograd.grad(compiled[name](x), x)
    times = {name: [] for name in compiled}
    for _ in range(7):
        for name, fn in compiled.items():
            t = time.perf_counter()
            for _ in range(300):
                torch.autograd.grad(fn(x), x)
            times[name].append((time.perf_counter() - t) / 300 * 1e6)
    floor = sorted(times["none"])[3]
    print(f"torch {torch.__version__}; median of 7 rounds, us per compiled forward+backward of 12 layers "
          f"(24 operator calls)")
    for name, t in times.items():
        med = sorted(t)[3]
        print(f"{name:28s} {med:8.0f} us   {(med - floor) / 24:5.1f} us per operator call above 'none'")


if __name__ == "__main__":
    main()
