"""Tracking URIs and storage paths: made absolute where a run is found again from elsewhere, and
never shown, logged or stored with their credentials."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"


def absolute_tracking_uri(uri: str) -> str:
    """Pin a relative local store to an absolute path: a resume from another folder, a trial in
    another process or node, must reach the same store (not create an empty one)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rest = uri[len("sqlite:///"):]
        if rest and rest != ":memory:":
            return "sqlite:///" + os.path.abspath(rest)
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file:" + os.path.abspath(uri[len("file:"):])
    if "://" not in uri and not uri.startswith(("file:", "databricks", "sqlite:")):
        return os.path.abspath(uri)
    return uri


def redact_uri(uri: str) -> str:
    """``uri`` with any password (``scheme://user:PASSWORD@host``) and secret-looking query values
    (token, password, secret, key, signature) replaced by ``***``: safe to print, log or store."""
    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{REDACTED}@{host}" if ":" in userinfo else f"{REDACTED}@{host}"
    query = re.sub(r"(?i)((?:^|&)[^=&]*(?:token|password|passwd|secret|key|signature)[^=&]*=)[^&]*",
                   rf"\g<1>{REDACTED}", parts.query)
    if (netloc, query) == (parts.netloc, parts.query):
        return uri  # nothing secret (and urlunsplit would rewrite e.g. sqlite:////abs as sqlite://abs)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_credentials(uri: str) -> bool:
    return redact_uri(uri) != uri
