"""The refusal every annotation service raises."""

from __future__ import annotations


class AnnotationError(Exception):
    """A refused annotation action: `status` is the HTTP status the API answers with, `field`
    the field of the request it names (None when it is about no field)."""

    def __init__(self, message: str, *, status: int = 400, field: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field


NOT_ASSIGNED = "This campaign is assigned to other annotators."
