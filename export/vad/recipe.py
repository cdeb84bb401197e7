"""Silero VAD (the `silero-vad` package's ONNX) -> a Triton-batchable 16 kHz graph.

The packaged `silero_vad_op18_ifless.onnx` takes `input` [batch, 576] (64 samples of
context + a 512-sample chunk), `sr` (a scalar that selects the 8k or 16k sub-graph
through an `If`) and the LSTM `state` [2, batch, 128] (batch on axis 1). Triton's
dynamic batcher concatenates requests on axis 0 and cannot batch a scalar, so the
served graph is rewritten:

- the 16 kHz branch is inlined and `sr` removed (no `If` left: TensorRT-friendly);
- the state is batch-first: `state` [batch, 2, 128] in, `next_state` out (a Transpose
  on each side of the LSTM);
- the 64-sample context travels as its own tensor, so a client feeds back what it got:
  inputs `chunk` [batch, 512], `context` [batch, 64], `state` [batch, 2, 128];
  outputs `speech_prob` [batch, 1], `next_context` [batch, 64], `next_state`.

The state lives with the caller (one stream per session), so independent sessions
batch freely. The rewritten graph is verified against the original on rolling,
multi-session audio it was not built from.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from export.common import (
    ArtifactRecipe,
    Tolerance,
    build_command,
    compare_outputs,
    onnx_session,
    worst,
)
from export.sidecar import Sidecar, sha256_file

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
CHUNK = 512
CONTEXT = 64
STATE_SHAPE = (2, 128)
OPSET = 18
TOLERANCES = {
    "speech_prob": Tolerance(atol=1e-5),
    "next_state": Tolerance(atol=1e-5),
    "next_context": Tolerance(atol=0.0),
}


def packaged_model() -> Path:
    import silero_vad

    return Path(silero_vad.__file__).parent / "data" / "silero_vad_op18_ifless.onnx"


def rewrite(source: Path):  # -> onnx.ModelProto
    """Inline the 16 kHz branch, drop `sr`, and make every tensor batch-first."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(source))
    branch_nodes = [n for n in model.graph.node if n.op_type == "If"]
    assert len(branch_nodes) == 1, "expected one If selecting the 8k/16k sub-graph"
    then_branch = next(a.g for a in branch_nodes[0].attribute if a.name == "then_branch")
    # The If's condition is sr == 16000 (initializer val_4); the then-branch is 16 kHz.
    prob_name, state_name = (o.name for o in then_branch.output)

    renames = {"input": "_vad_input", "state": "_state_lstm"}
    nodes = [
        helper.make_node("Concat", ["context", "chunk"], ["_vad_input"], axis=1),
        helper.make_node("Transpose", ["state"], ["_state_lstm"], perm=[1, 0, 2]),
    ]
    for original in then_branch.node:
        node = onnx.NodeProto.FromString(original.SerializeToString())
        node.input[:] = [renames.get(name, name) for name in node.input]
        nodes.append(node)
    nodes += [
        helper.make_node("Identity", [prob_name], ["speech_prob"]),
        helper.make_node("Transpose", [state_name], ["next_state"], perm=[1, 0, 2]),
        helper.make_node(
            "Slice",
            ["chunk", "_ctx_start", "_ctx_end", "_ctx_axis"],
            ["next_context"],
        ),
    ]
    slice_args = [
        helper.make_tensor("_ctx_start", TensorProto.INT64, [1], [CHUNK - CONTEXT]),
        helper.make_tensor("_ctx_end", TensorProto.INT64, [1], [CHUNK]),
        helper.make_tensor("_ctx_axis", TensorProto.INT64, [1], [1]),
    ]
    used = {name for node in nodes for name in node.input}
    initializers = [i for i in model.graph.initializer if i.name in used]
    initializers += list(then_branch.initializer) + slice_args

    fp32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "silero_vad_16k_batch_first",
        inputs=[
            helper.make_tensor_value_info("chunk", fp32, ["batch", CHUNK]),
            helper.make_tensor_value_info("context", fp32, ["batch", CONTEXT]),
            helper.make_tensor_value_info("state", fp32, ["batch", *STATE_SHAPE]),
        ],
        outputs=[
            helper.make_tensor_value_info("speech_prob", fp32, ["batch", 1]),
            helper.make_tensor_value_info("next_context", fp32, ["batch", CONTEXT]),
            helper.make_tensor_value_info("next_state", fp32, ["batch", *STATE_SHAPE]),
        ],
        initializer=initializers,
    )
    rewritten = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="triton-avatar export.vad",
    )
    rewritten.ir_version = model.ir_version
    onnx.checker.check_model(rewritten, full_check=True)
    return rewritten


def verification_audio(sessions: int, chunks: int, seed: int) -> np.ndarray:
    """[sessions, chunks*512] audio: voiced-like harmonic bursts, noise and silence.

    Not speech, but it drives the LSTM through speech-like and silent stretches, and it
    differs from anything the graph was built from (the rewrite uses no data at all).
    """
    rng = np.random.default_rng(seed)
    n = chunks * CHUNK
    t = np.arange(n) / SAMPLE_RATE
    audio = np.zeros((sessions, n), np.float32)
    for s in range(sessions):
        f0 = rng.uniform(90, 220)
        voiced = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 12))
        envelope = (np.sin(2 * np.pi * rng.uniform(1.5, 4) * t) > 0).astype(np.float32)
        audio[s] = 0.3 * voiced * envelope + rng.normal(0, rng.uniform(0.001, 0.05), n)
    return audio


def run_reference(session, audio: np.ndarray) -> dict[str, np.ndarray]:
    """The original graph on [sessions, samples] audio, chunk by chunk, state on axis 1."""
    sessions = audio.shape[0]
    state = np.zeros((2, sessions, 128), np.float32)
    context = np.zeros((sessions, CONTEXT), np.float32)
    probs, states = [], []
    for start in range(0, audio.shape[1], CHUNK):
        chunk = audio[:, start : start + CHUNK]
        x = np.concatenate([context, chunk], axis=1)
        prob, state = session.run(
            None, {"input": x, "state": state, "sr": np.array(SAMPLE_RATE, np.int64)}
        )
        context = chunk[:, -CONTEXT:]
        probs.append(prob)
        states.append(state.transpose(1, 0, 2))
    return {"speech_prob": np.stack(probs, 1), "next_state": np.stack(states, 1)}


def run_served(session, audio: np.ndarray) -> dict[str, np.ndarray]:
    """The rewritten graph on the same audio, feeding back its own outputs."""
    sessions = audio.shape[0]
    state = np.zeros((sessions, *STATE_SHAPE), np.float32)
    context = np.zeros((sessions, CONTEXT), np.float32)
    probs, states = [], []
    for start in range(0, audio.shape[1], CHUNK):
        chunk = audio[:, start : start + CHUNK]
        prob, context, state = session.run(
            ["speech_prob", "next_context", "next_state"],
            {"chunk": chunk, "context": context, "state": state},
        )
        assert np.array_equal(context, chunk[:, -CONTEXT:]), "next_context must be the tail"
        probs.append(prob)
        states.append(state)
    return {"speech_prob": np.stack(probs, 1), "next_state": np.stack(states, 1)}


class VadRecipe(ArtifactRecipe):
    name = "vad"

    def __init__(self, source: Path | None = None):
        self.source = Path(source or packaged_model())

    def key_inputs(self) -> dict[str, str]:
        return {"source": sha256_file(self.source), "opset": str(OPSET)}

    def build(self, out_dir: Path) -> Sidecar:
        import onnx

        path = out_dir / "model.onnx"
        onnx.save(rewrite(self.source), str(path))
        reference, served = onnx_session(self.source), onnx_session(path)
        comparisons = []
        for sessions, seed in ((1, 11), (4, 12), (7, 13)):
            audio = verification_audio(sessions, chunks=40, seed=seed)
            comparisons += compare_outputs(
                run_reference(reference, audio),
                run_served(served, audio),
                {k: v for k, v in TOLERANCES.items() if k != "next_context"},
                context=f"{sessions} sessions, seed {seed}",
            )
        return self.sidecar(
            path,
            opset=OPSET,
            source={self.source.name: sha256_file(self.source)},
            validation={"reference": self.source.name, "outputs": worst(comparisons)},
            notes=[
                "16 kHz branch inlined; sr removed; state batch-first [batch, 2, 128]",
                "context (64 samples) is an input/output so the caller keeps all state",
            ],
        )


def main(argv: list[str] | None = None) -> None:
    build_command(VadRecipe, __doc__.splitlines()[0], argv)
