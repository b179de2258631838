"""The serving policy: what an operator configures and what a request may ask.

An operator configures the guard once, for the whole engine (:meth:`ServingConfig.find`): in
vLLM's ``additional_config={"memfree": {...}}``, or in the environment (``MEMFREE_FILTER`` holding
the filter's path, or ``MEMFREE_CONFIG`` the path of a JSON file with the same keys)::

    {"filter": "stdlib.memfree",   # required: the filter file
     "allow_opt_out": false,       # may a request switch the guard off? (default: no)
     "ngram_size": 10,             # optional: refuse a filter of another n
     "log_interval_s": 60,         # a log line of what the guard did, every so often (0: none)
     "exempt_prompt": false,       # may an output repeat stored n-grams of its own prompt?
                                   # false; true (every request); "on_request" (requests that
                                   # ask with extra_args={"memfree_exempt_prompt": 1})
     "allow_empty": false}         # accept a filter that stores no n-gram (it guards nothing)

A configuration that is present but empty (``MEMFREE_FILTER`` or ``MEMFREE_CONFIG`` exported but
empty, ``additional_config={"memfree": null}`` or ``{"memfree": {}}``, a settings file holding
``null`` or ``{}``) is a mistake, not "not configured": it is refused, naming it, rather than leave
the engine unguarded. To run without the guard, leave the setting out.

Every request is guarded. Only where the operator allowed it may a request switch the guard off,
with ``extra_args={"memfree": 0}`` (``vllm_xargs`` over HTTP); 0/1/true/false are accepted, anything
else is refused with a clear error (HTTP 400). A request that asks to switch it off where that is
not allowed stays guarded: a client can never turn the guard off by itself.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memfree.errors import ServingConfigError
from memfree.storage import is_url

CONFIG_KEY = "memfree"  # the key in additional_config and in a request's extra_args
EXEMPT_KEY = "memfree_exempt_prompt"  # a request's ask for exempt_prompt="on_request"
ON_REQUEST = "on_request"
_KEYS = (
    "filter",
    "allow_opt_out",
    "ngram_size",
    "canonical",
    "log_interval_s",
    "exempt_prompt",
    "allow_empty",
)
FILTER_ENV = "MEMFREE_FILTER"
CONFIG_ENV = "MEMFREE_CONFIG"
DEFAULT_LOG_INTERVAL_S = 60.0
_TRUE = ("1", "true")
_FALSE = ("0", "false")
_ABSENT = object()  # a key not given at all (not the same as one given as null)
_SHAPE = '{"filter": "PATH", "allow_opt_out": false}'


@dataclass(frozen=True)
class ServingConfig:
    """The operator's settings.

    Attributes:
        filter: path of the filter file.
        allow_opt_out: whether a request may switch the guard off.
        ngram_size: the n the operator expects (None: any).
        canonical: token filters: canonical decoding (None: on; False: guard the ids only).
        log_interval_s: seconds between the engine's log lines of what the guard did (0: none).
        source: where the settings came from (named in messages).
        exempt_prompt: a stored n-gram that occurs in a request's own prompt is not banned in
            its output (:mod:`memfree.core.exempt`): False (default), True (every request) or
            "on_request" (only a request that asks, ``extra_args={"memfree_exempt_prompt": 1}``).
        allow_empty: accept a filter that stores no n-gram (refused by default: it guards
            nothing).
    """

    filter: str
    allow_opt_out: bool = False
    ngram_size: int | None = None
    canonical: bool | None = None
    log_interval_s: float = DEFAULT_LOG_INTERVAL_S
    source: str = "additional_config"
    exempt_prompt: bool | str = False
    allow_empty: bool = False

    def setting(self, key: str) -> str:
        """How the operator names ``key`` where these settings came from, e.g.
        ``additional_config['memfree']['filter']``, ``MEMFREE_CONFIG=memfree.json['filter']`` or
        ``MEMFREE_FILTER`` (which sets the filter only)."""
        if self.source == FILTER_ENV:
            return FILTER_ENV if key == "filter" else f"{CONFIG_ENV}'s {key!r}"
        if self.source.startswith(f"{CONFIG_ENV}="):
            return f"{self.source}[{key!r}]"
        return f"{self.source}[{CONFIG_KEY!r}][{key!r}]"

    def allow_empty_fix(self) -> str:
        """How to accept a filter of no n-gram, in the operator's terms."""
        if self.source == FILTER_ENV:
            return (
                f"set {CONFIG_ENV} (instead of {FILTER_ENV}) to a JSON file of "
                f'{{"filter": {json.dumps(self.filter)}, "allow_empty": true}}'
            )
        if self.source.startswith(f"{CONFIG_ENV}="):
            return f'add "allow_empty": true to the settings of {self.source}'
        return f"set {self.setting('allow_empty')} to true"

    def missing_filter(self, error: FileNotFoundError) -> str:
        """The message for a filter path that names no file: the setting, the path, that it does
        not exist (where it was looked for) and what to do."""
        path = self.filter
        name = self.setting("filter")
        subject = f"{name}={path}" if self.source == FILTER_ENV else f"{name} ({path})"
        if is_url(path):  # an object: the store's answer (no such object or bucket)
            return f"{subject}: {error.strerror or error}"
        if os.path.islink(path) and not os.path.exists(path):
            problem = f"a symbolic link to {os.readlink(path)!r}, which does not exist"
        elif not os.path.lexists(path):
            problem = "the filter file does not exist"
        else:  # the path exists: another file is missing (the error names it)
            return f"{subject}: {error}"
        absolute = os.path.abspath(path)
        looked = "" if absolute == path else f" (looked for {absolute})"
        return (
            f"{subject}: {problem}{looked}; set {name} to the path of an existing filter file "
            "(a relative path is read from the engine's working directory), or build one there "
            "with `memfree build`"
        )

    @classmethod
    def find(
        cls, additional_config: Any, environ: Mapping[str, str] | None = None
    ) -> ServingConfig | None:
        """The operator's settings: ``additional_config["memfree"]`` if present, else the
        environment's ``MEMFREE_CONFIG`` (a JSON file of the same keys) or ``MEMFREE_FILTER``
        (the filter's path, every other setting at its default); None when there is none.

        Raises:
            ServingConfigError: a configuration is present but wrong (a bad key or value, an
                unreadable or malformed file, both variables set) or present but empty (a
                variable exported empty, ``{"memfree": null}`` or ``{}``, a file of ``null``).
        """
        if _lookup(additional_config, CONFIG_KEY) is not _ABSENT:
            return cls.parse(additional_config)
        environ = os.environ if environ is None else environ
        for name, what in (
            (CONFIG_ENV, "a JSON file of memfree's settings"),
            (FILTER_ENV, "a filter file"),
        ):
            if name in environ and not environ[name].strip():
                raise ServingConfigError(
                    f"{name} is set but empty ({name}={environ[name]!r}): a memfree "
                    "configuration that is present but empty is refused rather than leave the "
                    f"engine unguarded; set {name} to the path of {what}, or unset it "
                    f"(`unset {name}`) to run without the guard"
                )
        path, filter_path = environ.get(CONFIG_ENV, ""), environ.get(FILTER_ENV, "")
        if path and filter_path:
            raise ServingConfigError(
                f"both {CONFIG_ENV} and {FILTER_ENV} are set: set one (put the filter's path in "
                f'{CONFIG_ENV}\'s file as "filter")'
            )
        if path:
            where = f"{CONFIG_ENV}={path}"
            try:
                with open(path, encoding="utf-8") as handle:
                    settings = json.load(handle)
            except (OSError, ValueError) as error:
                raise ServingConfigError(
                    f"{where}: cannot read it as a JSON file of memfree's settings "
                    f"({error}); write e.g. {_SHAPE}"
                ) from None
            if not isinstance(settings, Mapping):
                raise ServingConfigError(
                    _not_settings(where, settings, _SHAPE, "must hold a JSON object of settings")
                )
            return cls._settings(settings, where, where, _SHAPE)
        if filter_path:
            return cls(filter_path, source=FILTER_ENV)
        return None

    @classmethod
    def parse(cls, additional_config: Any, where: str = "additional_config") -> ServingConfig:
        """The settings under ``additional_config["memfree"]``.

        Raises:
            ServingConfigError: missing, null, empty, not a mapping, an unknown key, or a bad
                value; the message shows the expected shape.
        """
        shape = f'{where}={{"{CONFIG_KEY}": {_SHAPE}}}'
        config = _lookup(additional_config, CONFIG_KEY)
        if config is _ABSENT:
            raise ServingConfigError(
                f"the memfree guard has no configuration: pass {shape} to the engine"
            )
        section = f"{where}[{CONFIG_KEY!r}]"
        if not isinstance(config, Mapping):
            raise ServingConfigError(_not_settings(section, config, shape, "must be a mapping"))
        return cls._settings(config, section, where, shape)

    @classmethod
    def _settings(
        cls, config: Mapping[str, Any], section: str, where: str, shape: str
    ) -> ServingConfig:
        """The settings of one mapping, named ``section`` in messages (``where``: their source).

        Raises:
            ServingConfigError: empty, an unknown key, or a bad value.
        """
        if not config:
            raise ServingConfigError(
                f"{section} is empty ({{}}): a memfree configuration that is present but empty "
                "is refused rather than leave the engine unguarded; give the filter, e.g. "
                f"{shape}, or leave the configuration out to run without the guard"
            )
        unknown = sorted(set(config) - set(_KEYS))
        if unknown:
            raise ServingConfigError(
                f"{section}: unknown key(s) {', '.join(map(repr, unknown))}; "
                f"memfree knows {', '.join(map(repr, _KEYS))}"
            )
        path = config.get("filter")
        if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
            raise ServingConfigError(
                f"{section}['filter'] must be the path of a filter file "
                f"(built with `memfree build`), got {path!r}"
            )
        flags = {}
        for key in ("allow_opt_out", "allow_empty"):
            flags[key] = config.get(key, False)
            if not isinstance(flags[key], bool):
                raise ServingConfigError(
                    f"{section}[{key!r}] must be true or false, got {flags[key]!r}"
                )
        size = config.get("ngram_size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ServingConfigError(
                f"{section}['ngram_size'] must be a positive integer, got {size!r}"
            )
        canonical = config.get("canonical")
        if canonical is not None and not isinstance(canonical, bool):
            raise ServingConfigError(
                f"{section}['canonical'] must be true or false, got {canonical!r}"
            )
        interval = config.get("log_interval_s", DEFAULT_LOG_INTERVAL_S)
        if (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not math.isfinite(interval)
            or interval < 0
        ):
            raise ServingConfigError(
                f"{section}['log_interval_s'] must be a finite number of seconds >= 0 "
                f"(0: no log lines), got {interval!r}"
            )
        exempt = config.get("exempt_prompt", False)
        if not isinstance(exempt, bool) and exempt != ON_REQUEST:
            raise ServingConfigError(
                f"{section}['exempt_prompt'] must be true, false or {ON_REQUEST!r}, got {exempt!r}"
            )
        return cls(
            os.fspath(path),
            flags["allow_opt_out"],
            size,
            canonical,
            float(interval),
            where,
            exempt,
            flags["allow_empty"],
        )


def _not_settings(name: str, value: Any, shape: str, must: str) -> str:
    """The message for settings that are not a mapping (``must``: what they must be): null is a
    configuration present but empty."""
    if value is None:
        return (
            f"{name} is null: a memfree configuration that is present but empty is refused "
            f"rather than leave the engine unguarded; give the settings, e.g. {shape}, or leave "
            "the configuration out to run without the guard"
        )
    kind = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return (
        f"{name} {must} like {shape}, got {kind.get(type(value), type(value).__name__)} {value!r}"
    )


def _lookup(config: Any, key: str) -> Any:
    """``config[key]`` (a mapping) or ``config.key``; ``_ABSENT`` when it has none."""
    if config is None:
        return _ABSENT
    if isinstance(config, Mapping):
        return config.get(key, _ABSENT)
    return getattr(config, key, _ABSENT)


def requested_exemption(extra_args: Any) -> bool | None:
    """What a request asked in ``extra_args["memfree_exempt_prompt"]``: True, False or None.

    Raises:
        ValueError: a value other than 0/1/true/false (vLLM answers HTTP 400).
    """
    return _flag(extra_args, EXEMPT_KEY)


def requested_guard(extra_args: Any) -> bool | None:
    """What a request asked for in its ``extra_args``: True (guard), False (no guard) or None
    (nothing).

    Raises:
        ValueError: a value other than 0/1/true/false (vLLM answers HTTP 400).
    """
    return _flag(extra_args, CONFIG_KEY)


def _flag(extra_args: Any, key: str) -> bool | None:
    """A request's 0/1/true/false under ``key`` of its ``extra_args`` (None: absent)."""
    if not extra_args:
        return None
    if not isinstance(extra_args, Mapping):
        raise ValueError(f"extra_args must be a mapping, got {type(extra_args).__name__}")
    if key not in extra_args:
        return None
    value = extra_args[key]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(
        f"extra_args[{key!r}] (vllm_xargs over HTTP) must be 0, 1, true or false, got {value!r}"
    )


__all__ = [
    "CONFIG_ENV",
    "CONFIG_KEY",
    "EXEMPT_KEY",
    "FILTER_ENV",
    "ON_REQUEST",
    "ServingConfig",
    "ServingConfigError",
    "requested_exemption",
    "requested_guard",
]
