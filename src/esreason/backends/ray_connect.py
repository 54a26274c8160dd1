"""Reaching Ray: importing it (the ``ray`` extra) and checking a cluster address before Ray's own
long retries. Used by the engine pools (:mod:`esreason.backends.ray_pool`,
:mod:`esreason.backends.eval_pool`); Ray is imported lazily, here only.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Mapping

from esreason.errors import UserError

RAY_EXTRA_HINT = "pip install 'esreason[ray]'"


def import_ray() -> Any:
    """``import ray`` or a UserError naming the extra."""
    try:
        import ray
    except ImportError:
        raise UserError(f"backend.type=ray needs Ray, which is not installed: {RAY_EXTRA_HINT}") from None
    return ray


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast with a UserError when a Ray address ('host:port' or 'ray://host:port') is unreachable.

    'auto' and 'local' are left to Ray. Ray itself retries an unreachable GCS for a long time.
    """
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"config key 'backend.ray_address': expected 'host:port', 'ray://host:port' or 'auto' "
                        f"(got {address!r})")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UserError(f"config key 'backend.ray_address': cannot reach a Ray cluster at {address!r} "
                        f"({exc.strerror or exc}); start one with `ray start --head` or fix the address") from None


def local_address(environ: Mapping[str, str] | None = None) -> str | None:
    """The ``address`` for ``ray.init`` when esreason starts its own Ray instance.

    'local': a new instance, never the cluster that happens to run on this machine. Ray's default
    (``address=None``) joins the cluster last started by ``ray start`` (or ``ray.cluster_utils.Cluster``)
    on this machine, found through ``/tmp/ray/ray_current_cluster``; that file outlives a cluster
    killed without ``ray stop``, and ``ray.init`` then fails to connect to nothing. None when the
    user set ``RAY_ADDRESS``: Ray connects there, as its documentation promises.
    """
    env = os.environ if environ is None else environ
    return None if env.get("RAY_ADDRESS") else "local"


def connect_error(address: str | None, exc: BaseException) -> UserError:
    """The one-line UserError for a failed ``ray.init(address=...)``.

    Ray's ConnectionError says only "Failed to connect to Ray cluster at ..."; the reason sits in
    the exceptions chained below it. The common one: Ray 2.60's ``ray start --head`` turns on
    token authentication, and a driver connecting by address does not send the token unless
    ``RAY_AUTH_MODE=token`` is set where it runs (measured with Ray 2.60: the same driver connects
    once it is set, the token read from ``~/.ray/auth_token``, ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``).
    """
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    chain, seen = [], exc.__cause__ or exc.__context__
    while seen is not None and len(chain) < 8:
        chain.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    hint = ""
    if any("AuthenticationError" in text or "InvalidAuthToken" in text for text in chain):
        hint = ("; the cluster uses token authentication: set RAY_AUTH_MODE=token where esreason runs, with the "
                "cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH; docs/cluster.md)")
    return UserError(f"config key 'backend.ray_address': cannot connect to Ray at {address!r}: {first}{hint}")
