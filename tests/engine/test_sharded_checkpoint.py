import os
import pickle

import pytest
import torch

from criteo_dlrm.common.storage import DamagedFileError
from criteo_dlrm.engine.sharded_checkpoint import METADATA, consolidate, read_state, write_state


def _state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"model/w": torch.randn(5, 3, generator=generator), "dense/0/step": torch.tensor(7.0)}


def test_a_state_written_to_a_folder_reads_back_in_place_and_whole(tmp_path):
    state = _state()
    digests = write_state(state, tmp_path / "state-7")
    assert set(digests) == {path.name for path in (tmp_path / "state-7").iterdir()} and METADATA in digests
    assert not list(tmp_path.glob(".*.partial")), "renamed into place"
    target = {"model/w": torch.zeros(5, 3)}
    made = read_state(target, tmp_path / "state-7", digests, allocate="dense/")
    assert torch.equal(target["model/w"], state["model/w"]) and torch.equal(made["dense/0/step"], torch.tensor(7.0))
    whole = consolidate(tmp_path / "state-7", digests)
    assert whole.keys() == state.keys() and all(torch.equal(whole[k], v) for k, v in state.items())


def test_a_damaged_or_missing_file_of_a_state_is_refused_naming_it(tmp_path):
    digests = write_state(_state(), tmp_path / "state-7")
    [shard] = (tmp_path / "state-7").glob("*.distcp")
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
    (tmp_path / "state-7" / METADATA).write_bytes(pickle.dumps(_RunsCode(str(marker))))
    with pytest.raises(DamagedFileError, match="is not the metadata of a checkpoint this project wrote"):
        consolidate(tmp_path / "state-7", {})  # the digests recomputed by whoever planted it: none checked
    assert not marker.exists(), "nothing in the folder ran"
