"""The epoch loop (fit.py) and what watches it: callbacks, loggers, early stopping,
pruning, profiling, the weight average. Imports the groups below."""
