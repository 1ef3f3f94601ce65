"""The platform: devices and threads, the environment MXNet reads, memory and cgroups,
errors, files, signals, worker pools. Imports nothing else of core."""
