"""Smart Turn v3.2 (the `pipecat-ai==1.14.0` wheel's ONNX) -> the `turn_detector` model.

The file `pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx` (BSD-2-Clause, the
wheel installed with `--no-deps` by scripts/setup.sh; no pipecat code runs, here or at
serving time) takes `input_features` [batch, 80, 800] (the Whisper log-mel of the last 8 s,
avatar/end_of_turn.turn_features) and answers `logits` [batch, 1], which is already a
sigmoid: the probability that the turn is complete. Its authors quantised it (Q/DQ nodes,
INT8 weights and activations): that graph is what is served, with the output renamed
`probability` and the batch axis named, so that the name says what the number is.

Verified like every export: the served graph against the wheel's on real speech it was not
built from (the rewrite uses no data), and the task the gateway asks of it, on the human
recordings: whole sentences (complete) against the same sentences cut at a quiet 10-ms
window near their middle (incomplete), each with the 0.2 s of silence the gateway's first
ask sees.
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
from export.packages import package_file
from export.sidecar import Sidecar, sha256_file

log = logging.getLogger(__name__)

DISTRIBUTION = "pipecat-ai"
VERSION = "1.14.0"
WHEEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
SOURCE_OUTPUT, OUTPUT = "logits", "probability"
INPUT = "input_features"
TOLERANCE = {OUTPUT: Tolerance(atol=1e-6)}  # the same graph: only names change
RATE = 16_000
ASK_SILENCE_S = 0.2  # the trailing silence of the gateway's first ask
# The task check catches a broken graph or front end (a random answer, features of the
# wrong scale), not the model's own limits: read sentences and card names are not the
# conversational speech it was trained on (its accuracy is recorded, not gated).
MIN_COMPLETE = 0.7  # whole sentences said complete


def packaged_model() -> tuple[Path, str]:
    """(the ONNX file inside the installed wheel, the wheel's licence)."""
    return package_file(DISTRIBUTION, VERSION, WHEEL_FILE)


def rewrite(source: Path):  # -> onnx.ModelProto
    """The wheel's graph with its output named `probability` and its batch axis `batch`."""
    import onnx

    model = onnx.load(str(source))
    outputs = [o.name for o in model.graph.output]
    inputs = [i.name for i in model.graph.input]
    if outputs != [SOURCE_OUTPUT] or INPUT not in inputs:
        raise ValueError(
            f"{source}: expected {INPUT} -> {SOURCE_OUTPUT}, got {inputs} -> {outputs}"
        )
    for node in model.graph.node:
        node.output[:] = [OUTPUT if name == SOURCE_OUTPUT else name for name in node.output]
    model.graph.output[0].name = OUTPUT
    for value in (*model.graph.input, model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    model.producer_name = "triton-avatar export.turn_detector"
    onnx.checker.check_model(model)
    return model


def quiet_cut(audio: np.ndarray, fraction: float = 0.5) -> np.ndarray:
    """`audio` cut at its quietest 10-ms window within 0.4 s of `fraction` of its length
    (a word boundary, roughly: the speaker stops mid-sentence)."""
    hop = RATE // 100
    windows = audio[: len(audio) // hop * hop].reshape(-1, hop)
    energy = (windows.astype(np.float64) ** 2).mean(axis=1)
    middle, reach = int(len(windows) * fraction), 40
    low, high = max(1, middle - reach), min(len(windows) - 1, middle + reach)
    return audio[: (low + int(np.argmin(energy[low:high]))) * hop]


def task_set() -> tuple[list[np.ndarray], list[bool]]:
    """(utterances as the first ask sees them, whether each is a complete turn)."""
    from evals.recordings import human_clips

    silence = np.zeros(round(ASK_SILENCE_S * RATE), np.float32)
    audios, complete = [], []
    for clip in human_clips():
        audios += [np.concatenate([clip.audio, silence])]
        audios += [np.concatenate([quiet_cut(clip.audio), silence])]
        complete += [True, False]
    return audios, complete


def probabilities(session, features: np.ndarray, output: str, batch: int = 8) -> np.ndarray:
    parts = [
        session.run([output], {INPUT: features[i : i + batch]})[0]
        for i in range(0, len(features), batch)
    ]
    return np.concatenate(parts)


def task_figures(probs: np.ndarray, complete: list[bool]) -> dict[str, float]:
    truth = np.asarray(complete)
    said = probs.reshape(-1) >= 0.5
    return {
        "utterances": len(truth),
        "accuracy": round(float((said == truth).mean()), 3),
        "complete_said_complete": round(float(said[truth].mean()), 3),
        "cut_said_incomplete": round(float((~said[~truth]).mean()), 3),
        "p_complete_median": round(float(np.median(probs.reshape(-1)[truth])), 3),
        "p_cut_median": round(float(np.median(probs.reshape(-1)[~truth])), 3),
    }


class TurnDetectorRecipe(ArtifactRecipe):
    name = "turn_detector"

    def __init__(self, source: Path | None = None):
        found, self.licence = packaged_model() if source is None else (Path(source), "")
        self.source = Path(found)
        import avatar.asr.features
        import avatar.end_of_turn

        # the features the verification computes are part of what it proves
        self.code_files = (Path(avatar.end_of_turn.__file__), Path(avatar.asr.features.__file__))

    def key_inputs(self) -> dict[str, str]:
        return {"source": sha256_file(self.source)}

    def build(self, out_dir: Path) -> Sidecar:
        import onnx

        from avatar.end_of_turn import batch_features

        path = out_dir / "model.onnx"
        onnx.save(rewrite(self.source), str(path))
        audios, complete = task_set()
        features = batch_features(audios)
        reference = probabilities(onnx_session(self.source), features, SOURCE_OUTPUT)
        served = probabilities(onnx_session(path), features, OUTPUT)
        comparisons = compare_outputs(
            {OUTPUT: reference}, {OUTPUT: served}, TOLERANCE, context="human recordings"
        )
        figures = task_figures(served, complete)
        log.info("turn_detector on the human recordings: %s", figures)
        ordered = figures["p_complete_median"] > figures["p_cut_median"]
        if figures["complete_said_complete"] < MIN_COMPLETE or not ordered:
            raise ValueError(
                f"turn_detector on whole vs cut sentences: {figures}; expected whole ones said "
                f"complete at least {MIN_COMPLETE:.0%} of the time and more likely complete "
                "than cut ones: the graph or its features are wrong"
            )
        return self.sidecar(
            path,
            source={f"{DISTRIBUTION}=={VERSION}:{WHEEL_FILE}": sha256_file(self.source)},
            validation={
                "licence": self.licence or "unknown (a file given by path)",
                "reference": WHEEL_FILE,
                "outputs": worst(comparisons),
                "task": {"set": "human recordings, whole vs cut near the middle", **figures},
            },
            notes=[
                "the authors' INT8 Q/DQ graph, served as it is; output logits -> probability "
                "(it is already a sigmoid)",
                "input: avatar.end_of_turn.turn_features (last 8 s, normalised, Whisper log-mel)",
            ],
        )


def main(argv: list[str] | None = None) -> None:
    build_command(TurnDetectorRecipe, __doc__.splitlines()[0], argv)
