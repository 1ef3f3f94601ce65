"""Run state on disk: checkpoints, optimizer state, older formats upgraded, the version.
Imports the platform and the step."""
