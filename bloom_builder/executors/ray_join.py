"""Joining a running Ray cluster: the ``ray_address`` setting checked before any work, then a
connection that fails within seconds, naming the address and the fix, where Ray alone would retry
an unreachable address for 14 minutes or print a traceback.

The setting's check speaks the settings' terms (``ray_address``; the CLI names its flag); a
cluster that cannot be joined is a :class:`~bloom_builder.errors.RayUnavailable` whose message
names ``--ray-address`` itself, as the build's other runtime errors name the options to change.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import socket
import time

from bloom_builder.errors import RayUnavailable

# How long joining a cluster may take before the build gives up, in seconds (a refused
# connection fails at once): Ray's own retries would wait up to 14 minutes.
CONNECT_TIMEOUT_ENV = "MEMFREE_RAY_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 10.0

_ADDRESS_FIX = (
    "pass the cluster's address HOST:PORT (as `ray start --head` printed it; port 6379 by "
    "default), 'auto' for the cluster this node joined with `ray start`, ray://HOST:10001 for "
    "Ray Client, or leave {setting} out to start a local Ray"
)
#: How to fix a malformed ``ray_address``, in the settings' terms.
ADDRESS_FIX = _ADDRESS_FIX.format(setting="ray_address")

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")

# What a gRPC server (Ray's GCS, a Ray Client server) answers within milliseconds: the HTTP/2
# client preface plus an empty SETTINGS frame gets a SETTINGS frame (type 4) back. Anything
# else on that port (the dashboard, a web server) is not a cluster to join.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS_FRAME = 4


def ray_address_problem(address: str | None) -> str | None:
    """Why ``address`` cannot name a Ray cluster to join, naming the setting ``ray_address``, or
    None.

    Syntax only (and the ``ray[client]`` extra for ``ray://``): nothing is contacted, so the
    settings check it before any work. Also checks ``MEMFREE_RAY_CONNECT_TIMEOUT``.
    """
    if address is None:
        return None
    try:
        connect_timeout_s()
    except ValueError as error:
        return str(error)
    if address == "auto":
        return None
    if not address.strip():
        return f"ray_address is empty; {ADDRESS_FIX}"
    scheme, separator, rest = address.partition("://")
    if not separator:
        if _HOST_PORT.match(address) and 0 < int(address.rsplit(":", 1)[1]) < 1 << 16:
            return None
        return f"ray_address {address!r} is not HOST:PORT; {ADDRESS_FIX}"
    if scheme != "ray":
        return f"ray_address {address!r} is a {scheme}:// URL (a dashboard's?); {ADDRESS_FIX}"
    if not _HOST_PORT.match(rest):
        return f"ray_address {address!r}: a Ray Client address is ray://HOST:PORT (port 10001)"
    if importlib.util.find_spec("grpc") is None:
        return (
            f"ray_address {address!r} is a Ray Client address, which needs "
            "pip install 'ray[client]'; or run memfree on a node of the cluster with "
            "ray_address auto (or HOST:PORT of its GCS)"
        )
    return None


def connect_timeout_s() -> float:
    """Seconds a cluster may take to answer: ``MEMFREE_RAY_CONNECT_TIMEOUT``, else 10.

    Raises:
        ValueError: the variable is set but not a number of seconds > 0.
    """
    text = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ValueError(f"{CONNECT_TIMEOUT_ENV}={text!r} must be a number of seconds > 0, e.g. 10")
    return seconds


def join(address: str) -> None:
    """``ray.init`` a running cluster, or raise :class:`RayUnavailable` within the timeout.

    Ray itself retries an unreachable address for up to 14 minutes: a socket probe first fails
    fast on a refused, unknown or silent address and on a port that is not Ray, and Ray's own
    connection retries are cut to the timeout for what the probe cannot see.
    """
    import ray

    timeout_s = connect_timeout_s()
    shown, host, port = _target(address)
    problem = _probe(host, port, timeout_s)
    if problem:
        raise RayUnavailable(f"cannot join the Ray cluster at {shown}: {problem}")
    variable = "RAY_gcs_server_port_wait_time_s"  # Ray's GCS connection attempts, ~1 s each
    previous = os.environ.get(variable)
    if previous is None:
        os.environ[variable] = str(max(1, math.ceil(timeout_s)))
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as error:
        raise RayUnavailable(
            f"cannot join the Ray cluster at {shown}: {_refusal(error)}"
        ) from error
    finally:
        if previous is None:
            os.environ.pop(variable, None)


def _refusal(error: BaseException) -> str:
    """What Ray's refusal to join means, and the fix (its own words are Ray-internal)."""
    import ray

    said: list[str] = []
    cause: BaseException | None = error
    while cause is not None and len(said) < 8:
        said.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    if any("InvalidAuthToken" in text or "Unauthenticated" in text for text in said):
        return (
            "the cluster requires token authentication (Ray's default), which Ray turns on for "
            "an explicit address only when asked: set RAY_AUTH_MODE=token, with the cluster's "
            "token in ~/.ray/auth_token or RAY_AUTH_TOKEN; or run memfree on a node of the "
            "cluster with --ray-address auto"
        )
    return (
        f"{error}; check that it runs (`ray status` on its head node) and runs this Ray version "
        f"({ray.__version__}), or leave --ray-address out to start a local Ray"
    )


def _target(address: str) -> tuple[str, str, int]:
    """The address as the message shows it, and the host and port Ray will connect to.

    Resolved as ``ray.init`` resolves it: ``auto`` from ``RAY_ADDRESS`` or the cluster that
    ``ray start`` recorded on this node, a local host name to the node's IP address.
    """
    shown = address
    if address == "auto" and os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]
        shown = f"auto (RAY_ADDRESS={address})"
    if address.startswith("ray://"):
        return (shown, *_host_port(address[len("ray://") :], shown))
    resolved = address
    try:
        from ray._private import services

        resolved = services.canonicalize_bootstrap_address(address) or address
    except (ImportError, AttributeError):  # another Ray's internals: probe what was given
        pass
    except ConnectionError:
        raise RayUnavailable(
            "--ray-address auto: no Ray cluster runs on this node (RAY_ADDRESS is unset and "
            "`ray start` recorded none); start one with `ray start --head`, pass a cluster's "
            "address HOST:PORT, or leave --ray-address out to start a local Ray"
        ) from None
    except (OSError, ValueError) as error:
        raise RayUnavailable(f"cannot join the Ray cluster at {shown}: {error}") from None
    if resolved != address:
        shown = f"{shown} ({resolved})"
    return (shown, *_host_port(resolved, shown))


def _host_port(address: str, shown: str) -> tuple[str, int]:
    match = _HOST_PORT.match(address)
    if not match:
        fix = _ADDRESS_FIX.format(setting="--ray-address")
        raise RayUnavailable(f"--ray-address {shown} is not HOST:PORT; {fix}")
    return match["host"].strip("[]"), int(match["port"])


def _probe(host: str, port: int, timeout_s: float) -> str | None:
    """Why nothing that answers as Ray (a gRPC server) is at ``host:port``, or None."""
    deadline = time.monotonic() + timeout_s
    waited = f"within {timeout_s:g} s (set {CONNECT_TIMEOUT_ENV} to wait longer)"
    fix = (
        "check the host and port, that the cluster runs (`ray status` on its head node) and "
        "that this machine may reach it, or leave --ray-address out to start a local Ray"
    )
    try:
        connection = socket.create_connection((host, port), timeout=timeout_s)
    except socket.gaierror as error:
        return f"cannot resolve the host {host!r} ({error.strerror}); {fix}"
    except TimeoutError:
        return f"no answer {waited}; {fix}"
    except ConnectionRefusedError:
        return f"connection refused: nothing listens on port {port}; {fix}"
    except OSError as error:
        return f"{error.strerror or error}; {fix}"
    with connection:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return None  # a TLS server answers a TLS handshake only: Ray checks the rest
        try:
            reply = _first_frame_header(connection, deadline)
        except TimeoutError:
            return f"the port is open but does not answer as Ray {waited}; {fix}"
        except OSError:  # reset: not a server that speaks HTTP/2
            reply = b""
    if len(reply) < 9 or reply[3] != _SETTINGS_FRAME:
        return (
            "something answers there, but not Ray (the dashboard, port 8265, is not the "
            "cluster's address); pass the address `ray start --head` printed (port 6379 by "
            "default), or ray://HOST:10001 for Ray Client"
        )
    return None


def _first_frame_header(connection: socket.socket, deadline: float) -> bytes:
    """Send the HTTP/2 preface; the first 9 bytes of the answer (fewer if the peer closes)."""
    connection.sendall(_HTTP2_PREFACE)
    reply = b""
    while len(reply) < 9:
        connection.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = connection.recv(9 - len(reply))
        if not chunk:
            break
        reply += chunk
    return reply


__all__ = [
    "ADDRESS_FIX",
    "CONNECT_TIMEOUT_ENV",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "connect_timeout_s",
    "join",
    "ray_address_problem",
]
