"""Figures of the `llm` model on a real embedded tritonserver (printed, never asserted):
time to first token with a cold and a warm prefix cache, aggregate tokens/s at 1/4/8
concurrent gRPC streams (decode steps batched by the BLS, KV cache sent per step).

    python -m perf.llm_server
"""

from __future__ import annotations

import json
import logging
import queue
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from avatar.llm.bench import QUESTIONS

log = logging.getLogger(__name__)

MODELS = ("llm", "llm_decoder")


def stream_turn(url: str, messages: list[dict], sampling: dict) -> tuple[float, int, dict]:
    """One streamed turn: (client-side ms to the first text, text responses, final stats)."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    tensors = []
    for name, value in (("messages", json.dumps(messages)), ("sampling", json.dumps(sampling))):
        tensor = grpcclient.InferInput(name, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value.encode()], dtype=object))
        tensors.append(tensor)
    started, first, count = time.monotonic(), None, 0
    try:
        client.async_stream_infer("llm", tensors)
        while True:
            result, error = results.get(timeout=300)
            if error is not None:
                raise RuntimeError(str(error))
            text = result.as_numpy("text")[0].decode()
            finish = result.as_numpy("finish_reason")[0].decode()
            if text and first is None:
                first = (time.monotonic() - started) * 1000
            count += bool(text)
            if finish:
                return first or 0.0, count, json.loads(result.as_numpy("stats")[0].decode())
    finally:
        client.stop_stream()
        client.close()


def _one_stream(url: str, i: int, tokens: list[int]) -> None:
    question = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
    _, _, stats = stream_turn(url, question, {"seed": i, "max_tokens": 48})
    tokens.append(int(stats["completion_tokens"]))


def report(url: str) -> None:
    greedy1 = {"temperature": 0, "max_tokens": 1}
    print("time to first token through tritonserver (server-side ttft_ms, max_tokens 1):")
    for label in ("cold prefix cache", "warm prefix cache"):
        persona = "You are Max, a calm museum guide. Keep answers short. " * 6
        system = {"role": "system", "content": persona}
        _, _, stats = stream_turn(url, [system, {"role": "user", "content": "Hi"}], greedy1)
        if label == "cold prefix cache":
            print(
                f"  {label}: {stats['ttft_ms']:.0f} ms ({stats['prompt_tokens']:.0f} prompt tokens)"
            )
        else:
            _, _, stats = stream_turn(
                url, [system, {"role": "user", "content": "Where is the exit?"}], greedy1
            )
            print(f"  {label}: {stats['ttft_ms']:.0f} ms ({stats['cached_tokens']:.0f} cached)")
    print("aggregate tokens/s over gRPC (sampled, 48 tokens max per stream):")
    for streams in (1, 4, 8):
        tokens: list[int] = []
        started = time.monotonic()
        threads = [
            threading.Thread(target=_one_stream, args=(url, i, tokens)) for i in range(streams)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        print(f"  {streams} streams: {sum(tokens) / elapsed:6.1f} tokens/s")


def main() -> None:
    from avatar.serving.deployment import build_repository
    from avatar.serving.server import EmbeddedServer, ServerOptions

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp) / "models"
        build_repository(repository, "embedded", MODELS)
        with EmbeddedServer(ServerOptions(repository, models=MODELS)) as server:
            report(server.grpc_url)


if __name__ == "__main__":
    main()
