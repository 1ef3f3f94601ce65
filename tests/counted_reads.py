"""``python tests/counted_reads.py LOG_DIR TRAIN-FLAGS...``: gluon_gpu.train, with every
image a DataLoader worker decodes written to ``LOG_DIR/<training process id>.txt`` (the
distributed test counts what each worker of a job reads)."""
import os
import sys

from gluon_gpu.data import sources

LOG_DIR, TRAINING_PROCESS = sys.argv[1], os.getpid()
_read = sources.FolderSource.read


def counted_read(self, i):
    if os.getpid() != TRAINING_PROCESS:  # a DataLoader worker (the statistics' sample is read in the process)
        with open(os.path.join(LOG_DIR, f"{TRAINING_PROCESS}.txt"), "a") as f:
            f.write(self.paths[i] + "\n")
    return _read(self, i)


sources.FolderSource.read = counted_read

from gluon_gpu.programs import train  # noqa: E402  (after the patch, as the workers inherit it)

sys.exit(train.main(sys.argv[2:]))
