"""Tracking URIs and storage paths, never shown with their credentials.

Made absolute where a run is found again from elsewhere, never
shown, logged or stored with their credentials (nor handed to MLflow with them), and the folder a
local store keeps its artifacts in."""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit, urlunsplit

REDACTED = "***"


def absolute_tracking_uri(uri: str) -> str:
    """Pin a relative local store to an absolute path: a resume from another folder, a trial in
    another process or node, must reach the same store (not create an empty one)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rest = uri[len("sqlite:///") :]
        if rest and rest != ":memory:":
            return "sqlite:///" + os.path.abspath(rest)
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file:" + os.path.abspath(uri[len("file:") :])
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
    query = re.sub(
        r"(?i)((?:^|&)[^=&]*(?:token|password|passwd|secret|key|signature)[^=&]*=)[^&]*",
        rf"\g<1>{REDACTED}",
        parts.query,
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return uri  # nothing secret (and urlunsplit would rewrite e.g. sqlite:////abs as sqlite://abs)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_credentials(uri: str) -> bool:
    return redact_uri(uri) != uri


SECRET_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
"""A URI inside free text (an exception's message, a library's log line)."""


def redact_text(text: str) -> str:
    """``text`` with every URI in it redacted (:func:`redact_uri`): for messages that may quote one."""
    return SECRET_URI.sub(lambda m: redact_uri(m.group(0)), text)


def public_url(uri: str) -> str:
    """A server's address to print as a link: no user or password at all (a browser asks for them),
    secret-looking query values redacted."""
    parts = urlsplit(uri) if "://" in uri else None
    if parts is None or "@" not in parts.netloc:
        return redact_uri(uri)
    host = parts.netloc.rsplit("@", 1)[1]
    return redact_uri(urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)))


MLFLOW_USER, MLFLOW_PASSWORD = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"


def mlflow_uri(uri: str) -> str:
    """The URI to hand MLflow for the tracking store ``uri``.

    MLflow prints the URI it is given (the ``View run ... at`` lines of ``set_terminated``) and
    quotes it in its errors (``API request to <url> failed``), so a tracking server's
    ``user:password@`` must not reach it.  They move to MLflow's own credential variables
    (``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``, which it sends as basic auth, as it
    did with the URI's; variables already set win, as they did over the URI) and MLflow gets the
    URI without them.  A user without a password (``https://TOKEN@host``) cannot move there (MLflow
    sends a user only with a password): the URI stays, and MLflow is told not to print it.  Other
    URIs (a database's own login, local stores) are returned unchanged."""
    if not uri.startswith(("http://", "https://")):
        return uri
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    userinfo, host = parts.netloc.rsplit("@", 1)
    if ":" not in userinfo:
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        return uri

    user, password = userinfo.split(":", 1)
    if not (os.environ.get(MLFLOW_USER) and os.environ.get(MLFLOW_PASSWORD)):
        os.environ[MLFLOW_USER], os.environ[MLFLOW_PASSWORD] = unquote(user), unquote(password)
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


ARTIFACTS_FOLDER = "mlartifacts"  # the name MLflow's own server gives its artifact folder


def artifacts_destination(uri: str) -> str | None:
    """The local folder where the runs of tracking store ``uri`` keep their artifacts: beside a
    SQLite file (``<its folder>/mlartifacts``), or a file store's own folder.  ``None`` where the
    store decides (a tracking server's proxied artifacts) or has no folder (a database server).
    Without it MLflow puts them in ``./mlruns`` of whatever folder the command ran in."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :].split("?", 1)[0]
        if not path or path == ":memory:":
            return None
        return os.path.join(os.path.dirname(os.path.abspath(path)), ARTIFACTS_FOLDER)
    if uri.startswith("file:"):
        return os.path.abspath(urlsplit(uri).path or uri[len("file:") :])
    if "://" not in uri and not uri.startswith(("databricks", "sqlite:")):
        return os.path.abspath(uri)
    return None


def experiment_artifact_location(uri: str, name: str) -> str | None:
    """Where a new experiment ``name`` of store ``uri`` keeps its artifacts: a folder named after it
    under :func:`artifacts_destination` for a SQLite store; ``None`` (MLflow's choice) for a file
    store (its experiments' folders are already inside it) and for a server (its proxied artifacts)."""
    if not uri.startswith("sqlite:///"):
        return None
    root = artifacts_destination(uri)
    if root is None:
        return None
    folder = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "experiment"
    return os.path.join(root, folder[:100])
