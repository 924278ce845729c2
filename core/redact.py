"""Masking secrets wherever a value is shown: `motor config show`, `/debug/state`, log lines.

A value is secret by its name (`password`, `token`, `api_keys`, `HF_TOKEN`, ...), and a URL's
password part is secret wherever the URL appears. Pure functions; the shape of what is
masked is kept (a list of three keys shows three masks), so an operator still sees what is set.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# A name is secret when it ends in one of these words (case-insensitive, `_`/`-`/`.` joins):
# `HF_TOKEN`, `nats.password`, `admin_keys`, `AWS_SECRET_ACCESS_KEY`. `max_tokens` and
# `key_file` (a path) are not.
_SECRET_NAME = re.compile(
    r"(?:^|[_\-.])(?:pass(?:word|wd)?|secret|token|auth(?:orization)?|cookie|credentials?|"
    r"(?:api|admin|access|private|secret|signing)[_\-]?keys?|apikeys?)$",
    re.IGNORECASE,
)
_URL_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@\s]*)@")


def secret_name(name: str) -> bool:
    """Whether a field, key or variable of this name holds a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_url(url: str) -> str:
    """`scheme://user:pass@host` with the password masked; a lone userinfo is a token."""
    m = _URL_USERINFO.match(url)
    if m is None:
        return url
    user, sep, _ = m.group("userinfo").partition(":")
    shown = f"{user}:{MASK}" if sep else MASK
    return f"{m.group('scheme')}{shown}@{url[m.end() :]}"


def redact(value: Any) -> Any:
    """A copy of a JSON-like value with secret-named entries and URL passwords masked."""
    if isinstance(value, dict):
        return {k: _masked(v) if secret_name(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_url(value)
    return value


def _masked(value: Any) -> Any:
    if value is None or value == "" or value == []:
        return value  # unset stays visibly unset
    if isinstance(value, list | tuple):
        return [MASK for _ in value]
    if isinstance(value, dict):
        return {k: MASK for k in value}
    return MASK
