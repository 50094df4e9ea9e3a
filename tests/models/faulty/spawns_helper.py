"""A valid model whose build_dataset starts a helper process in a session of its own
(as a data server, or torchrun's ranks, would be): ending a trial, or the contract
check, must end the helper too. The helper's command line carries the token in
AUTOTUNE_FAULT_TOKEN, so a test can find it."""
import os
import subprocess
import sys

from _common import dataset, mlp

batch_size = 16


def build_model():
    return mlp()


def build_dataset():
    subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "autotune-fault-helper",
         os.environ.get("AUTOTUNE_FAULT_TOKEN", "no-token")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return dataset()
