"""Call the `avatar_say` ensemble (text -> audio + blendshapes) in one non-streaming
request, as another service would.

python -m clients.say_service --url 127.0.0.1:8001 "Welcome!" --out build/say_service
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from avatar.model_io import AVATAR_SAY, infer_inputs

OUTPUTS = tuple(AVATAR_SAY.outputs)


def say(url: str, text: str, model: str = "avatar_say") -> dict:
    """One request; outputs as numpy (animation decoded to a JSON string)."""
    import tritonclient.grpc as grpcclient

    inputs = infer_inputs(AVATAR_SAY.request(text=text), grpcclient.InferInput)
    with grpcclient.InferenceServerClient(url) as client:
        result = client.infer(
            model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in OUTPUTS]
        )
    out = {name: result.as_numpy(name) for name in OUTPUTS}
    out["animation"] = AVATAR_SAY.read_response(out)["animation"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clients.say_service", description=__doc__.split("\n")[0])
    parser.add_argument("text")
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--out", type=Path, default=Path("build/say_service"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from avatar.audio import write_wav

    started = time.perf_counter()
    out = say(args.url, args.text)
    elapsed = time.perf_counter() - started
    rate, fps = int(out["sample_rate"][0]), float(out["fps"][0])
    args.out.mkdir(parents=True, exist_ok=True)
    write_wav(args.out / "say.wav", out["audio"], rate)
    blob = {"fps": fps, "blendshapes": out["blendshapes"].round(4).tolist()}
    blob["animation"] = json.loads(out["animation"])
    (args.out / "say.json").write_text(json.dumps(blob))
    sys.stdout.write(
        f"{out['audio'].size / rate:.2f} s of audio, {len(out['blendshapes'])} frames at "
        f"{fps:g} fps in {elapsed * 1000:.0f} ms -> {args.out}/say.wav, say.json\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
