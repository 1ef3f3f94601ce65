"""The programs: train, evaluate, predict, export, bench, launch, pack (``gluon-gpu-*``)."""
