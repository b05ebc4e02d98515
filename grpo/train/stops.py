"""How a run stops before its last step: on a health check, or on Ctrl-C."""


class TrainingStopped(RuntimeError):
    """The run stopped on a health check; the message says which and why."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run; the message says at which step and which checkpoint holds it."""
