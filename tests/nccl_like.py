"""A process group that refuses what NCCL refuses, on the CPU: the CPU tests of every mode's collectives run through
it, so a tensor that would sit in host memory on a GPU run fails here as it would there.

On a GPU run a tensor made without a device (``torch.tensor([x])``, ``torch.zeros(n)``, ``torch.from_numpy``) is a
CPU tensor, and NCCL refuses it ("No backend type associated with device type cpu"); on the CPU every tensor is a
CPU tensor and gloo takes it, so CPU tests never saw the fault. Here such tensors are marked as host tensors, the mark
follows what is computed from them, and leaves with a move to a named device (``.to(device)``, ``.cuda()``,
``Module.to``); a collective that this package calls with a host tensor raises as NCCL would. The package's code is
also told its group's backend is ``nccl``, so it takes its NCCL branches (predictions gathered on the device).

    with nccl_like():              # in this process
        ...
    env=nccl_like_environment()    # in the processes a test starts (and those they start): tests/nccl_like_site

Collectives of objects (``broadcast_object_list``, ``gather_object``: NCCL moves them to the device itself) and those
torch or TorchRec call internally are left alone; what torch computes in C++ (autograd's gradients) is never marked.
torch.compile captures nothing under it (a function mode is active): the runs under it train eagerly.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

ENVIRONMENT = "CRITEO_DLRM_TEST_NCCL_LIKE"
SITE = Path(__file__).parent / "nccl_like_site"

# Functions that make a tensor from nothing (or from host data): on the CPU unless given a device.
_FACTORIES = {
    torch.tensor, torch.as_tensor, torch.from_numpy, torch.asarray, torch.scalar_tensor,
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.linspace, torch.eye,
    torch.rand, torch.randn, torch.randint, torch.randperm,
}  # fmt: skip
_MOVES = {torch.Tensor.to, torch.Tensor.cuda}
_TENSOR_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "gather", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
)  # fmt: skip


class HostTensorError(RuntimeError):
    """A collective was given a tensor that a GPU run would hold in host memory."""


def is_host(tensor: torch.Tensor) -> bool:
    return getattr(tensor, "_nccl_like_host", False)


def _mark(value, host: bool) -> None:
    if isinstance(value, torch.Tensor):
        with contextlib.suppress(AttributeError, RuntimeError):
            value._nccl_like_host = host
    elif isinstance(value, (list, tuple)):
        for item in value:
            _mark(item, host)


def _tensors(value) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _names_a_device(args, kwargs) -> bool:
    """Whether a move (``Tensor.to``, ``.cuda``, ``Module.to``) names its device, not another tensor's."""
    given = [*args[1:], kwargs.get("device")]
    return any(isinstance(a, (torch.device, str, int)) and not isinstance(a, bool) for a in given if a is not None)


class HostTensors(TorchFunctionMode):
    """Marks the tensors a GPU run would hold in host memory."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _FACTORIES:
            given = [t for t in _tensors(args) if isinstance(t, torch.Tensor)]
            host = kwargs.get("device") is None and (not given or any(is_host(t) for t in given))
        elif func in _MOVES:
            if not _names_a_device(args, kwargs):
                host = any(is_host(t) for t in _tensors(args))
            else:
                if out is args[0] and out.layout == torch.strided:
                    out = out.view_as(out)  # already there: a new tensor object for the moved one, the original kept
                host = False
        elif isinstance(out, torch.Tensor) and args and out is args[0]:
            return out  # in place: the destination stays where it is (a copy into a GPU tensor stays on the GPU)
        else:
            host = kwargs.get("device") is None and any(is_host(t) for t in _tensors((args, kwargs)))
        _mark(out, host)
        return out


def _from_this_package(frame) -> bool:
    return frame is not None and frame.f_globals.get("__name__", "").startswith("criteo_dlrm")


def _refusing(name: str, collective):
    @functools.wraps(collective)
    def refusing(*args, **kwargs):
        if _from_this_package(sys._getframe(1)):
            hosts = [t for t in _tensors((args, kwargs)) if is_host(t)]
            if hosts:
                raise HostTensorError(
                    f"dist.{name} was given a tensor a GPU run holds in host memory ({tuple(hosts[0].shape)}, made "
                    "without a device): NCCL refuses it (No backend type associated with device type cpu). Make it "
                    "on the run's device."
                )
        return collective(*args, **kwargs)

    return refusing


def _backend_for(get_backend):
    @functools.wraps(get_backend)
    def backend(*args, **kwargs):
        found = get_backend(*args, **kwargs)
        return "nccl" if _from_this_package(sys._getframe(1)) and found == "gloo" else found

    return backend


def _moving_module(to):
    @functools.wraps(to)
    def moved(self, *args, **kwargs):
        result = to(self, *args, **kwargs)
        if _names_a_device((self, *args), kwargs):
            for tensor in [*self.parameters(), *self.buffers()]:
                _mark(tensor, False)
        return result

    return moved


def _from_numpy(from_numpy):
    @functools.wraps(from_numpy)
    def marked(array):
        tensor = from_numpy(array)
        _mark(tensor, True)
        return tensor

    return marked


@contextlib.contextmanager
def nccl_like() -> Iterator[None]:
    """In this process: host tensors marked, collectives of this package refusing them, its backend ``nccl``."""
    saved = {name: getattr(dist, name) for name in (*_TENSOR_COLLECTIVES, "get_backend") if hasattr(dist, name)}
    saved_to, saved_from_numpy = torch.nn.Module.to, torch.from_numpy
    try:
        torch.from_numpy = _from_numpy(saved_from_numpy)  # not dispatched to a TorchFunctionMode
        for name in _TENSOR_COLLECTIVES:
            if name in saved:
                setattr(dist, name, _refusing(name, saved[name]))
        dist.get_backend = _backend_for(saved["get_backend"])
        torch.nn.Module.to = _moving_module(saved_to)
        with HostTensors():
            yield
    finally:
        for name, function in saved.items():
            setattr(dist, name, function)
        torch.nn.Module.to, torch.from_numpy = saved_to, saved_from_numpy


_INSTALLED: list = []


def install() -> None:
    """``nccl_like`` for the rest of this process (tests/nccl_like_site/sitecustomize.py calls it at start)."""
    context = nccl_like()
    context.__enter__()
    _INSTALLED.append(context)  # held: a context manager collected would undo it


def nccl_like_environment(environment: dict | None = None) -> dict:
    """``environment`` (this one by default) for processes that run ``nccl_like`` from their start, and every
    process they start."""
    environment = dict(os.environ if environment is None else environment)
    paths = [str(SITE), environment.get("PYTHONPATH", "")]
    return {**environment, ENVIRONMENT: "1", "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
