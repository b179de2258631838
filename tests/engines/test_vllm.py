"""vLLM with the guard and the real default model: offline (a mixed batch of guarded and
opted-out requests, sampled, the word unit) and behind its OpenAI server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run `make test-engines`")

from bench_engines import cpu_kv_share  # bench/ is on the path (conftest.py)


@pytest.mark.timeout(900)
def test_vllm_offline(cp437_filters: dict[str, Any], tmp_path: Path) -> None:
    result = cp437_filters["run_bench"]("vllm", tmp_path / "vllm.json")
    cp437_filters["check"](result, {"guarded": "token", "sampled": "token", "word": "word"})
    assert result["opted_out"] == result["plain"]
    for index, output in enumerate(result["mixed"]):
        expected = result["guarded"] if index % 2 == 0 else result["plain"]
        assert output == expected[index]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@contextlib.contextmanager
def _server(tmp_path: Path, name: str, env: dict[str, str]) -> Iterator[tuple[str, Path]]:
    """vLLM's OpenAI server on 127.0.0.1 with the default model and no memfree flag: memfree
    comes in through its entry point, configured by ``env`` alone. Yields (base URL, log)."""
    from memfree.models import default_model_dir

    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(default_model_dir()),
        "--served-model-name",
        "smollm2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--gpu-memory-utilization",
        str(cpu_kv_share()),
        "--enforce-eager",
    ]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEMFREE_")}
    path = tmp_path / f"{name}.log"
    log = path.open("w")
    server = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**environ, **env},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, path.read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the server did not start in 10 minutes"
            time.sleep(2)
        yield base, path
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.mark.timeout(1200)
def test_vllm_openai_server_configured_by_the_environment_alone(
    cp437_filters: dict[str, Any], tmp_path: Path
) -> None:
    """`MEMFREE_CONFIG=... python -m vllm.entrypoints.openai.api_server --model M` guards every
    completion (ids and text); the same server without configuration answers as an opted-out
    request does (plain vLLM: the offline test checks opted-out == plain)."""
    from bench_engines import prompts

    prompt = prompts(1)[0]
    body = {
        "model": "smollm2",
        "prompt": prompt,
        "max_tokens": 64,
        "temperature": 0,
        "return_token_ids": True,
    }
    settings = tmp_path / "memfree.json"
    config = {
        "filter": str(cp437_filters["paths"]["token"]),
        "allow_opt_out": True,
        "exempt_prompt": "on_request",
    }
    settings.write_text(json.dumps({**config, "log_interval_s": 1}), encoding="utf-8")
    with _server(tmp_path, "configured", {"MEMFREE_CONFIG": str(settings)}) as (base, log):
        status, answer = _post(f"{base}/v1/completions", body)
        assert status == 200, answer
        output = answer["choices"][0]["token_ids"]
        assert output and cp437_filters["stored"]("token", prompt, output) == 0
        assert cp437_filters["stored_text"]("token", prompt, output) == 0
        status, opted = _post(f"{base}/v1/completions", {**body, "vllm_xargs": {"memfree": 0}})
        assert status == 200, opted
        plain = opted["choices"][0]["token_ids"]
        assert cp437_filters["stored"]("token", prompt, plain) > 0  # the model copies unguarded
        status, refused = _post(
            f"{base}/v1/completions", {**body, "vllm_xargs": {"memfree": "maybe"}}
        )
        assert status == 400, refused
        assert "0, 1, true or false" in json.dumps(refused)
        # Quoting the prompt: a request that asks may repeat the stored passage it was given,
        # and nothing stored that its prompt does not hold.
        tokenizer = cp437_filters["tokenizer"]
        passage = tokenizer.decode(prompt)
        rag = tokenizer(
            f"Retrieved:\n{passage}\nThe same, copied exactly:\n{passage[:60]}",
            add_special_tokens=False,
        )["input_ids"]
        asked = {**body, "prompt": rag, "vllm_xargs": {"memfree_exempt_prompt": 1}}
        status, quoted = _post(f"{base}/v1/completions", asked)
        assert status == 200, quoted
        status, unasked = _post(f"{base}/v1/completions", {**body, "prompt": rag})
        quote, guarded_only = quoted["choices"][0]["token_ids"], unasked["choices"][0]["token_ids"]
        assert cp437_filters["stored"]("token", rag, guarded_only) == 0
        in_prompt, outside = cp437_filters["stored_split"]("token", rag, quote)
        assert in_prompt > 0 and outside == 0, (quote, quoted["choices"][0]["text"])
        time.sleep(1.5)
        _post(f"{base}/v1/completions", {**body, "max_tokens": 2})  # a step after the interval
        text = log.read_text()
        assert "memfree" in text and "guarding every request" in text and "MEMFREE_CONFIG" in text
        assert "requests guarded" in text and "first choices removed" in text
    with _server(tmp_path, "unconfigured", {}) as (base, log):
        status, answer = _post(f"{base}/v1/completions", body)
        assert status == 200, answer
        assert answer["choices"][0]["token_ids"] == plain
        assert "installed but not configured" in log.read_text()
