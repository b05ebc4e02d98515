"""A training run: the trainer loop, the task stream, held-out evaluation, checkpoints, the metrics
logger and the curves of a run."""
