"""vLLM with the guard and the real default model: offline (a mixed batch of guarded and
opted-out requests, sampled, the word unit) and behind its OpenAI server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
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


@pytest.mark.timeout(900)
def test_vllm_openai_server(cp437_filters: dict[str, Any], tmp_path: Path) -> None:
    from bench_engines import prompts

    from memfree.models import default_model_dir

    port = _free_port()
    config = {"memfree": {"filter": str(cp437_filters["paths"]["token"])}}
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
        "--logits-processors",
        "memfree.integrations.vllm:MemFreeV1LogitsProcessor",
        "--additional-config",
        json.dumps(config),
    ]
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the server did not start in 10 minutes"
            time.sleep(2)
        prompt = prompts(1)[0]
        body = {
            "model": "smollm2",
            "prompt": prompt,
            "max_tokens": 64,
            "temperature": 0,
            "return_token_ids": True,
        }
        status, answer = _post(f"{base}/v1/completions", body)
        assert status == 200, answer
        output = answer["choices"][0]["token_ids"]
        assert output and cp437_filters["stored"]("token", prompt, output) == 0
        # Opting out is not allowed on this server: the answer is the same guarded one.
        status, again = _post(f"{base}/v1/completions", {**body, "vllm_xargs": {"memfree": 0}})
        assert status == 200 and again["choices"][0]["token_ids"] == output
        status, refused = _post(
            f"{base}/v1/completions", {**body, "vllm_xargs": {"memfree": "maybe"}}
        )
        assert status == 400, refused
        assert "0, 1, true or false" in json.dumps(refused)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
    assert server.returncode is not None
