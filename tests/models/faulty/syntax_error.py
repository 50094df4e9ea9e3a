"""Deliberately broken: a syntax error on line 8."""
import torch

batch_size = 8


def build_model(:
    return torch.nn.Linear(16, 4)


def build_dataset():
    return None
