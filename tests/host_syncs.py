"""What would make the host wait for a GPU, counted on the CPU: a test of the hot loop's synchronisations that runs
where there is no GPU.

On CUDA the host queues kernels and runs ahead; an operation that needs a value back (``.item()``, ``bool(t)``, a
``.tolist()``), an output whose size depends on the data (``nonzero``, ``unique``, ``coalesce``, a boolean mask)
or a copy from pageable host memory (``torch.tensor(list, device=...)``, indexing with a Python list) waits for
every kernel queued before it. On the CPU these cost nothing and no test saw them; ``HostSyncs`` records each as
it happens, by name, wherever the tensors are.

    with HostSyncs() as syncs:
        step(batch, 0, 1)
    assert syncs.counts == {"coalesce": 1}
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

_READ_BACK = {
    torch.Tensor.item: "item",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.numpy: "numpy",
    torch.Tensor.__bool__: "bool",
    torch.Tensor.__int__: "int",
    torch.Tensor.__float__: "float",
    torch.Tensor.__index__: "index",
}
_SIZED_BY_DATA = {
    torch.nonzero: "nonzero",
    torch.Tensor.nonzero: "nonzero",
    torch.unique: "unique",
    torch.Tensor.unique: "unique",
    torch.unique_consecutive: "unique",
    torch.masked_select: "masked_select",
    torch.Tensor.masked_select: "masked_select",
    torch.Tensor.coalesce: "coalesce",
    torch.repeat_interleave: "repeat_interleave",
}
_FROM_HOST = {torch.tensor, torch.as_tensor}


def _host_index(index) -> bool:
    """An index a GPU tensor takes through a copy from host memory (a list) or a sized-by-data mask."""
    items = index if isinstance(index, tuple) else (index,)
    return any(
        isinstance(item, list) or (isinstance(item, torch.Tensor) and item.dtype == torch.bool) for item in items
    )


class HostSyncs(TorchFunctionMode):
    """Counts, by name, the operations that would wait for the device on a GPU (see the module's text)."""

    def __init__(self, on_the_host=()):
        """``on_the_host``: tensors a GPU run keeps in host memory too (torch's optimisers' step counts), whose
        reads wait for nothing."""
        super().__init__()
        self.counts: Counter = Counter()
        self.on_the_host = {id(t) for t in on_the_host}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READ_BACK and args and id(args[0]) in self.on_the_host:
            pass
        elif func in _READ_BACK:
            self.counts[_READ_BACK[func]] += 1
        elif func in _SIZED_BY_DATA:
            if not (func is torch.repeat_interleave and kwargs.get("output_size") is not None):
                self.counts[_SIZED_BY_DATA[func]] += 1
        elif func in _FROM_HOST and args and not isinstance(args[0], torch.Tensor):
            self.counts["tensor from host data"] += 1
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _host_index(args[1]):
            self.counts["index from host or mask"] += 1
        return func(*args, **kwargs)
