"""See the package docstring: a name torchtitan imports, never called by the anchor."""


def split_dataset_by_node(*a, **k):
    raise RuntimeError("datasets stub: the torchtitan anchor must not split a dataset")
