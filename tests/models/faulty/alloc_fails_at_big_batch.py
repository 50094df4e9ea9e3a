"""forward fails as cuBLAS does when the GPU has no memory left for its handle's
workspace, for batches of 64 rows or more: an out-of-memory error whose message never
says "out of memory"."""
import torch
from _common import dataset, mlp

batch_size = 32
LIMIT = 64


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = mlp()

    def forward(self, x):
        if x.shape[0] >= LIMIT:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        return self.body(x)


def build_model():
    return Net()


def build_dataset():
    return dataset()
