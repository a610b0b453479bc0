"""The typed errors a user can meet. The CLI turns each into one paragraph and a non-zero exit."""


class PipelabError(Exception):
    """Base class of every error pipelab raises on purpose."""

    exit_status = 2  # bad input; an error of a run that started may say otherwise


class ConfigError(PipelabError):
    """A config value is wrong. The message names the key, the value and what is allowed."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class DataError(PipelabError):
    """A dataset cannot be read (missing files, wrong format)."""


class WireError(PipelabError):
    """A packet on the wire is malformed: the one error decoding may raise."""


class DeadlockError(PipelabError):
    """Every role waits on something that will never arrive."""
