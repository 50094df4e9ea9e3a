"""A small valid model: the control case."""
from _common import dataset, mlp

batch_size = 16


def build_model():
    return mlp()


def build_dataset():
    return dataset()
