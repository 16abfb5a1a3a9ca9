"""The one exception family moddeb raises; each carries a stable code shown to users."""

from __future__ import annotations


class ModdebError(Exception):
    """Base of every error moddeb reports to a user."""

    code = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} ({self.hint})"
        return self.message


class InvalidInput(ModdebError):
    """The user's source, flags or settings cannot be used as given."""

    code = "invalid-input"


class BuildFailed(ModdebError):
    """A build step ran and failed; retrying the same input will fail again."""

    code = "build-failed"


class Transient(ModdebError):
    """Something outside the input failed (engine, archive, network); a retry may work."""

    code = "transient"


class PublishFailed(ModdebError):
    """The apt repository refused or could not take the packages."""

    code = "publish-failed"
