"""One class for vLLM, under either model runner, loadable as a plugin: the guard with no code
change (:class:`MemFreeVllmLogitsProcessor`).

vLLM 0.32 builds every class registered under the ``vllm.logits_processors`` entry-point group
(memfree registers this one) in every engine of the environment, and V1's and Model Runner V2's
loaders each check the class against their own base class and call it with their own arguments:
``(vllm_config, device, is_pin_memory)`` for V1, ``(vllm_config, request_states)`` for V2. This
class subclasses both bases and picks the implementation from the arguments
(:class:`~memfree.engines.vllm_v1.V1Guard` or
:class:`~memfree.engines.vllm_v2.V2Guard`).

With no configuration (no ``additional_config["memfree"]``, no ``MEMFREE_FILTER`` or
``MEMFREE_CONFIG``) it is inert: it says so once at start-up, guards nothing and costs one call
that returns the logits (V1) or nothing at all (V2, which skips a processor no request needs).
A configuration that is present but wrong stops the engine with its message; so does one that is
present but empty (``MEMFREE_FILTER=`` or ``MEMFREE_CONFIG=`` exported empty,
``{"memfree": null}`` or ``{"memfree": {}}``), which would otherwise leave the engine unguarded, and
a filter that stores no n-gram (unless ``"allow_empty": true``). Built twice in one engine (the
entry point and ``--logits-processors``), the second instance stands aside.

Inside a step nothing raises (an exception there would kill the engine and every request on it): a
block of the filter found damaged on its first read closes the rows whose lookup reads it (end of
sequence only, at that step), the others are served, and the problem is logged once on
``vllm.memfree``, naming the file and the block.

Every ``log_interval_s`` seconds (60 by default) an active guard logs what it did: requests
guarded and opted out, steps and their rows, and how often it removed a row's first choice.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from memfree.engines.policy import CONFIG_ENV, FILTER_ENV, ServingConfig, ServingConfigError
from memfree.engines.vllm_common import no_configuration, validate_request
from memfree.engines.vllm_v1 import V1Guard
from memfree.engines.vllm_v2 import V2Guard

try:  # both bases import without Triton; without vLLM the class is a plain one
    from vllm.v1.sample.logits_processor.interface import LogitsProcessor as _V1Base
except ImportError:  # pragma: no cover - vLLM is optional
    _V1Base = None  # type: ignore[assignment,misc,unused-ignore]
try:
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as _V2Base
except ImportError:  # pragma: no cover - vLLM is optional
    _V2Base = None  # type: ignore[assignment,misc,unused-ignore]

logger = logging.getLogger("vllm.memfree")
_BASES: tuple[type, ...] = tuple(base for base in (_V1Base, _V2Base) if base is not None)
# The engines (by their configurations) a guard of this process already serves; each held, so
# that no other configuration ever takes its id.
_SERVING: dict[int, Any] = {}


class ServingLog:
    """What an active guard did, logged every ``interval`` seconds (never when 0)."""

    def __init__(self, source: str, interval: float) -> None:
        self.source = source
        self.interval = interval
        self.last = time.monotonic()
        self.totals = {"requests": 0, "opted_out": 0, "steps": 0, "rows": 0, "removed": 0}
        self.window = dict.fromkeys(self.totals, 0)
        self._removed: torch.Tensor | None = None  # on the logits' device: no sync per step

    def request(self, guarded: bool) -> None:
        self.window["requests" if guarded else "opted_out"] += 1

    def step(self, rows: int, first: torch.Tensor | None, logits: torch.Tensor) -> None:
        """A step that checked ``rows`` rows; ``first`` their first choices before the guard."""
        self.window["steps"] += 1
        self.window["rows"] += rows
        if first is not None:
            removed = torch.isneginf(logits.gather(1, first.unsqueeze(1))).sum()
            self._removed = removed if self._removed is None else self._removed + removed
        if self.interval and time.monotonic() - self.last >= self.interval:
            self.flush()

    def flush(self) -> str:
        """Log the window's counts and the totals; returns the line."""
        if self._removed is not None:
            self.window["removed"] += int(self._removed.item())
            self._removed = None
        for key, value in self.window.items():
            self.totals[key] += value
        seconds = time.monotonic() - self.last
        line = (
            f"memfree: in the last {seconds:.0f} s, {self.window['requests']} requests guarded "
            f"({self.window['opted_out']} opted out), {self.window['steps']} steps, "
            f"{self.window['rows']} rows, {self.window['removed']} first choices "
            f"removed; since start {self.totals['requests']} requests, {self.totals['rows']} "
            f"rows, {self.totals['removed']} removed (filter from {self.source})"
        )
        logger.info("%s", line)
        self.window = dict.fromkeys(self.totals, 0)
        self.last = time.monotonic()
        return line


class MemFreeVllmLogitsProcessor(*_BASES):  # type: ignore[misc]
    """MemFree decoding in vLLM, under the V1 runner or Model Runner V2, configured by the engine's
    ``additional_config["memfree"]`` or the environment (:meth:`ServingConfig.find`).

    Args:
        vllm_config: the engine's configuration.
        *runner_args: V1's ``(device, is_pin_memory)`` or V2's ``(request_states,)``.

    Attributes:
        active: the V1 or V2 implementation, or None (no configuration; another instance already
            guards this engine).

    Raises:
        ServingConfigError: a configuration is present but wrong.
        FilterError: the filter cannot be opened or does not fit the engine's tokenizer.
    """

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Refuse a request whose ``extra_args["memfree"]`` is not 0/1/true/false (HTTP 400)."""
        validate_request(sampling_params)

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        self.active: V1Guard | V2Guard | None = None
        self.log: ServingLog | None = None
        config = ServingConfig.find(getattr(vllm_config, "additional_config", None))
        named = _named(vllm_config)
        if config is None and named:  # asked for by name: a missing configuration is an error
            raise no_configuration()
        if config is None:
            logger.info(
                "memfree is installed but not configured: no request is guarded (set "
                "additional_config['memfree'], %s or %s to guard)",
                FILTER_ENV,
                CONFIG_ENV,
            )
            return
        if _SERVING.get(id(vllm_config)) is vllm_config:
            logger.info("memfree: this engine's guard is already built; this copy stands aside")
            return
        if len(runner_args) == 1:  # Model Runner V2: (vllm_config, request_states)
            self.active = V2Guard(vllm_config, *runner_args, config=config)
        else:  # V1: (vllm_config, device, is_pin_memory)
            _refuse_unfilled_placeholders(vllm_config, named)
            self.active = V1Guard(vllm_config, *runner_args, config=config)
        self.log = ServingLog(config.source, config.log_interval_s)
        _SERVING[id(vllm_config)] = vllm_config

    # -- V1 -----------------------------------------------------------------------------------

    def is_argmax_invariant(self) -> bool:
        """False while guarding (it changes greedy choices); True when inert, so that V1 calls
        it only where it samples."""
        return self.active is None

    def update_state(self, batch_update: Any) -> None:
        """V1: follow the persistent batch."""
        active = self.active
        if not isinstance(active, V1Guard) or batch_update is None:
            return
        active.update_state(batch_update)
        if self.log is not None:
            for index, *_ in batch_update.added:
                request = active.requests.get(index)
                self.log.request(request is not None and request.guarded)

    # -- V2 -----------------------------------------------------------------------------------

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """V2: whether the request in slot ``req_idx`` is guarded (False when inert: V2 then
        never calls :meth:`apply` for it)."""
        if not isinstance(self.active, V2Guard):
            return False
        guarded = self.active.add_request(req_idx, sampling_params)
        if self.log is not None:
            self.log.request(guarded)
        return guarded

    def apply_staged_writes(self) -> None:
        """V2: the slots' flags to the device."""
        if isinstance(self.active, V2Guard):
            self.active.apply_staged_writes()

    # -- both ---------------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        """The logits with every stored n-gram's last token at ``-inf`` (V1 calls it with the
        logits, V2 with its step context too); unchanged when inert."""
        active, log = self.active, self.log
        if active is None:
            return logits
        first = logits.argmax(dim=1) if log is not None and log.interval else None
        out = active.apply(logits, ctx) if isinstance(active, V2Guard) else active.apply(logits)
        if log is not None:
            log.step(logits.shape[0], first, out)
        return out


def _named(vllm_config: Any) -> bool:
    """Whether the engine was given this class by name (``logits_processors``), not only through
    the entry point."""
    named = getattr(getattr(vllm_config, "model_config", None), "logits_processors", None) or ()
    for item in named:
        if isinstance(item, type) and issubclass(item, MemFreeVllmLogitsProcessor):
            return True
        if isinstance(item, str) and item.startswith("memfree."):
            return True
    return False


def _refuse_unfilled_placeholders(vllm_config: Any, named: bool) -> None:
    """Under V1 with async scheduling, vLLM 0.32 copies sampled ids into the output lists before
    ``apply()`` only for processors named in ``logits_processors``; loaded through the entry
    point alone, every guarded row would read placeholders and be closed after one token.

    Raises:
        ServingConfigError: async scheduling without the class named.
    """
    scheduler = getattr(vllm_config, "scheduler_config", None)
    if named or not getattr(scheduler, "async_scheduling", False):
        return
    raise ServingConfigError(
        "memfree under vLLM's V1 runner with async scheduling: vLLM passes the sampled ids to "
        "a logits processor only when it is named; add --logits-processors "
        "memfree.integrations.vllm:MemFreeVllmLogitsProcessor (or --no-async-scheduling)"
    )


__all__ = ["MemFreeVllmLogitsProcessor", "ServingLog"]
