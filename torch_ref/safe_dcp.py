"""Reading a torch.distributed.checkpoint (DCP) folder without running code from it.

torch 2.13's `FileSystemReader.read_metadata` is `pickle.load` on the checkpoint's `.metadata`, and
`DefaultLoadPlanner.load_bytes` is `torch.load(weights_only=False)` on every non-tensor entry: a crafted
file runs whatever it names, on each rank, at each read. Here:

- `SafeReader`: `read_metadata` unpickles with `Restricted`, whose `find_class` allows only DCP's own
  metadata classes and the torch and pathlib types they hold (a dtype, `torch.Size`, a layout by name,
  a path); any other global (`os.system`, `builtins.eval`, ...) is refused before it is called.
- `SafePlanner`: non-tensor entries (an optimizer's `lr`, `step`) are loaded with
  `torch.load(weights_only=True)`, torch's own allow-list unpickler. Tensor data already is
  (`FileSystemReader.read_data` passes `weights_only=True`).
A refusal is `HostileCheckpoint` (a `RunFailed`: exit 3, a file that failed), naming the file and the
global it asked for.
"""
from __future__ import annotations

import os
import pickle

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta

from jaxdp.core.files.record import DamagedCheckpoint

METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch.serialization": {"_get_layout"},  # a layout by its name, looked up among torch's layouts
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class HostileCheckpoint(DamagedCheckpoint):
    """A checkpoint file that asks to run code (or build an object DCP never writes)."""


class Restricted(pickle.Unpickler):
    """An unpickler that builds DCP metadata and nothing else."""

    def __init__(self, file, path: str):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if name in METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise HostileCheckpoint(f"{self.path} asks to load {module}.{name}, which a checkpoint's metadata never "
                                f"holds: refused, nothing of it ran; delete the checkpoint folder, it is not "
                                f"one this program wrote")


class SafeReader(FileSystemReader):
    """DCP's file-system reader with `.metadata` read by `Restricted`."""

    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            try:
                metadata = Restricted(f, os.fspath(path)).load()
            except HostileCheckpoint:
                raise
            except Exception as e:  # noqa: BLE001 - a truncated or garbled pickle: damaged
                raise DamagedCheckpoint(f"{os.fspath(path)} is unreadable ({type(e).__name__}: {e})") from None
        if type(metadata).__name__ != "Metadata":
            raise HostileCheckpoint(f"{os.fspath(path)} holds a {type(metadata).__name__}, not DCP metadata: refused")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, with non-tensor entries loaded by torch's allow-list unpickler."""

    def load_bytes(self, read_item, value) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            first = str(e).splitlines()[0][:120]
            raise HostileCheckpoint(f"checkpoint entry {read_item.dest_index.fqn} asks to load an object outside "
                                    f"torch's weights-only allow-list: refused ({first})") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
