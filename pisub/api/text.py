"""What every line pisub shows goes through before it is printed: secrets redacted
(:func:`redact`); the terminal escaping is :mod:`pisub.termsafe`'s."""

from __future__ import annotations

from pisub.core.redact import redact

__all__ = ["redact"]
