"""Stand-in for Hugging Face `datasets`, for bench/peer_step.sh only: torchtitan 0.3.0 imports it at
module level for its text-dataset loader, which the anchor never runs (its config feeds synthetic
tokens from its own loader). Anything here that is actually called refuses loudly, so a run that did
reach a dataset would fail rather than measure something else."""


class Dataset:  # a name imported for annotations and isinstance checks only
    def __init__(self, *a, **k):
        raise RuntimeError("datasets stub: the torchtitan anchor must not build a Hugging Face dataset")


class IterableDataset(Dataset):
    pass


def load_dataset(*a, **k):
    raise RuntimeError("datasets stub: the torchtitan anchor must not load a dataset")


def concatenate_datasets(*a, **k):
    raise RuntimeError("datasets stub: the torchtitan anchor must not load a dataset")
