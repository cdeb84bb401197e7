"""Test model: concurrent decoupled BLS streams from several threads of one stub."""

from __future__ import annotations

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.triton import bls
from avatar.triton.diagnostics import enable_crash_reports

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        enable_crash_reports("bls_fanout")
        params = json.loads(args["model_config"]).get("parameters", {})
        if params.get("retire", {}).get("string_value", "true") == "false":
            # the control experiment: iterators dropped at once (the behaviour before)
            bls.RETIRED.max_age_s = 0.0

    def execute(self, requests: list) -> None:
        for request in requests:
            threads = int(bls.input_array(request, "threads")[0])
            calls = int(bls.input_array(request, "calls")[0])
            sender = request.get_response_sender()
            threading.Thread(
                target=self._serve, args=(request, sender, threads, calls), daemon=True
            ).start()

    def _serve(self, request, sender, threads: int, calls: int) -> None:
        done: list[int] = []

        def work(worker: int) -> None:
            for call in range(calls):
                count = 1 + (worker + call) % 4
                outputs = list(
                    bls.stream(
                        "bls_echo",
                        {"count": np.array([count], np.int32)},
                        ["values", "label"],
                        stop=lambda: bls.is_cancelled(request),  # the round trips the avatar makes
                    )
                )
                # Python-side churn (small objects) while the stub's threads free theirs
                total = sum(float(out["values"].sum()) for out in outputs)
                _ = [np.arange(8) + total for _ in range(16)]
                if call % 25 == 0:
                    pb_utils.Logger.log_verbose(f"bls_fanout: worker {worker} call {call}")
                done.append(1)

        workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        response = pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("streams", np.array([len(done)], np.int32))]
        )
        sender.send(response, flags=FINAL)
