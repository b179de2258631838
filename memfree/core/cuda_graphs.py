"""The token guard's dense step on CUDA, captured once per shape as a CUDA graph and replayed.

On CUDA a step of the guard is about 80 small kernels (the Horner steps, the finalizer, nine
probes of each candidate). At the batch sizes of decoding their launches cost more than their
work: measured on an H100 (``bench/bench_cuda.py``), 1.9-2.0 ms a step at 1-8 rows of 49,152
candidates, for ~0.1 ms of memory traffic. The step has fixed shapes for a given (rows,
vocabulary) and no host synchronisation, so it is captured once per shape (PyTorch's
``torch.cuda.graph``) and replayed: one launch per step. The masks are those of the eager step,
bit for bit (the same kernels run); the tests compare them.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

Step = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
_Key = tuple[tuple[int, ...], torch.device, bool]  # (shape, device, inference mode)
# A captured graph keeps its intermediate tensors alive (a few (rows, vocab) int64 arrays), so
# only the latest few shapes are kept: decoding uses one or two (batch, beams) per call.
MAX_GRAPHS = 4


class GraphedStep:
    """Replays ``step(window)`` from CUDA graphs, one per input shape and device.

    Args:
        step: the eager step, ``window (rows, n-1) int64 -> (mask (rows, vocab) bool, active
            (rows,) bool)``; it must be capturable (no host synchronisation, no data-dependent
            shapes, no allocation that depends on values).

    A shape whose capture fails is run eagerly from then on, with one ``RuntimeWarning``.
    """

    def __init__(self, step: Step) -> None:
        self.step = step
        self._graphs: OrderedDict[
            _Key, tuple[torch.Tensor, torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]
        ] = OrderedDict()
        self._eager: set[_Key] = set()

    def __call__(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Graphs captured under inference mode hold inference tensors, which may not be written
        # outside it: each mode gets its own.
        key = (tuple(window.shape), window.device, torch.is_inference_mode_enabled())
        if key in self._eager or torch.cuda.is_current_stream_capturing():
            return self.step(window)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(window, key)
            if entry is None:
                return self.step(window)
        self._graphs.move_to_end(key)
        static_window, graph, (mask, active) = entry
        static_window.copy_(window)
        graph.replay()
        # The next replay overwrites the outputs: hand out copies (two cheap kernels).
        return mask.clone(), active.clone()

    def _capture(
        self, window: torch.Tensor, key: _Key
    ) -> tuple[torch.Tensor, torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]] | None:
        static_window = window.detach().clone()
        try:
            side = torch.cuda.Stream(device=window.device)
            side.wait_stream(torch.cuda.current_stream(window.device))
            with torch.cuda.stream(side):
                for _ in range(2):  # warm up outside the graph (lazy initialisation, caches)
                    self.step(static_window)
            torch.cuda.current_stream(window.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = self.step(static_window)
        except RuntimeError as error:  # an operation that cannot be captured: stay eager
            self._eager.add(key)
            warnings.warn(
                f"memfree: the guard's step could not be captured as a CUDA graph ({error}); it "
                "runs eagerly (same masks, more kernel launches)",
                RuntimeWarning,
                stacklevel=4,
            )
            return None
        self._graphs[key] = (static_window, graph, outputs)
        while len(self._graphs) > MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return self._graphs[key]


def thread_graph(local: threading.local, key: Hashable, step: Step) -> GraphedStep:
    """The calling thread's :class:`GraphedStep` for ``key`` (one per shape family a masker
    steps: graphs replay shared buffers, so each thread captures its own), made from ``step``
    the first time."""
    cache = local.__dict__.setdefault("steps", {})
    graphed = cache.get(key)
    if graphed is None:
        graphed = cache[key] = GraphedStep(step)
    return graphed
