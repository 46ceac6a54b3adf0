"""Where this process stands in a PyTorch job: torch's dataset bases (``object`` without
torch), its DataLoader worker, its rank, and the batch size of the DataLoader pulling
from it. Used by the datasets, the sampler and the step timer."""

import os
import sys
from typing import Optional, Tuple


def dataset_bases() -> Tuple[type, type]:
    """torch's Dataset/IterableDataset when torch is installed, else ``object``."""
    try:
        from torch.utils.data import Dataset, IterableDataset

        return Dataset, IterableDataset
    except ImportError:
        return object, object



def worker() -> Tuple[int, int]:
    """(worker id, number of workers) inside a DataLoader worker, else (0, 1)."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 0, 1
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def rank_and_world() -> Tuple[int, int]:
    """torch.distributed's rank and world size when initialised, else $RANK/$WORLD_SIZE."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def loader_batch_size() -> Optional[int]:
    """The batch size of the DataLoader that pulls from the iterator calling this, read
    from torch's fetcher (``_IterableDatasetFetcher.fetch`` asks ``next()`` once per
    place of ``possibly_batched_index``); ``None`` outside a DataLoader, with
    ``batch_size=None``, or where torch's fetcher is not what this reads."""
    frame = sys._getframe(2)  # this function <- the iterator's body <- whoever called next()
    fetcher = frame.f_locals.get("self") if frame.f_code.co_name == "fetch" else None
    if not getattr(fetcher, "auto_collation", False) or not hasattr(fetcher, "dataset_iter"):
        return None
    try:
        return len(frame.f_locals["possibly_batched_index"])
    except (KeyError, TypeError):
        return None
