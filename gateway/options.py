"""The gateway's settings for its sessions (one object per gateway). The fields made with
`flag(...)` are also the gateway's command-line flags (gateway/flags.py generates them from
here: one place for a setting, its default and its help)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from avatar.end_of_turn import ASK_AT_S, COMPLETE_AT, INCOMPLETE_SILENCE_S, Fusion
from avatar.endpointing import END_SILENCE_S

STRATEGIES = ("model", "silence")  # the end-of-turn strategies (gateway/endpointing.py)


def flag(default, help: str, **argument) -> dataclasses.Field:
    """A setting that is also a command-line flag: `--name-of-the-field` with this default
    and `help`; `argument`: more of argparse's add_argument (choices, type), `name`: another
    flag name, `off`: (name, help) of a flag that sets it to None (a setting whose default is
    not None), `negated`: the flag that turns a True setting off."""
    return dataclasses.field(default=default, metadata={"help": help, **argument})


@dataclasses.dataclass
class SessionOptions:
    end_silence_s: float = flag(END_SILENCE_S, "silence that ends an utterance")  # a control
    threshold: float = 0.5  # vad speech probability that starts speech
    silence_timeout_s: float = 60.0  # a turn silent this long is abandoned with an error
    # an utterance this long is cut and not answered (noise, or a monologue): error too_long
    max_utterance_s: float = flag(30.0, "an utterance this long is cut and not answered")
    # When the turn ends (gateway/endpointing.py): "model" asks `turn_detector` (Smart
    # Turn v3.2) at the silences of turn_ask_at_s; p >= turn_complete_at ends the turn then,
    # a lower answer lets the speaker pause up to turn_incomplete_silence_s; with no answer,
    # end_silence_s. "silence": end_silence_s always. The figures: python -m perf
    # endpointing (docs/performance.md section 18).
    endpointing: str = flag(
        "model",
        "model: the end-of-turn models (turn_detector, turn_words) asked at short pauses end a "
        "complete turn at once and let an unfinished one pause longer; silence: "
        "--end-silence-s of silence ends every turn",
        choices=STRATEGIES,
    )
    turn_ask_at_s: tuple[float, ...] = ASK_AT_S
    turn_complete_at: float = flag(
        COMPLETE_AT, "without turn_words: the audio's probability at which a turn is complete"
    )
    turn_incomplete_silence_s: float = flag(
        INCOMPLETE_SILENCE_S, "without turn_words: the silence that ends an incomplete turn"
    )
    # with `turn_words` served, the words' answer on the transcript at the pause is fused
    # with the audio's (python -m perf turn-taking: docs/performance.md section 25)
    turn_fusion: Fusion = dataclasses.field(default_factory=Fusion)
    # the operator's personas, {name: persona text}: a web client picks one by name
    # (`persona_preset`); free `persona` text only with allow_persona_text (or the key)
    personas: dict[str, str] = dataclasses.field(default_factory=dict)
    allow_persona_text: bool = flag(
        False, "let web clients send free persona text (by default only the operator key may)"
    )
    model: str = "avatar"
    asr_model: str = "asr"  # the speculative transcripts' model
    # Speculative ASR: transcribe at the first pause of this length, while the endpointer
    # still waits for end_silence_s; the turn then starts from the text at the end of
    # speech. Speech that resumes discards it. None: the avatar model transcribes.
    # The first end-of-turn ask reads this pass's transcript, so they go together.
    speculate_after_s: float | None = flag(
        ASK_AT_S[0],
        "start ASR at a pause this long, before the end of speech is confirmed",
        off=("--no-speculate", "the avatar model transcribes each turn"),
    )
    # Speculative turn: also start the reply from that transcript, in a fork of the
    # conversation (a new session id with the session's memory), and hold its messages
    # until the end of speech is confirmed; then they are sent and the conversation goes on
    # in the fork. Speech that resumes cancels it and leaves the conversation as it was.
    # Off: with the pause's pass first (below) it gains at the median (python -m perf
    # latency --settings today spec_turn, two runs: first audio 0.94-0.98x at 1 session,
    # 0.92x at 2, 0.76-0.81x at 4), but a question with a pause inside starts a reply that
    # is then cancelled, and its work delays the real one: p95 1.17-1.18x at 1 session
    # (docs/performance.md 15). On for many short, unhesitating questions per machine.
    speculate_turn: bool = flag(
        False,
        "at that pause also start the reply (in a fork of the conversation), held until the "
        "end of speech is confirmed",
    )
    # ...and where the end-of-turn models hold a pause (the words doubt the turn is over, so
    # it may run 1.8 s before the turn ends: avatar.end_of_turn.Fusion), start the reply
    # then, the same way: a finished turn the words doubted has its reply under way when the
    # hold ends, and a speaker who goes on discards it. Only held pauses: most turns end
    # when the words are read, and a reply started at every pause cost the real one its
    # cores (above). python -m perf capacity (docs/performance.md section 25, eighth round).
    speculate_held: bool = flag(
        True,
        "do not start the reply at a pause the end-of-turn models hold (by default it starts "
        "then, in a fork of the conversation, held until the end of speech is confirmed)",
        negated="--no-speculate-held",
    )
    # Transcribe while the user speaks: every `partial_every_s` of speech, a pass over the
    # speech so far (at most `partial_limit` in flight in this gateway, so that they never
    # take more than that many cores from the turns being answered); what two passes agree
    # on is where the transcript at the pause starts (the `asr` model's `prefix`), so only
    # the last words are decoded token by token. None: off.
    # python -m perf asr-prefix (docs/performance.md section 12): every 1 s keeps the WER
    # on the human recordings and the packaged voice; every 0.5 s raised it.
    partial_every_s: float | None = flag(
        1.0,
        "while the user speaks, transcribe the speech so far every this many seconds (what "
        "two passes agree on is where the transcript at the pause starts)",
        off=("--no-partials", "no transcription while the user speaks"),
    )
    partial_limit: int = 1
    # ...and, when set, none while more than this many replies are being generated in this
    # gateway (captions wait under load). Off: side by side at 4 sessions on 2 cores it
    # did not bring the first audio sooner (python -m perf latency: `today`, without it,
    # against `captions_wait`; docs/performance.md section 18, as section 14 found).
    partial_max_answering: int | None = flag(
        None,
        "no transcription while the user speaks while more than this many replies are being "
        "generated in this gateway (default: no such limit)",
        type=int,
        name="--partials-max-answering",
    )
    # The passes take the language of the session's last utterance; before one is known
    # they wait for this much speech: Whisper heard the first second of "What time does the
    # museum open on Sunday?" as Urdu ("وطن دستم مممم...", to its token limit).
    detect_language_s: float = flag(
        2.0,
        "until a session's language is known, its passes while speaking wait for this much "
        "speech (Whisper guesses the language of one second badly)",
    )
    # The pass at a pause decides when the reply can start; the passes while speaking only
    # show captions. So while a pass at a pause runs in this gateway, no pass while speaking
    # starts, and those running (any session's) are cancelled: the `asr` model drops a
    # cancelled request's row at its next decoder step. False: they run alongside.
    pause_first: bool = flag(
        True,
        "let the passes while speaking run alongside a pass at a pause (by default that pass "
        "cancels them and none starts until it is done)",
        negated="--passes-alongside",
    )


def load_personas(path: Path | None) -> dict[str, str]:
    """--personas FILE: a JSON object {"name": "persona text", ...}; {} for None."""
    if path is None:
        return {}
    try:
        personas = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--personas {path}: {error}") from None
    if not isinstance(personas, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in personas.items()
    ):
        raise ValueError(f'--personas {path}: expected {{"name": "persona text", ...}}')
    return personas
