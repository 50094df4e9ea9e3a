"""build_dataset blocks forever: a hang before the first step (only the trial
timeout can catch it)."""
import time

from _common import dataset, mlp

batch_size = 16


def build_model():
    return mlp()


def build_dataset():
    time.sleep(3600)
    return dataset()
