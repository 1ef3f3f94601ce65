"""The data-parallel step: the two strategies (parallel.py chooses), their graph,
gradients, kvstores, precision, heads, metrics, members and a job's workers. Imports
only the platform."""
