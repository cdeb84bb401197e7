"""The FP16 variant of the `tts_vits` graph, as a cached artifact recipe (the INT8 Q/DQ
variant is built and gated with the export itself: export/tts/int8.py).

FP16: every float tensor in half precision except the graph's inputs/outputs (kept FP32,
so the Triton config is the same) and the ops listed in FP16_KEEP_FP32. Not served:
`python -m export.tts --report` measures it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from avatar.tts.phonemes import Phonemizer, prepare
from avatar.tts.synth import Controls, batch_inputs
from avatar.tts.voice import packaged_voice
from export.common import ArtifactRecipe, ensure, onnx_session
from export.sidecar import Sidecar, sha256_file
from export.tts.recipe import VitsRecipe

log = logging.getLogger(__name__)

PRECISIONS = ("fp16",)
# The duration predictor's spline flow and the length arithmetic stay FP32.
FP16_KEEP_FP32 = ["Range", "CumSum", "NonZero", "Softplus", "Exp", "Ceil", "ReduceSum", "Pow"]


def _fp16(source: Path, out: Path) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(
        onnx.load(str(source)), keep_io_types=True, op_block_list=FP16_KEEP_FP32
    )
    # The converter inserts the same Cast twice when a shared FP16 initializer feeds two
    # FP32-kept ops: keep the first (same input, same output name).
    produced: set[str] = set()
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Cast" and node.output[0] in produced:
            continue
        produced.update(node.output)
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(out))


class VitsVariantRecipe(ArtifactRecipe):
    """`tts_vits` in FP16; same inputs and outputs as the FP32 export."""

    code_files = (
        Path(__file__).with_name("recipe.py"),
        Path(__file__).with_name("graph.py"),
    )

    def __init__(self, precision: str):
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
        self.precision = precision
        self.name = f"tts_vits_{precision}"
        self.fp32 = ensure(VitsRecipe())

    def key_inputs(self) -> dict[str, str]:
        return {"fp32": sha256_file(self.fp32 / "model.onnx"), "precision": self.precision}

    def build(self, out_dir: Path) -> Sidecar:
        path = out_dir / "model.onnx"
        _fp16(self.fp32 / "model.onnx", path)
        session = onnx_session(path)  # loads: a broken graph fails here
        voice = packaged_voice()
        chunk = prepare("A short check that the graph runs.", Phonemizer(voice.config)).chunks[0]
        names = [o.name for o in session.get_outputs()]
        session.run(names, batch_inputs([chunk.ids], [Controls.defaults(voice.config)]))
        fp32 = Sidecar.load(self.fp32)
        sidecar = self.sidecar(
            path,
            model="tts_vits",
            opset=fp32.opset,
            source={"model.onnx (fp32)": sha256_file(self.fp32 / "model.onnx")},
            validation={"quality": "see python -m export.tts --report (WER, RTF)"},
            notes=[f"precision {self.precision}", __doc__.split("\n\n")[1].replace("\n", " ")],
        )
        if sidecar.inputs != fp32.inputs:
            raise ValueError(f"{self.name}: inputs differ from the FP32 export")
        return sidecar
