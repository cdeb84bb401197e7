"""End-of-turn material that sounds like users: questions that stop mid-sentence and
finished turns, from several voices (`python -m perf turn-taking` runs the strategies).

- Split questions (head, rest): the head cannot stand alone ("Can you tell me" | "where
  the nearest pharmacy is?"), of eight kinds (`KINDS`). Each is spoken WHOLE, then P
  seconds of silence are put in where its head ends (`hesitating`), so the voice's
  intonation there is that of an unfinished sentence. Where the head ends is the engine's
  own timing of the rest's first word (the Piper voice's phoneme durations, espeak-ng's word
  events), not a guess from lengths.
- Finished turns: short complete questions and statements (`COMPLETE`), and the split
  questions spoken whole without a pause.
- Voices (`VOICES`): the packaged Piper voice (normal and slower, evals/clips.py),
  espeak-ng voices at several speeds (Debian `espeak-ng`, installed by scripts/setup.sh, run
  through its library `libespeak-ng.so.1` for the word events), and the human LibriVox
  recordings of Debian's pocketsphinx-testdata (evals/recordings.py), cut at a low-energy
  gap between 35 % and 75 % of their speech (the sentence goes on after it), and whole.
  CMU ARCTIC is left out: the one package that would bring it offline, pysptk, ships a
  single ARCTIC clip, in a source distribution that pip must build to download.
- Splits: half the questions and statements are `dev` (thresholds are chosen on them), the
  other half `test`, alternating within each kind; the recordings alternate by clip.

Every clip has `LEAD_S` of silence before it and `TAIL_S` after. Audio is built on the fly
(nothing committed but this code) and kept in memory for the run. No model runs here but
the voices: the ends of speech are found by energy on the clean audio.
"""

from __future__ import annotations

import ctypes
import dataclasses
import shutil
from collections.abc import Iterator
from functools import lru_cache

import numpy as np

SAMPLE_RATE = 16_000
LEAD_S = 0.3  # silence before each clip
TAIL_S = 2.5  # silence after each clip
PAUSES = (0.3, 0.5, 0.7, 0.9, 1.2, 1.5)  # seconds of silence inserted after a head
SPLITS = ("dev", "test")
FAMILIES = ("piper", "espeak", "human")
HOP = SAMPLE_RATE // 100  # 10-ms energy windows
HUMAN_CUT = (0.35, 0.75)  # where in a recording's speech its head may end

# kind -> (head, rest) questions; a head cannot stand alone as a turn
KINDS: dict[str, tuple[tuple[str, str], ...]] = {
    "verb": (  # a verb waiting for its object
        ("Can you tell me", "where the nearest pharmacy is?"),
        ("Could you find out", "if the spa is open tonight?"),
        ("I wanted to ask", "whether parking is included in the price."),
        ("Could you show me", "how to connect to the wifi?"),
        ("I'm looking for", "someone who can fix my phone."),
    ),
    "preposition": (
        ("Is there a shuttle to", "the airport in the morning?"),
        ("Can I leave my bags with", "you until this evening?"),
        ("Do you have this jacket in", "a smaller size?"),
        ("What do you think about", "the new map in this game?"),
        ("Is the restaurant on", "this floor or upstairs?"),
    ),
    "opener": (  # a question's opening words
        ("What time does", "breakfast end on Sundays?"),
        ("How much is", "a single room for three nights?"),
        ("Where can I", "find a good place for dinner?"),
        ("Why did", "the stream freeze a minute ago?"),
        ("Which of", "these boots are on sale?"),
    ),
    "determiner": (
        ("Could I get a", "late checkout tomorrow?"),
        ("I'd like the", "blue scarf from the window."),
        ("Can you recommend some", "games to play with friends?"),
        ("Do you sell any", "batteries for cameras?"),
        ("Is there another", "blanket I could borrow?"),
    ),
    "conjunction": (
        ("I booked a room and", "I need to add a night."),
        ("The receipt is here but", "the total looks wrong."),
        ("We beat the final boss so", "what should we play next?"),
        ("My key card stopped working and", "I can't get into my room."),
        ("Should I pay now or", "when I pick it up?"),
    ),
    "subordinate": (  # a subordinate clause before its main clause
        ("If I check out late", "will you charge me for another night?"),
        ("When the chat gets busy", "can you read the questions for me?"),
        ("Before I buy this", "can I try it on?"),
        ("Since the pool is closed", "is there a discount today?"),
        ("Although I reserved a table", "nobody seems to have my name."),
    ),
    "filler": (  # a hesitation before the question
        ("So um", "do you have a gym?"),
        ("Well uh", "is the museum far from here?"),
        ("Hmm let me see", "do you take credit cards?"),
        ("Okay so like", "how many viewers are watching right now?"),
        ("Uh and also", "could you wake me at seven?"),
    ),
    "auxiliary": (
        ("Would you", "call me a taxi please?"),
        ("Can we", "raid another channel after this?"),
        ("Does it", "come with a warranty?"),
        ("Should I", "keep the receipt for returns?"),
        ("Have you", "seen my sunglasses anywhere?"),
    ),
}
# finished turns spoken whole (their own kind: "complete")
COMPLETE = (
    "Where is the nearest pharmacy?",
    "I'd like a taxi.",
    "Thanks, that's all.",
    "Is breakfast included?",
    "Can I pay by card?",
    "What's the wifi password?",
    "I need two more towels.",
    "How late is the bar open?",
    "Do you have these in red?",
    "That was a great stream.",
    "Please send someone to fix the shower.",
    "We're checking out now.",
    "How much does this cost?",
    "Is the gym open all night?",
    "I'll take the green one.",
    "Good morning, I have a reservation.",
    "What game are we playing next?",
    "Can you turn the music down?",
    "Where do I leave the key?",
    "Yes, that works for me.",
)


@dataclasses.dataclass(frozen=True)
class Question:
    kind: str
    head: str  # cannot stand alone
    rest: str
    split: str

    @property
    def text(self) -> str:
        return f"{self.head} {self.rest}"


def questions(split: str | None = None) -> list[Question]:
    """The split questions, in a fixed order; alternate ones of each kind are `dev` and
    `test`, the first one of every other kind `test` (so the halves are equal)."""
    out = [
        Question(kind, head, rest, SPLITS[(k + i) % 2])
        for k, (kind, pairs) in enumerate(KINDS.items())
        for i, (head, rest) in enumerate(pairs)
    ]
    return [q for q in out if split in (None, q.split)]


def complete_turns(split: str | None = None) -> list[tuple[str, str]]:
    """(text, split) of the statements spoken whole, alternating dev and test."""
    out = [(text, SPLITS[i % 2]) for i, text in enumerate(COMPLETE)]
    return [t for t in out if split in (None, t[1])]


@dataclasses.dataclass(frozen=True)
class Voice:
    """A synthetic speaker: the packaged Piper voice at a length scale, or an espeak-ng
    voice (`espeak-ng -v NAME`) at a rate in words per minute."""

    name: str
    family: str  # "piper" or "espeak"
    engine_voice: str = ""  # espeak-ng's voice name
    speed: float = 1.0  # Piper's length scale (> 1: slower), espeak-ng's words per minute

    def speak(self, text: str) -> np.ndarray:
        """[samples] float32 at 16 kHz: the same samples for the same text."""
        return _spoken(self, text)[0]

    def rest_start(self, head: str, rest: str) -> int:
        """The sample of `speak(f"{head} {rest}")` at which the engine starts `rest`: the
        Piper voice's phoneme durations, espeak-ng's word events. Raises AssertionError
        where the engine joins the head's last word to the rest's first ("for a")."""
        text = f"{head} {rest}"
        if self.family == "piper":
            from evals.clips import words_spoken

            starts, heads = _spoken(self, text)[1], words_spoken(head)
            assert heads + words_spoken(rest) == len(starts), f"{text!r}: a word joined across"
            return starts[heads]
        at = [sample for character, sample in _spoken(self, text)[1] if character == len(head) + 2]
        assert at, f"{text!r}: espeak-ng spoke the rest's first word with the head's"
        return at[0]

    def head_end(self, head: str, rest: str) -> int:
        """Where the head ends in `speak(f"{head} {rest}")`: espeak-ng's word event for the
        rest; for the Piper voice, whose decoder starts a word a little before its phoneme
        frames, the quiet point in the 50 ms before them (checked by ear and by Whisper on
        the two parts: `tests/test_turn_taking_eval.py`)."""
        start = self.rest_start(head, rest)
        if self.family == "piper":
            return quietest(self.speak(f"{head} {rest}"), start - SAMPLE_RATE // 20, start)
        return start


VOICES = (
    Voice("piper", "piper"),
    Voice("piper slow", "piper", speed=1.2),
    Voice("espeak en-us", "espeak", "en-us", 165),
    Voice("espeak en-gb", "espeak", "en", 150),  # `-v en-gb` of the command: gmw/en
    Voice("espeak en-us+f3", "espeak", "en-us+f3", 180),
    Voice("espeak en+m3", "espeak", "en+m3", 135),
)


class MissingVoiceError(RuntimeError):
    """espeak-ng is not installed."""


@lru_cache(maxsize=4096)
def _spoken(voice: Voice, text: str) -> tuple[np.ndarray, tuple]:
    """(the audio, the Piper voice's word starts or espeak-ng's (character, sample) word
    events: 1-based characters, samples at 16 kHz)."""
    if voice.family == "piper":
        from evals.clips import synthesize, word_starts

        audio, timing = synthesize(text, voice.speed), word_starts(text, voice.speed)
    else:
        audio, timing = espeak(text, voice.engine_voice, int(voice.speed))
    audio.setflags(write=False)
    return audio, tuple(timing)


class _EspeakEvent(ctypes.Structure):  # espeak_EVENT of speak_lib.h
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # 1-based, in characters
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # ms
        ("sample", ctypes.c_int),  # at the library's rate
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_ESPEAK_WORD, _ESPEAK_LIST_END = 1, 0
_ESPEAK_SYNCHRONOUS, _ESPEAK_DONT_EXIT, _ESPEAK_RATE, _POS_CHARACTER, _UTF8 = 2, 0x8000, 1, 1, 1
_EspeakCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_EspeakEvent)
)


@lru_cache(maxsize=1)
def _espeak_library() -> tuple[ctypes.CDLL, int, list, list, object]:
    """(libespeak-ng, its sample rate, the samples and word events of the text being
    spoken, the callback that fills them: kept alive with the library)."""
    if shutil.which("espeak-ng") is None:
        raise MissingVoiceError("espeak-ng is missing: scripts/setup.sh installs it (Debian)")
    library = ctypes.CDLL("libespeak-ng.so.1")
    rate = library.espeak_Initialize(_ESPEAK_SYNCHRONOUS, 0, None, _ESPEAK_DONT_EXIT)
    assert rate > 0, f"espeak_Initialize failed: {rate}"
    samples: list[np.ndarray] = []
    words: list[tuple[int, int]] = []  # (character, sample)

    def heard(wav, count, events) -> int:
        if count > 0:
            samples.append(np.ctypeslib.as_array(wav, (count,)).copy())
        i = 0
        while events[i].type != _ESPEAK_LIST_END:
            if events[i].type == _ESPEAK_WORD:
                words.append((events[i].text_position, events[i].sample))
            i += 1
        return 0

    callback = _EspeakCallback(heard)
    library.espeak_SetSynthCallback(callback)
    return library, rate, samples, words, callback


def espeak(text: str, voice: str, words_per_minute: int) -> tuple[np.ndarray, list]:
    """`text` spoken by espeak-ng's library (the samples `espeak-ng -v VOICE -s WPM --stdout`
    writes), with its word events ((1-based character, sample) where each word it spoke
    starts): [samples] float32, 16 kHz mono, peak 0.8 (as the Piper clips are scaled)."""
    from scipy.signal import resample_poly

    library, rate, samples, words, _ = _espeak_library()
    samples.clear()
    words.clear()
    assert library.espeak_SetVoiceByName(voice.encode()) == 0, f"no espeak-ng voice {voice}"
    library.espeak_SetParameter(_ESPEAK_RATE, words_per_minute, 0)
    data = text.encode()
    assert library.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _UTF8, None, None) == 0
    library.espeak_Synchronize()
    audio = np.concatenate(samples).astype(np.float64) / 32768.0
    divisor = np.gcd(SAMPLE_RATE, rate)
    audio = resample_poly(audio, SAMPLE_RATE // divisor, rate // divisor)
    peak = float(np.abs(audio).max()) or 1.0
    events = [(character, round(sample * SAMPLE_RATE / rate)) for character, sample in words]
    return (0.8 * audio / peak).astype(np.float32), events


# -- where speech is, by energy --------------------------------------------------------


def levels_db(audio: np.ndarray) -> np.ndarray:
    """Energy of each 10-ms window of `audio`, in dB."""
    windows = np.asarray(audio, np.float64)[: len(audio) // HOP * HOP].reshape(-1, HOP)
    return 10 * np.log10((windows**2).mean(axis=1) + 1e-12)


def speech_threshold(levels: np.ndarray) -> float:
    """The level above which a window is speech: 40 dB under the loudest window, or 12 dB
    over the noise floor (the quietest tenth) of a noisy recording."""
    return max(float(levels.max()) - 40.0, float(np.percentile(levels, 10)) + 12.0)


def speech_span(audio: np.ndarray) -> tuple[int, int]:
    """(first, end) sample of the speech in `audio`: its first loud window, and the end of
    its last one (where the last word ends)."""
    levels = levels_db(audio)
    loud = np.flatnonzero(levels > speech_threshold(levels))
    assert len(loud), "no speech in the clip"
    return int(loud[0]) * HOP, (int(loud[-1]) + 1) * HOP


def quietest(audio: np.ndarray, first: int, end: int) -> int:
    """A sample at a word boundary between samples `first` and `end`: the middle of the
    longest run of windows under the speech threshold, else the quietest window's start."""
    levels = levels_db(audio)
    low, high = first // HOP, max(first // HOP + 1, end // HOP)
    quiet = np.r_[False, levels[low:high] <= speech_threshold(levels), False].astype(np.int8)
    starts, stops = np.flatnonzero(np.diff(quiet) == 1), np.flatnonzero(np.diff(quiet) == -1)
    if len(starts):
        longest = int(np.argmax(stops - starts))
        return (low + (starts[longest] + stops[longest]) // 2) * HOP
    return (low + int(np.argmin(levels[low:high]))) * HOP


def with_pause(audio: np.ndarray, at: int, pause_s: float) -> np.ndarray:
    """`audio` with `pause_s` of silence put in at sample `at`."""
    gap = np.zeros(round(pause_s * SAMPLE_RATE), np.float32)
    return np.concatenate([audio[:at], gap, audio[at:]])


def hesitating(voice: Voice, head: str, rest: str, pause_s: float) -> tuple[np.ndarray, int]:
    """(`head rest` spoken whole by `voice` with `pause_s` of silence where the head ends,
    the sample where the silence starts): a speaker who stops to think, with the intonation
    of an unfinished sentence."""
    at = voice.head_end(head, rest)
    return with_pause(voice.speak(f"{head} {rest}"), at, pause_s), at


# -- the items ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Item:
    """One clip to endpoint: an unfinished head with a pause (`pause_s`), or a finished
    turn (`pause_s` None). Sample indices count from the start of `audio`, lead included."""

    split: str
    voice: str
    family: str
    kind: str
    head: str  # the words before the pause (the whole text for a finished turn)
    text: str  # the whole question
    pause_s: float | None
    head_end: int | None  # unfinished: where the head's speech ends (the silence starts)
    end: int  # where the last word ends (by energy on the clean audio)
    audio: np.ndarray = dataclasses.field(repr=False)

    @property
    def finished(self) -> bool:
        return self.pause_s is None

    @property
    def unpaused(self) -> tuple[str, str, str]:
        """What the item is without its pause: items that share it share the audio up to
        the end of the head."""
        return (self.voice, self.text, self.kind)


def _item(audio: np.ndarray, at: int | None = None, **known) -> Item:
    """The item of a clip (`at`: where its head ends, None for a finished turn), framed by
    the lead and tail silences."""
    lead = round(LEAD_S * SAMPLE_RATE)
    framed = np.concatenate(
        [np.zeros(lead, np.float32), audio, np.zeros(round(TAIL_S * SAMPLE_RATE), np.float32)]
    )
    framed.setflags(write=False)
    head_end = None if at is None else lead + at
    return Item(**known, head_end=head_end, end=lead + speech_span(audio)[1], audio=framed)


def unfinished(voice: Voice, question: Question, pause_s: float) -> Item:
    audio, at = hesitating(voice, question.head, question.rest, pause_s)
    return _item(
        audio,
        at,
        split=question.split,
        voice=voice.name,
        family=voice.family,
        kind=question.kind,
        head=question.head,
        text=question.text,
        pause_s=pause_s,
    )


def finished(voice: Voice, text: str, split: str, kind: str = "complete") -> Item:
    return _item(
        voice.speak(text),
        split=split,
        voice=voice.name,
        family=voice.family,
        kind=kind,
        head=text,
        text=text,
        pause_s=None,
    )


@lru_cache(maxsize=1)
def _recordings() -> tuple[tuple[str, np.ndarray, str], ...]:
    """(text, audio, split) of the LibriVox recordings, alternating dev and test."""
    from evals.recordings import human_clips

    clips = human_clips(sets=("librivox",))
    return tuple((c.text, c.audio, SPLITS[i % 2]) for i, c in enumerate(clips))


def recording_texts(split: str | None = None) -> list[str]:
    """What the LibriVox recordings of `split` say (finished turns, each a whole sentence)."""
    return [text for text, _, part in _recordings() if split in (None, part)]


def human_cut(audio: np.ndarray) -> int:
    """A low-energy gap between 35 % and 75 % of the recording's speech (a word boundary)."""
    first, end = speech_span(audio)
    low, high = (first + round(f * (end - first)) for f in HUMAN_CUT)
    return quietest(audio, low, high)


def human_unfinished(text: str, audio: np.ndarray, split: str, pause_s: float) -> Item:
    at = human_cut(audio)
    first, end = speech_span(audio)
    words = text.split()  # the head's words, estimated from its share of the speech
    head = " ".join(words[: round(len(words) * (at - first) / (end - first))])
    return _item(
        with_pause(audio, at, pause_s),
        at,
        split=split,
        voice="human",
        family="human",
        kind="read",
        head=head,
        text=text,
        pause_s=pause_s,
    )


def human_finished(text: str, audio: np.ndarray, split: str) -> Item:
    return _item(
        audio,
        split=split,
        voice="human",
        family="human",
        kind="read",
        head=text,
        text=text,
        pause_s=None,
    )


def items(
    split: str | None = None,
    families: tuple[str, ...] = FAMILIES,
    pauses: tuple[float, ...] = PAUSES,
    limit: int | None = None,
) -> Iterator[Item]:
    """Every item of `split` (both when None) for voices of `families`: per voice, the
    questions with each pause, then the finished turns (the questions whole, then the
    statements). `limit`: at most that many questions, statements and recordings per
    voice and split (a quick run)."""
    splits = SPLITS if split is None else (split,)
    for voice in [v for v in VOICES if v.family in families]:
        for part in splits:
            asked = questions(part)[:limit]
            for question in asked:
                for pause in pauses:
                    yield unfinished(voice, question, pause)
            for question in asked:
                yield finished(voice, question.text, part, question.kind)
            for text, _ in complete_turns(part)[:limit]:
                yield finished(voice, text, part)
    if "human" in families:
        for part in splits:
            clips = [(t, a, s) for t, a, s in _recordings() if s == part][:limit]
            for text, audio, _ in clips:
                for pause in pauses:
                    yield human_unfinished(text, audio, part, pause)
            for text, audio, _ in clips:
                yield human_finished(text, audio, part)
