import os
import pickle

import pytest
import torch

from criteo_dlrm.common.storage import DamagedFileError
from criteo_dlrm.engine.trained.sharded_checkpoint import METADATA, consolidate, read_state, write_state


def _state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"model/w": torch.randn(5, 3, generator=generator), "dense/0/step": torch.tensor(7.0)}


def test_a_state_written_to_a_folder_reads_back_in_place_and_whole(tmp_path):
    state = _state()
    digests = write_state(state, tmp_path / "state-7")
    files = {
        str(path.relative_to(tmp_path / "state-7")) for path in (tmp_path / "state-7").rglob("*") if path.is_file()
    }
    assert set(digests) == files and f"part-0000/{METADATA}" in digests
    assert not list(tmp_path.glob(".*.partial")), "renamed into place"
    target = {"model/w": torch.zeros(5, 3)}
    made = read_state(target, tmp_path / "state-7", digests, allocate="dense/")
    assert torch.equal(target["model/w"], state["model/w"]) and torch.equal(made["dense/0/step"], torch.tensor(7.0))
    whole = consolidate(tmp_path / "state-7", digests)
    assert whole.keys() == state.keys() and all(torch.equal(whole[k], v) for k, v in state.items())


def test_a_damaged_or_missing_file_of_a_state_is_refused_naming_it(tmp_path):
    digests = write_state(_state(), tmp_path / "state-7")
    [shard] = (tmp_path / "state-7").glob("part-*/*.distcp")
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match=rf"{shard} is damaged"):
        read_state({"model/w": torch.zeros(5, 3)}, tmp_path / "state-7", digests)
    shard.unlink()
    with pytest.raises(DamagedFileError, match=rf"{shard} is missing"):
        consolidate(tmp_path / "state-7", digests)


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_metadata_that_would_run_code_is_refused_without_running_it(tmp_path):
    write_state(_state(), tmp_path / "state-7")
    marker = tmp_path / "ran"
    (tmp_path / "state-7" / "part-0000" / METADATA).write_bytes(pickle.dumps(_RunsCode(str(marker))))
    with pytest.raises(DamagedFileError, match="is not the metadata of a checkpoint this project wrote"):
        consolidate(tmp_path / "state-7", {})  # the digests recomputed by whoever planted it: none checked
    assert not marker.exists(), "nothing in the folder ran"


def test_a_state_is_written_in_parts_each_a_checkpoint_of_its_own_and_read_back_whole(tmp_path, monkeypatch):
    from criteo_dlrm.engine.trained import sharded_checkpoint

    monkeypatch.setattr(sharded_checkpoint, "PART_BYTES", 100)  # bytes: each 5 x 3 float32 tensor is 60
    buffer = torch.arange(60.0)
    state = {f"model/t{i}": buffer[i * 15 : (i + 1) * 15].view(5, 3) for i in range(4)}  # views of one buffer
    digests = write_state(state, tmp_path / "state")
    assert sorted(path.name for path in (tmp_path / "state").iterdir()) == ["part-0000", "part-0001"]
    whole = consolidate(tmp_path / "state", digests)
    assert whole.keys() == state.keys() and all(torch.equal(whole[k], v) for k, v in state.items())
    target = {key: torch.zeros(5, 3) for key in state}
    read_state(target, tmp_path / "state", digests)
    assert all(torch.equal(target[k], v) for k, v in state.items())


_WRITE_VIEWS = """
import resource, sys, torch
from pathlib import Path
from criteo_dlrm.engine.trained import sharded_checkpoint
from criteo_dlrm.engine.trained.sharded_checkpoint import write_state
sharded_checkpoint.PART_BYTES = 32 * 2**20  # parts of 32 MB, a tenth of the state (256 MB by default)
buffer = torch.ones(26, 4_000_000)  # 416 MB, written as 26 views (TorchRec's tables share one buffer like this)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
write_state({f"model/t{i}": buffer[i] for i in range(26)}, Path(sys.argv[1]))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_writing_a_state_of_views_holds_a_part_not_a_copy_of_the_state(tmp_path):
    """DCP's writer keeps a copy of every view it wrote to a file until the file is done: written whole, a state
    of 416 MB took 416 MB more at its peak."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _WRITE_VIEWS, str(tmp_path / "state")], capture_output=True,
                         text=True, check=True)  # fmt: skip
    grown = int(out.stdout.strip().splitlines()[-1])
    assert grown < 416e6 / 2, f"peak grew by {grown / 1e6:.0f} MB writing 416 MB of views"


def test_a_full_disk_while_the_state_is_written_says_so_naming_the_folder_and_leaves_nothing(tmp_path, monkeypatch):
    """Issue 62 item 10: a full disk while TorchRec's state was written ended in 322 lines of traceback (DCP's
    CheckpointException, a BaseException with every rank's traceback) that never said the disk was full."""
    import errno

    import torch.distributed.checkpoint as dcp

    from criteo_dlrm.common.storage import DiskFullError

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", full)
    with pytest.raises(DiskFullError) as refused:
        write_state({"model/x": torch.ones(10)}, tmp_path / "dlrm_x.state-5")
    message = str(refused.value)
    assert message.startswith(f"No space left on {tmp_path} while writing the training state of step 5 (")
    assert "Traceback" not in message and "run the same command again" in message
    assert list(tmp_path.iterdir()) == [], "nothing half-written"
