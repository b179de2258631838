"""What both vLLM adapters share: the guard built from the engine's configuration and tokenizer,
and the per-request decision (see :mod:`memfree.engines.policy`).

vLLM calls a logits processor's ``apply()`` inside the engine's step, where an exception kills the
engine. So everything that can fail (the configuration, the filter file, its tokenizer fingerprint
against the engine's tokenizer, n, unit, a filter that stores nothing) is checked here, when the
engine builds the processor: a bad setting stops the engine at start-up with a message that names
it. What can only fail inside a step never raises there: a block of the filter found damaged on its
first read closes the rows whose lookup reads it (end of sequence only), logged once per problem
(:func:`~memfree.engines.faults.step_masks`); a filter file rewritten in place closes every guarded
row from then on (:class:`ChangedFilterGuard`).
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import torch

from memfree.engines.faults import StepFaults
from memfree.engines.policy import (
    CONFIG_ENV,
    FILTER_ENV,
    ON_REQUEST,
    ServingConfig,
    ServingConfigError,
    requested_exemption,
    requested_guard,
)
from memfree.engines.rows import RowGuard
from memfree.engines.scores import fail_closed
from memfree.engines.setup import EmptyFilterError, GuardSetup
from memfree.errors import FilterChangedError, FilterError

if TYPE_CHECKING:
    import numpy as np

# Under vLLM's own logger: vLLM configures "vllm" only, so its INFO lines (and ours) show.
logger = logging.getLogger("vllm.memfree")


def _version() -> str:
    """memfree's installed version (``memfree.__version__``, read without importing the package's
    top level, which is above the engines)."""
    try:
        return version("memfree")
    except PackageNotFoundError:
        return "0+unknown"


def engine_tokenizer(vllm_config: Any) -> Any:
    """The engine's tokenizer, loaded the way vLLM loads it (without vLLM, as transformers does,
    from the local path the engine names).

    Raises:
        ServingConfigError: the engine was started without a tokenizer.
    """
    model_config = getattr(vllm_config, "model_config", None)
    if model_config is None or getattr(model_config, "skip_tokenizer_init", False):
        raise ServingConfigError(
            "the memfree guard needs the engine's tokenizer to check the filter against it; "
            "start the engine without skip_tokenizer_init"
        )
    try:
        from vllm.tokenizers import cached_tokenizer_from_config
    except ImportError:
        from memfree.vocab.tokenizer import load_tokenizer

        return load_tokenizer(model_config.tokenizer)
    return cached_tokenizer_from_config(model_config)


def no_configuration() -> ServingConfigError:
    """The error for a guard asked for by name (``--logits-processors``) with no configuration:
    what to set."""
    return ServingConfigError(
        "the memfree guard has no configuration: pass "
        '--additional-config \'{"memfree": {"filter": "PATH"}}\' to the engine, or set '
        f"{FILTER_ENV}=PATH (or {CONFIG_ENV}=a JSON file of the same settings)"
    )


def guard_for(config: ServingConfig, vllm_config: Any) -> RowGuard:
    """The guard the operator's ``config`` asks for, over the engine's tokenizer.

    Raises:
        FilterError: the filter cannot be opened (a missing file is named with the setting that
            gave its path), does not fit the engine's tokenizer (its fingerprint), n or unit; the
            message says how to rebuild it.
        EmptyFilterError: the filter stores no n-gram and the configuration does not allow it.
    """
    tokenizer = engine_tokenizer(vllm_config)
    try:
        setup = GuardSetup.create(
            config.filter,
            tokenizer,
            ngram_size=config.ngram_size,
            canonical=config.canonical,
            allow_empty=config.allow_empty,
        )
    except FileNotFoundError as error:
        raise FilterError(config.missing_filter(error)) from None
    except EmptyFilterError as error:  # the fix in the configuration's terms
        raise EmptyFilterError(error.path, error.unit, error.n, config.allow_empty_fix()) from None
    logger.info(
        "memfree %s: guarding every request with %s (%s %d-grams; promise: %s%s; from %s)",
        _version(),
        config.filter,
        setup.unit.name,
        setup.n,
        setup.promise,
        ", requests may opt out" if config.allow_opt_out else "",
        config.source,
    )
    return RowGuard(setup, StepFaults(logger))


class ChangedFilterGuard:
    """What a vLLM adapter does when its filter file was rewritten in place under it
    (:class:`~memfree.errors.FilterChangedError`): raising inside ``apply()`` would kill the
    engine and every request with it, so the guarded rows are closed (end of sequence only) at
    this step and every later one (the error is sticky), and the error is logged once, naming the
    file and the fix. Unguarded requests (opt-out) run on.
    """

    def __init__(self) -> None:
        self.error: FilterChangedError | None = None

    def closed(
        self,
        logits: torch.Tensor,
        guarded: torch.Tensor | np.ndarray,
        eos_token_ids: tuple[int, ...],
        error: FilterChangedError,
    ) -> torch.Tensor:
        """``logits`` (edited in place) with every guarded row left only end of sequence.

        Args:
            logits: float `(rows, vocab)`, as the adapter got them (not yet edited).
            guarded: bool `(rows,)`, the guarded rows.
            eos_token_ids: the rows' end-of-sequence ids (the first is kept).
            error: what the guard raised.
        """
        if self.error is None:
            logger.error("memfree: %s; guarded requests now end at once", error)
        self.error = error
        rows = torch.as_tensor(guarded, dtype=torch.bool).to(logits.device)
        return fail_closed(logits, rows, eos_token_ids)


def validate_request(sampling_params: Any) -> None:
    """Refuse a request whose ``extra_args["memfree"]`` or ``["memfree_exempt_prompt"]`` is not
    0/1/true/false.

    Raises:
        ValueError: the value (vLLM turns it into HTTP 400).
    """
    requested_guard(getattr(sampling_params, "extra_args", None))
    requested_exemption(getattr(sampling_params, "extra_args", None))


class RequestPolicy:
    """Whether each request is guarded, with one warning the first time a request asks to switch
    the guard off where the operator does not allow it."""

    def __init__(self, config: ServingConfig) -> None:
        self.config = config
        self._warned = False
        self._warned_exempt = False

    def guards(self, sampling_params: Any) -> bool:
        """True unless opt-out is allowed and the request asked for it."""
        try:
            asked = requested_guard(getattr(sampling_params, "extra_args", None))
        except ValueError:
            return True  # refused at admission; guarded all the same
        if asked is False and not self.config.allow_opt_out:
            if not self._warned:
                logger.warning(
                    "memfree: a request asked to switch the guard off; this engine does not "
                    "allow it (additional_config['memfree']['allow_opt_out']), so it stays "
                    "guarded"
                )
                self._warned = True
            return True
        return asked is not False

    def exempts(self, sampling_params: Any) -> bool:
        """Whether the request's own prompt is exempt (``exempt_prompt``: True, or "on_request"
        and the request asked); a request that asks where it is not allowed is told once."""
        setting = self.config.exempt_prompt
        if setting is True:
            return True
        try:
            asked = requested_exemption(getattr(sampling_params, "extra_args", None))
        except ValueError:
            return False  # refused at admission
        if asked and setting != ON_REQUEST:
            if not self._warned_exempt:
                logger.warning(
                    "memfree: a request asked to quote its prompt; this engine does not allow it "
                    "(additional_config['memfree']['exempt_prompt']), so its prompt is guarded"
                )
                self._warned_exempt = True
            return False
        return bool(asked)


__all__ = [
    "ChangedFilterGuard",
    "RequestPolicy",
    "engine_tokenizer",
    "guard_for",
    "no_configuration",
    "validate_request",
]
