"""Deliberately incomplete: no build_dataset()."""
from _common import mlp

batch_size = 16


def build_model():
    return mlp()
