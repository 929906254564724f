"""Shared test setup: without a GPU, Triton kernels run under the interpreter (TRITON_INTERPRET=1).

The variable must be set before triton is first imported, hence here at collection time.
"""
import os
import sys

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def fresh_plans():
    """kernels.flash keeps a plan per call geometry, made under the module settings of its first call; tests change
    those settings (monkeypatch), so each test starts with none."""
    flash = sys.modules.get("kernels.flash")
    if flash is not None:
        flash.clear_plans()
    yield
