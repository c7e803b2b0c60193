"""How a model is placed over processes: the parallel modes (one process, DDP, TorchRec), the process group, the
optimisers, TorchRec's sharding and its state."""
