"""A kubeconfig (or the pod's service account) loaded into a client ``Configuration``, checked first.

The official client takes what it is given on trust: a ``KUBECONFIG`` path that is a FIFO blocks
it, one that links to ``/dev/zero`` fills memory, a ``server: 123`` is a traceback, an
``insecure-skip-tls-verify: "false"`` turns verification off, and an exec credential plugin that
fails is logged and passed over, so every request then goes without credentials. Here, before
the client reads anything:

- the files: ``--kubeconfig``, else each path in ``KUBECONFIG`` (``:``-separated; missing ones are
  skipped, as kubectl does, but not all of them), else ``~/.kube/config``, and the files the chosen
  cluster and user name (``certificate-authority``, ``client-certificate``, ``client-key``,
  ``tokenFile``): each a regular file of bounded size (:func:`gpuwarden.fleet.inputs.checked_input`);
- the shape: each file a YAML mapping whose ``clusters``, ``contexts`` and ``users`` are lists of
  named mappings; the chosen context's cluster and user have each field the client reads of its
  type (``server`` an http(s) URL, flags true or false, paths and names strings, ``exec`` a mapping
  with a ``command``, its ``args`` a list of strings);
- an exec credential plugin runs at load: a failure is an error naming the plugin and what it said.

Every refusal is a ValueError of one line, ``cannot load the kubeconfig ...``, exit 2 at the CLI.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kubernetes import client, config

from gpuwarden.fleet.inputs import MAX_CONFIG_FILE_BYTES, MAX_SECRET_FILE_BYTES, checked_input

_TYPES = {"a string": str, "true or false": bool, "a mapping": dict}
CONTEXT_FIELDS = {"cluster": "a string", "user": "a string", "namespace": "a string"}
CLUSTER_FIELDS = {"server": "a string", "certificate-authority": "a string", "certificate-authority-data": "a string",
                  "insecure-skip-tls-verify": "true or false", "tls-server-name": "a string", "proxy-url": "a string"}
USER_FIELDS = {"token": "a string", "tokenFile": "a string", "client-certificate": "a string",
               "client-certificate-data": "a string", "client-key": "a string", "client-key-data": "a string",
               "username": "a string", "password": "a string", "exec": "a mapping", "auth-provider": "a mapping"}
EXEC_FIELDS = {"command": "a string", "apiVersion": "a string", "provideClusterInfo": "true or false"}
NAMED_FILES = {"certificate-authority", "client-certificate", "client-key", "tokenFile"}


class _Refused(ValueError):
    """A reason; :func:`load_configuration` puts the file before it."""


def load_configuration(kubeconfig: str | None = None, in_cluster: bool = False,
                       context: str | None = None) -> client.Configuration:
    """The client's Configuration; a ValueError of one line when it cannot be loaded."""
    configuration = client.Configuration()
    if in_cluster:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except (config.ConfigException, OSError, ValueError) as error:
            raise ValueError(f"cannot load the in-cluster service account: {_one_line(error)}") from None
        return configuration
    where, paths = _paths(kubeconfig)
    try:
        files = [(path, _read(path)) for path in paths]
        _check(files, context)
        said = _ClientLog()
        logging.getLogger().addFilter(said)  # the client logs a failed exec plugin on the root logger, and goes on
        try:
            config.load_kube_config(config_file=os.pathsep.join(paths), context=context,
                                    client_configuration=configuration)
        finally:
            logging.getLogger().removeFilter(said)
        if said.lines:
            raise _Refused(f"the exec credential plugin {_plugin(files, context)!r} failed: {said.lines[0]}")
    except (_Refused, config.ConfigException, OSError, TypeError, ValueError, yaml.YAMLError,
            AttributeError, KeyError, IndexError) as error:  # the client's own reading of a shape it did not expect
        said_text = _one_line(error)
        raise ValueError(said_text if said_text.startswith(where) else f"{where}: {said_text}") from None
    return configuration


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:600]


def _paths(kubeconfig: str | None) -> tuple[str, list[str]]:
    """What the error names, and the files to read (each checked)."""
    if kubeconfig:
        where = f"cannot load the kubeconfig {kubeconfig}"
        checked_input(kubeconfig, "cannot load the kubeconfig", MAX_CONFIG_FILE_BYTES, raising=ValueError)
        return where, [kubeconfig]
    named = os.environ.get("KUBECONFIG", "")
    if not named.strip(os.pathsep):
        default = os.path.expanduser("~/.kube/config")
        checked_input(default, "cannot load the kubeconfig", MAX_CONFIG_FILE_BYTES, raising=ValueError)
        return f"cannot load the kubeconfig {default}", [default]
    listed = [os.path.expanduser(p) for p in named.split(os.pathsep) if p]
    present = [p for p in listed if os.path.exists(p)]  # a FIFO or a device exists: it is refused below
    for path in present or listed[:1]:  # none there: the first one's "no such file"
        checked_input(path, "cannot load the kubeconfig from KUBECONFIG", MAX_CONFIG_FILE_BYTES, raising=ValueError)
    return f"cannot load the kubeconfig from KUBECONFIG {named}", present


def _read(path: str) -> dict[str, Any]:
    document = yaml.safe_load(Path(path).read_bytes())
    if document is None:
        raise _Refused(f"{path} is empty")
    if not isinstance(document, dict):
        raise _Refused(f"{path} is a YAML {type(document).__name__}, not a kubeconfig (a mapping of clusters, "
                       "contexts and users)")
    for key in ("clusters", "contexts", "users"):
        entries = document.get(key) or []
        if not isinstance(entries, list):
            raise _Refused(f"{path}: {key} is {_kind(entries)}, not a list")
        for position, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise _Refused(f"{path}: {key}[{position}] is not a mapping with a string name")
    if "current-context" in document and not isinstance(document["current-context"], str | None):
        raise _Refused(f"{path}: current-context is {_kind(document['current-context'])}, not a string")
    return document


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    names = {int: "a number", float: "a number", str: "a string", list: "a list", dict: "a mapping"}
    return names.get(type(value), f"a {type(value).__name__}")


def _entry(files: list[tuple[str, dict[str, Any]]], key: str, name: str) -> tuple[str, dict[str, Any]] | None:
    """The first file's entry of that name (the client merges so), and its file."""
    for path, document in files:
        for entry in document.get(key) or []:
            if entry["name"] == name:
                return path, entry
    return None


def _chosen(files: list[tuple[str, dict[str, Any]]], context: str | None) -> str | None:
    if context:
        return context
    current = [d["current-context"] for _, d in files if d.get("current-context")]
    return current[-1] if current else None  # the client lets the last file that sets it win


def _check(files: list[tuple[str, dict[str, Any]]], context: str | None) -> None:
    """The chosen context's cluster and user: each field of its type, each file named a regular file."""
    name = _chosen(files, context)
    found = _entry(files, "contexts", name) if name else None
    if found is None:
        return  # the client says which context is missing
    _, entry = found
    fields = _fields(entry, "context", f"context {name}", CONTEXT_FIELDS)
    cluster = _entry(files, "clusters", fields["cluster"]) if isinstance(fields.get("cluster"), str) else None
    if cluster is not None:
        path, values = cluster[0], _fields(cluster[1], "cluster", f"cluster {fields['cluster']}", CLUSTER_FIELDS)
        _check_url(values.get("server"), f"cluster {fields['cluster']}: server", required=True)
        _check_url(values.get("proxy-url"), f"cluster {fields['cluster']}: proxy-url", schemes=("http", "https",
                                                                                                 "socks5", "socks5h"))
        _check_files(values, path, f"cluster {fields['cluster']}")
    user = _entry(files, "users", fields["user"]) if isinstance(fields.get("user"), str) else None
    if user is not None:
        path, values = user[0], _fields(user[1], "user", f"user {fields['user']}", USER_FIELDS)
        _check_files(values, path, f"user {fields['user']}")
        if "exec" in values:
            _check_exec(values["exec"], f"user {fields['user']}: exec")


def _fields(entry: dict[str, Any], key: str, where: str, types: dict[str, str]) -> dict[str, Any]:
    values = entry.get(key)
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise _Refused(f"{where}: {key} is {_kind(values)}, not a mapping")
    for field, expected in types.items():
        if field in values and not _is(values[field], expected):
            raise _Refused(f"{where}: {field} is {_kind(values[field])}, not {expected}")
    return values


def _is(value: object, expected: str) -> bool:
    kind = _TYPES[expected]
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _check_url(value: object, where: str, required: bool = False, schemes: tuple[str, ...] = ("http", "https")) -> None:
    if value is None:
        if required:
            raise _Refused(f"{where} is missing (the API server's URL)")
        return
    text = str(value)
    usable = text.isprintable() and " " not in text and text.startswith(tuple(f"{s}://" for s in schemes))
    if not usable or not urlsplit(text).hostname:
        raise _Refused(f"{where} {text[:80]!r} is not a URL ({' or '.join(schemes)}://HOST[:PORT])")


def _check_files(values: dict[str, Any], kubeconfig_path: str, where: str) -> None:
    base = Path(kubeconfig_path).parent
    for field in sorted(NAMED_FILES & values.keys()):
        named = Path(os.path.expanduser(values[field]))
        checked_input(named if named.is_absolute() else base / named, f"{where}: {field}", MAX_SECRET_FILE_BYTES,
                      raising=_Refused)


def _check_exec(plugin: dict[str, Any], where: str) -> None:
    for field, expected in EXEC_FIELDS.items():
        if field in plugin and not _is(plugin[field], expected):
            raise _Refused(f"{where}: {field} is {_kind(plugin[field])}, not {expected}")
    if not plugin.get("command"):
        raise _Refused(f"{where}: the exec credential plugin has no command")
    args = plugin.get("args")
    if args is not None and not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        raise _Refused(f"{where}: args is {_kind(args)}, not a list of strings")
    env = plugin.get("env")
    if env is not None and not (isinstance(env, list) and all(
            isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("value"), str) for e in env)):
        raise _Refused(f"{where}: env is not a list of name/value pairs of strings")


def _plugin(files: list[tuple[str, dict[str, Any]]], context: str | None) -> str:
    name = _chosen(files, context)
    found = _entry(files, "contexts", name) if name else None
    user = (found[1].get("context") or {}).get("user") if found else None
    entry = _entry(files, "users", user) if isinstance(user, str) else None
    return str(((entry[1].get("user") or {}).get("exec") or {}).get("command", "?")) if entry else "?"


class _ClientLog(logging.Filter):
    """Takes the official client's own log lines (an exec plugin that failed) off the root logger."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "root" and record.module in ("kube_config", "exec_provider"):
            self.lines.append(" ".join(record.getMessage().split()))
            return False
        return True
