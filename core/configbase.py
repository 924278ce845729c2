"""What every config section shares: strict models (a typo is an error) and key-list checks."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A config section: unknown fields are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_keys(keys: list[str]) -> list[str]:
    """Each key non-empty and without whitespace."""
    for k in keys:
        if not k:
            raise ValueError("a key must not be empty")
        if any(c.isspace() for c in k):
            raise ValueError("a key must not contain whitespace")
    return keys


def one_of(model: BaseModel, field: str) -> None:
    """`field` and `field_file` are two ways to give one thing: not both."""
    if getattr(model, field) and getattr(model, f"{field}_file") is not None:
        raise ValueError(f"give {field} or {field}_file, not both")
