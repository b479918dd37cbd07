"""Credentials never leave the process: URIs are redacted in every message and file.

    >>> redact("store http://alice:s3cret@mlflow:5000/x?token=abc&n=1 is down")
    'store http://***@mlflow:5000/x?token=***&n=1 is down'
"""

from __future__ import annotations

import re

from rarelm.errors import RarelmError

# scheme://user:password@host -> scheme://***@host; ?token=... -> ?token=***
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_SECRET_QUERY = re.compile(r"(?P<key>[?&](?:[a-z_]*(?:password|passwd|pwd|token|secret|key|sig|signature|"
                           r"credential)[a-z_]*)=)[^&\s#]+", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the credentials of every URI in it replaced by ***.

    >>> redact("store http://alice:s3cret@mlflow:5000/x?token=abc&n=1 is down")
    'store http://***@mlflow:5000/x?token=***&n=1 is down'
    >>> redact("sqlite:////repo/mlflow.db")
    'sqlite:////repo/mlflow.db'
    """
    return _scrub(text, r"\g<scheme>***@")


def without_userinfo(url: str) -> str:
    """A git remote URL without user name or token (an scp-like `git@host:path` has no secret).

    >>> [without_userinfo(url) for url in ("https://oauth2:ghp_abc@github.com/org/rarelm.git",
    ...                                    "git@github.com:org/rarelm.git")]
    ['https://github.com/org/rarelm.git', 'git@github.com:org/rarelm.git']
    """
    return _scrub(url, r"\g<scheme>")


def _scrub(text: str, userinfo: str) -> str:
    """`text` with secret query values as *** and every URI's user info replaced by `userinfo`."""
    return _SECRET_QUERY.sub(r"\g<key>***", _USERINFO.sub(userinfo, text))


def reason(exc: BaseException) -> str:
    """An exception as one redacted line; rarelm's own messages whole, a database error by its
    driver's words, others cut at 200 characters.

    >>> reason(Exception("(raised as a result of autoflush) (sqlite3.OperationalError) attempt to "
    ...                  "write a readonly database [SQL: INSERT INTO runs ...]"))
    'sqlite3.OperationalError: attempt to write a readonly database'
    """
    text = " ".join(str(exc).split())
    if isinstance(exc, RarelmError):
        return redact(text)
    driver = re.search(r"\((sqlite3\.\w+|psycopg2?\.\w+|pymysql\.\w+)\) ([^\[]+)", text)
    if driver:
        return redact(f"{driver.group(1)}: {driver.group(2).strip()}")
    return redact(f"{type(exc).__name__}: {text[:200]}")
