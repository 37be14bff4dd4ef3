"""The library's one error type for a model that cannot be loaded or run.

`ModelError`'s message is meant for the submitter (a readable reason, with server paths named
by their roots); apps show it as the run's failure reason or as a 4xx body's `detail`. It lives
here, below every sub-package, so that the LLM client, benchmark construction and the reward
models can all raise it without importing one another."""


class ModelError(Exception):
    """A model that cannot be loaded or run; the message is shown to the submitter."""
