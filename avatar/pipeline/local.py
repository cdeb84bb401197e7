"""The turn's stages in this process, no Triton: `local_stages(models) -> Stages`.

The served `avatar` model binds `Stages` to BLS calls of the asr, llm, tts, emotion_encoder
and renderer models; here each stage runs the same exported graphs with ONNX Runtime and
the core's own engines (Whisper's greedy decoder, the chat engine and its scheduler, the
VITS synthesizer, the emotion classifier). `run_turn` over these stages is the naive
baseline of `python -m perf baseline` and what tests run a real turn through.

Each call serves one session's request: nothing is batched across sessions. Concurrent
turns (threads) share the sessions; the chat engine's generations (up to
`EngineConfig.max_batch`) step side by side, each sequence in its own decoder call. The
caller finds the files (the core does not import `export`): `LocalModels` names the ONNX
graphs, e.g. the variants the embedded server runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from avatar.asr.transcribe import AsrOptions, check_audio, transcribe
from avatar.knowledge import KnowledgeBase, KnowledgeConfig, estimate_tokens
from avatar.knowledge.base import TokenCounter
from avatar.llm.cache import PrefixCache
from avatar.llm.engine import ChatEngine, EngineConfig
from avatar.llm.openai_api import Endpoint, OpenAIBackend
from avatar.llm.scheduler import Event
from avatar.llm.sequences import KvCacheSequences, SequenceDecoder, Step
from avatar.pipeline.prompt import KNOWLEDGE_SAMPLING, llm_messages, llm_sampling
from avatar.pipeline.request import TurnRequest
from avatar.pipeline.turn import Heard, Speech, Stages


@dataclasses.dataclass(frozen=True)
class LocalModels:
    """The files each stage runs (ONNX graphs as `model_repository/` names the models)."""

    asr_encoder: Path  # mel -> cross_kv
    asr_decoder: Path  # the stateless step graph (avatar.asr.onnx_runtime.DECODER_STEP_FILE)
    asr_vocab: Path  # the folder of Whisper's tokenizer.json and config.json
    llm_decoder: Path  # its folder also holds the tokenizer and chat template
    tts_vits: Path  # the packaged voice's graph as exported
    emotion_encoder: Path | None = None  # None: the "auto" emotion is neutral
    # face -> renderer graph; the first is the default face; empty: no video frames
    renderers: Mapping[str, Path] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LocalConfig:
    """What the served models read from their configs, for the in-process stages."""

    asr: AsrOptions = dataclasses.field(default_factory=AsrOptions)
    # persona, sampling defaults, first clause, generations side by side, prefix cache
    llm: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    threads: int = 1  # ONNX Runtime intra-op threads per call, as the embedded runners
    # the operator's documents (avatar.knowledge), embedded by `LocalModels.emotion_encoder`
    knowledge_dir: Path | None = None
    knowledge: KnowledgeConfig = dataclasses.field(default_factory=KnowledgeConfig)
    knowledge_sampling: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: dict(KNOWLEDGE_SAMPLING)
    )
    # an OpenAI-compatible endpoint answers instead of the packaged decoder (the operator's
    # own LLM, compared on the same turns: python -m perf says --endpoint URL)
    llm_endpoint: Endpoint | None = None


@contextlib.contextmanager
def local_stages(models: LocalModels, config: LocalConfig | None = None) -> Iterator[Stages]:
    """Stages over in-process sessions; the chat engine's scheduler runs in a thread until
    the block ends. The sessions are shared: threads may run turns concurrently."""
    from avatar.llm.decoder import OrtDecoder
    from avatar.llm.tokenizer import Tokenizer

    config = config or LocalConfig()
    if config.llm.grounding.embeds and config.llm.embed is None and models.emotion_encoder:
        # the served MiniLM, as the `llm` model calls it through BLS
        embed = sentence_embedder(models.emotion_encoder, config.threads)
        llm = dataclasses.replace(config.llm, embed=embed)
        config = dataclasses.replace(config, llm=llm)
    tokenizer = Tokenizer(models.llm_decoder.parent)
    decoder: _SequenceAtATime | None = None
    if config.llm_endpoint is not None:
        engine = ChatEngine(OpenAIBackend(config.llm_endpoint), None, config.llm)
    else:
        sequences = KvCacheSequences(
            OrtDecoder(models.llm_decoder, config.threads),
            PrefixCache(config.llm.prefix_cache_entries),
        )
        decoder = _SequenceAtATime(sequences, config.llm.max_batch)
        engine = ChatEngine(decoder, tokenizer, config.llm)
    chat = _Chat(engine, config.knowledge_sampling)
    stages = Stages(
        transcribe=_transcriber(models, config),
        chat=chat.chat,
        speak=_speaker(models.tts_vits, config.threads),
        render=_renderer(models.renderers, config.threads) if models.renderers else None,
        feel=_feeler(models.emotion_encoder, config.threads) if models.emotion_encoder else None,
        cut=chat.cut,
        # the budget counted by the LLM's own tokenizer
        recall=local_knowledge(models, config, lambda text: len(tokenizer.encode(text))).recall
        if config.knowledge_dir
        else None,
    )
    engine.backend.start()
    try:
        yield stages
    finally:
        engine.backend.stop()
        if decoder is not None:
            decoder.pool.shutdown()


def _session(path: Path, threads: int) -> Any:  # -> onnxruntime.InferenceSession
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _transcriber(models: LocalModels, config: LocalConfig) -> Callable[[np.ndarray], Heard]:
    from avatar.asr.onnx_runtime import OnnxWhisperRuntime
    from avatar.asr.vocab import WhisperVocab

    runtime = OnnxWhisperRuntime(models.asr_encoder, models.asr_decoder, config.threads)
    vocab = WhisperVocab.load(models.asr_vocab / "tokenizer.json", models.asr_vocab / "config.json")

    def transcribe_one(audio: np.ndarray) -> Heard:
        audio = check_audio(audio, max_seconds=config.asr.max_seconds)
        (result,) = transcribe(runtime, vocab, [audio], config.asr)
        return Heard(result.text, result.language)

    return transcribe_one


class _SequenceAtATime(SequenceDecoder):
    """Each sequence's step in its own decoder call, the calls of one scheduler step in
    parallel threads: sessions never share a forward pass, yet generate side by side."""

    def __init__(self, sequences: KvCacheSequences, workers: int) -> None:
        self.sequences = sequences
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="local-llm")

    def run(self, steps: Sequence[Step]) -> list[np.ndarray]:
        if len(steps) == 1:
            return self.sequences.run(steps)
        return list(self.pool.map(lambda step: self.sequences.run([step])[0], steps))

    def cached_tokens(self, sequence_id: int) -> int | None:
        return self.sequences.cached_tokens(sequence_id)

    def release(self, sequence_id: int) -> None:
        self.sequences.release(sequence_id)


class _Chat:
    """`chat` and `cut` on one engine, as the `llm` model serves them (sessions, forks,
    stop by turn id)."""

    def __init__(self, engine: ChatEngine, knowledge_sampling: Mapping[str, Any]) -> None:
        self.engine, self.knowledge_sampling = engine, knowledge_sampling

    def chat(self, text: str, request: TurnRequest, stop: Callable[[], bool]) -> Iterator[str]:
        parsed = self.engine.parse(
            json.dumps(llm_messages(text, request)),
            request.session_id,
            json.dumps(llm_sampling(request, knowledge=self.knowledge_sampling)),
            request.parent_session_id,
            request.context,
        )
        events: queue.Queue[Event] = queue.Queue()
        self.engine.submit(parsed, events.put, stop, request.turn_id)
        pending = ""
        while True:
            event = events.get()  # the scheduler ends every generation with a final event
            if event.finish_reason == "error":
                raise RuntimeError(f"generation failed: {event.error}")
            for chunk in event.chunks:
                pending += chunk.text
                if chunk.sentence and chunk.sentence.strip():
                    yield chunk.sentence.strip()
                    pending = ""
            if event.finish_reason is not None:
                break
        if pending.strip() and not stop():
            yield pending.strip()
        return event.stats or {}

    def cut(self, request: TurnRequest, spoken: str) -> None:
        self.engine.stop(request.turn_id, spoken, request.session_id)


def _speaker(path: Path, threads: int) -> Callable[[str, TurnRequest], Iterator[Speech]]:
    """The packaged English voice, and espeak-ng's for the fallback languages (Mandarin):
    each sentence spoken by the voice of the language it is written in."""
    from avatar.languages import speech_language
    from avatar.tts.phonemes import Phonemizer
    from avatar.tts.synth import Controls, Synthesizer, onnx_infer
    from avatar.tts.voice import packaged_voice
    from avatar.tts.voices import PiperSpeaker, Voices, fallback_speakers

    synth = Synthesizer(Phonemizer(packaged_voice().config), onnx_infer(_session(path, threads)))
    english = PiperSpeaker("en", synth, "packaged Piper voice")
    voices = Voices({"en": english, **fallback_speakers()})

    def speak(text: str, request: TurnRequest) -> Iterator[Speech]:
        speaker = voices.speaker(speech_language(text, request.language, voices.languages))
        controls = Controls.defaults(speaker.config, seed=request.controls.seed)
        for unit in speaker.units(text):
            piece = speaker.speak(unit, controls)
            yield Speech(
                piece.audio,
                piece.sample_rate,
                list(piece.phonemes),
                piece.starts,
                piece.ends,
                piece.text,
            )

    return speak


def sentence_embedder(path: Path, threads: int = 1) -> Callable[[list[str]], np.ndarray]:
    """Texts -> sentence vectors by the emotion encoder's graph (MiniLM): what the emotion,
    the knowledge retriever and grounding's embedding judges read."""
    from avatar.animation.emotion_classifier import SentenceTokenizer

    session, tokenize = _session(path, threads), SentenceTokenizer()
    return lambda texts: session.run(["embedding"], tokenize(texts))[0]


def local_knowledge(
    models: LocalModels, config: LocalConfig, count_tokens: TokenCounter = estimate_tokens
) -> KnowledgeBase:
    """`config.knowledge_dir`, embedded now by the emotion encoder's graph in this process."""
    if models.emotion_encoder is None or config.knowledge_dir is None:
        raise ValueError("knowledge needs a folder and the emotion_encoder graph")
    base = KnowledgeBase(
        config.knowledge_dir,
        sentence_embedder(models.emotion_encoder, config.threads),
        config.knowledge,
        count_tokens=count_tokens,
    )
    base.refresh()  # embedded now, not in the first turn
    return base


def _feeler(path: Path, threads: int) -> Callable[[str], tuple[str, float]]:
    from avatar.animation.emotion_classifier import EmotionClassifier

    classifier = EmotionClassifier.load(encoder=sentence_embedder(path, threads))

    def feel(text: str) -> tuple[str, float]:
        emotion = classifier.predict(text)
        return emotion.label, emotion.intensity

    return feel


def _renderer(
    paths: Mapping[str, Path], threads: int
) -> Callable[[np.ndarray, np.ndarray, str], np.ndarray | None]:
    sessions = {face: _session(path, threads) for face, path in paths.items()}
    default = next(iter(sessions))

    def render(blendshapes: np.ndarray, head_pose: np.ndarray, face: str) -> np.ndarray | None:
        """Frames of a sentence in one call (the graphs batch on a dynamic axis); None for
        a face without a renderer here, as the served model answers for one not served."""
        session = sessions.get(face or default)
        if session is None:
            return None
        feeds = {
            "blendshapes": np.ascontiguousarray(blendshapes, np.float32),
            "head_pose": np.ascontiguousarray(head_pose, np.float32),
        }
        return session.run(["frames"], feeds)[0]

    return render
