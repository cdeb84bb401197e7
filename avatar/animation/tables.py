"""Mapping tables as data: IPA phoneme -> viseme, viseme -> ARKit-52, FACS emotion -> ARKit-52.

Sources:
- Visemes: the 15 visemes of the Oculus (Meta) Lipsync viseme reference
  (developer.oculus.com/documentation/unity/audio-ovrlipsync-viseme-reference), which
  follow the MPEG-4 FBA viseme set (ISO/IEC 14496-2, Annex C): sil, PP, FF, TH, DD, kk,
  CH, SS, nn, RR, aa, E, ih, oh, ou, with their example phonemes.
- Phonemes: espeak-ng's en-us IPA inventory as `piper_phonemize.phonemize_espeak` returns it
  (one code point per symbol; stress ˈ ˌ, length ː, syllabic ̩ and tie ͡ marks are separate),
  and its Mandarin ("cmn", pinyin-derived) inventory after `avatar.tts.mandarin.to_ipa`:
  tones as Chao tone letters ˥ ˦ ˧ ˨ ˩, retroflexes ʂ ʐ with a combining dot, ɤ, y.
- Blendshape names: Apple's `ARFaceAnchor.BlendShapeLocation`, in the order of Apple's
  documentation page (left eye, right eye, mouth and jaw, eyebrows, cheeks, nose, tongue).
- Viseme -> blendshape weights: hand-authored to reproduce the mouth shapes drawn in the
  Oculus viseme reference images with ARKit shapes (jaw opening, lip rounding, spreading,
  closure); they are an approximation, not measured data.
- Emotions: prototype Action Units per basic emotion from EMFACS (Ekman & Friesen 1978;
  Friesen & Ekman 1983, as tabulated in Ekman, Friesen & Hager, FACS Investigator's Guide,
  2002), and a FACS AU -> ARKit correspondence following the AU descriptions (AU1 inner
  brow raiser = browInnerUp, AU12 lip corner puller = mouthSmile, ...).
"""

from __future__ import annotations

ARKIT_NAMES: tuple[str, ...] = (
    # left eye
    "eyeBlinkLeft", "eyeLookDownLeft", "eyeLookInLeft", "eyeLookOutLeft", "eyeLookUpLeft",
    "eyeSquintLeft", "eyeWideLeft",
    # right eye
    "eyeBlinkRight", "eyeLookDownRight", "eyeLookInRight", "eyeLookOutRight", "eyeLookUpRight",
    "eyeSquintRight", "eyeWideRight",
    # mouth and jaw
    "jawForward", "jawLeft", "jawRight", "jawOpen", "mouthClose", "mouthFunnel", "mouthPucker",
    "mouthLeft", "mouthRight", "mouthSmileLeft", "mouthSmileRight", "mouthFrownLeft",
    "mouthFrownRight", "mouthDimpleLeft", "mouthDimpleRight", "mouthStretchLeft",
    "mouthStretchRight", "mouthRollLower", "mouthRollUpper", "mouthShrugLower", "mouthShrugUpper",
    "mouthPressLeft", "mouthPressRight", "mouthLowerDownLeft", "mouthLowerDownRight",
    "mouthUpperUpLeft", "mouthUpperUpRight",
    # eyebrows
    "browDownLeft", "browDownRight", "browInnerUp", "browOuterUpLeft", "browOuterUpRight",
    # cheeks
    "cheekPuff", "cheekSquintLeft", "cheekSquintRight",
    # nose
    "noseSneerLeft", "noseSneerRight",
    # tongue
    "tongueOut",
)  # fmt: skip
ARKIT_INDEX: dict[str, int] = {name: i for i, name in enumerate(ARKIT_NAMES)}

VISEMES: tuple[str, ...] = (
    "sil", "PP", "FF", "TH", "DD", "kk", "CH", "SS", "nn", "RR", "aa", "E", "ih", "oh", "ou",
)  # fmt: skip
VISEME_INDEX: dict[str, int] = {name: i for i, name in enumerate(VISEMES)}

# Visemes during which the lips are closed (bilabial closure) or the mouth rests.
CLOSED_VISEMES: frozenset[str] = frozenset({"sil", "PP"})

# espeak-ng en-us IPA symbol -> viseme. Oculus examples in comments.
PHONEME_TO_VISEME: dict[str, str] = {
    # PP: "put", "bat", "mat"
    "p": "PP", "b": "PP", "m": "PP",
    # FF: "fat", "vat"
    "f": "FF", "v": "FF",
    # TH: "think", "that"
    "θ": "TH", "ð": "TH",
    # DD: "tip", "doll" (alveolar stops and taps)
    "t": "DD", "d": "DD", "ɾ": "DD",
    # kk: "call", "gas" (velars; ŋ shares the velar closure)
    "k": "kk", "ɡ": "kk", "g": "kk", "ŋ": "kk", "x": "kk", "ç": "kk",
    # CH: "chair", "join", "she", "measure" (espeak writes tʃ, dʒ as two symbols)
    "ʃ": "CH", "ʒ": "CH",
    # SS: "sir", "zeal"
    "s": "SS", "z": "SS",
    # nn: "lot", "not"
    "n": "nn", "l": "nn", "ɫ": "nn", "ɬ": "nn",
    # RR: "red"
    "ɹ": "RR", "r": "RR", "ɚ": "RR", "ɝ": "RR",
    # aa: "car"
    "ɑ": "aa", "a": "aa", "æ": "aa", "ʌ": "aa", "ɐ": "aa", "ɒ": "aa",
    # E: "bed"
    "ɛ": "E", "e": "E", "ə": "E", "ɜ": "E",
    # ih: "tip" (and j, "yes", which spreads the lips the same way)
    "ɪ": "ih", "i": "ih", "ᵻ": "ih", "j": "ih", "ɨ": "ih",
    # oh: "toe"
    "o": "oh", "ɔ": "oh",
    # ou: "book" (and w, which rounds the lips the same way)
    "u": "ou", "ʊ": "ou", "w": "ou",
}  # fmt: skip

# Mandarin (espeak-ng "cmn" after avatar.tts.mandarin.to_ipa): the symbols English lacks.
# Pinyin b/p/m are p/p/m (closed lips: PP above), u/o round the lips (ou/oh above).
MANDARIN_TO_VISEME: dict[str, str] = {
    # h (hǎo) is a velar/uvular fricative: the tongue, not the lips, like k
    "χ": "kk",
    # x, sh, r (xī, shì, rì): palatal / retroflex sibilants, lips slightly protruded as in
    # "she"; ɻ is erhua's r colouring
    "ɕ": "CH", "ʂ": "CH", "ʐ": "CH", "ʑ": "CH", "ɻ": "RR",
    # ü (yú, lǜ): a rounded front vowel, lips as for u
    "y": "ou", "ɥ": "ou",
    # e (gē): unrounded mid back vowel, lips spread and half open
    "ɤ": "E",
    # the apical vowels after z c s / zh ch sh r (zì, shì): spread, nearly closed
    "ɿ": "ih", "ʅ": "ih",
}  # fmt: skip
PHONEME_TO_VISEME.update(MANDARIN_TO_VISEME)

# Symbols with no shape of their own. "next": merged into the following phoneme (stress
# precedes its vowel); "prev": merged into the preceding one (length, syllabic, tie);
# "neighbour": takes the shape of the following phoneme (h and the glottal stop are shaped
# by the vowel they precede); "boundary": a word boundary, closes the mouth only when long.
MODIFIERS: dict[str, str] = {
    "ˈ": "next", "ˌ": "next",
    "ː": "prev", "ˑ": "prev", "\u0329": "prev", "\u0361": "prev", "\u0303": "prev",
    "h": "neighbour", "ʔ": "neighbour",
    " ": "boundary",
    # Mandarin: tones (Chao letters) belong to the syllable before them; the retroflex dot,
    # the apical (bridge) and retracted marks to the letter before them
    "˥": "prev", "˦": "prev", "˧": "prev", "˨": "prev", "˩": "prev",
    "\u0323": "prev", "\u032a": "prev", "\u0320": "prev",
}  # fmt: skip
PUNCTUATION: frozenset[str] = frozenset(".,;:!?¡¿—…\"'()-")
# Piper's utterance begin / end / pad ids (piper-phonemize's ^ $ _): the silence around speech
UTTERANCE_MARKS: frozenset[str] = frozenset("^$_")

# Coarticulation dominance (Cohen & Massaro 1993): how strongly a viseme holds its shape
# against its neighbours. Closures and labiodentals must be reached, vowels give way.
DOMINANCE: dict[str, float] = {
    "sil": 1.0, "PP": 1.5, "FF": 2.0, "TH": 1.2, "DD": 0.8, "kk": 0.6, "CH": 1.5, "SS": 1.0,
    "nn": 0.7, "RR": 1.0, "aa": 1.0, "E": 1.0, "ih": 1.0, "oh": 1.2, "ou": 1.2,
}  # fmt: skip

_L_R = ("Left", "Right")


def _both(stem: str, weight: float) -> dict[str, float]:
    return {f"{stem}{side}": weight for side in _L_R}


# Viseme -> ARKit weights (0..1). Neutral (all zero) is a closed, relaxed mouth.
VISEME_TO_ARKIT: dict[str, dict[str, float]] = {
    "sil": {},
    "PP": {"mouthClose": 0.05, "jawOpen": 0.05, **_both("mouthPress", 0.5),
           "mouthRollLower": 0.3, "mouthRollUpper": 0.2},
    "FF": {"jawOpen": 0.12, "mouthRollLower": 0.6, **_both("mouthUpperUp", 0.3),
           "mouthFunnel": 0.05},
    "TH": {"jawOpen": 0.18, "tongueOut": 0.35, **_both("mouthLowerDown", 0.1)},
    "DD": {"jawOpen": 0.22, **_both("mouthStretch", 0.15), **_both("mouthUpperUp", 0.1),
           **_both("mouthLowerDown", 0.15)},
    "kk": {"jawOpen": 0.28, **_both("mouthStretch", 0.2), **_both("mouthLowerDown", 0.15)},
    "CH": {"jawOpen": 0.2, "mouthFunnel": 0.5, "mouthPucker": 0.25,
           **_both("mouthUpperUp", 0.2), **_both("mouthLowerDown", 0.2)},
    "SS": {"jawOpen": 0.1, **_both("mouthStretch", 0.35), **_both("mouthSmile", 0.15),
           **_both("mouthUpperUp", 0.15), **_both("mouthLowerDown", 0.15)},
    "nn": {"jawOpen": 0.18, **_both("mouthStretch", 0.1), **_both("mouthLowerDown", 0.1)},
    "RR": {"jawOpen": 0.2, "mouthFunnel": 0.35, "mouthPucker": 0.3},
    "aa": {"jawOpen": 0.65, **_both("mouthLowerDown", 0.3), **_both("mouthStretch", 0.1)},
    "E": {"jawOpen": 0.4, **_both("mouthStretch", 0.35), **_both("mouthSmile", 0.2),
          **_both("mouthLowerDown", 0.25), **_both("mouthUpperUp", 0.15)},
    "ih": {"jawOpen": 0.25, **_both("mouthStretch", 0.45), **_both("mouthSmile", 0.3),
           **_both("mouthUpperUp", 0.1)},
    "oh": {"jawOpen": 0.45, "mouthFunnel": 0.6, "mouthPucker": 0.25},
    "ou": {"jawOpen": 0.2, "mouthPucker": 0.75, "mouthFunnel": 0.35},
}  # fmt: skip

# FACS Action Unit -> ARKit weights at full intensity.
AU_TO_ARKIT: dict[str, dict[str, float]] = {
    "AU1": {"browInnerUp": 1.0},  # inner brow raiser
    "AU2": _both("browOuterUp", 1.0),  # outer brow raiser
    "AU4": _both("browDown", 1.0),  # brow lowerer
    "AU5": _both("eyeWide", 1.0),  # upper lid raiser
    "AU6": _both("cheekSquint", 1.0),  # cheek raiser
    "AU7": _both("eyeSquint", 1.0),  # lid tightener
    "AU9": _both("noseSneer", 1.0),  # nose wrinkler
    "AU10": _both("mouthUpperUp", 1.0),  # upper lip raiser
    "AU12": _both("mouthSmile", 1.0),  # lip corner puller
    "AU15": _both("mouthFrown", 1.0),  # lip corner depressor
    "AU17": {"mouthShrugLower": 1.0},  # chin raiser
    "AU20": _both("mouthStretch", 1.0),  # lip stretcher
    "AU23": _both("mouthPress", 1.0),  # lip tightener
    "AU26": {"jawOpen": 1.0},  # jaw drop
}

# Emotion -> {AU: intensity at emotion intensity 1}. EMFACS prototypes, intensities ours.
EMOTION_TO_AU: dict[str, dict[str, float]] = {
    "neutral": {},
    "happy": {"AU6": 0.6, "AU12": 0.7},
    "sad": {"AU1": 0.7, "AU4": 0.3, "AU15": 0.6, "AU17": 0.3},
    "angry": {"AU4": 0.8, "AU5": 0.3, "AU7": 0.5, "AU23": 0.5, "AU9": 0.2},
    "surprised": {"AU1": 0.7, "AU2": 0.8, "AU5": 0.6, "AU26": 0.25},
    "afraid": {"AU1": 0.6, "AU2": 0.4, "AU4": 0.3, "AU5": 0.6, "AU20": 0.5, "AU26": 0.15},
    "disgusted": {"AU9": 0.7, "AU10": 0.4, "AU15": 0.4},
}
EMOTIONS: tuple[str, ...] = tuple(EMOTION_TO_AU)

# ARKit shapes that press the lips together; released fast when the mouth opens.
LIP_CLOSING: tuple[str, ...] = (
    "mouthClose", "mouthPressLeft", "mouthPressRight", "mouthRollLower", "mouthRollUpper",
)  # fmt: skip

# ARKit shapes that open the lips; suppressed where the lips must stay closed.
LIP_OPENING: tuple[str, ...] = (
    "jawOpen", "mouthFunnel", "mouthLowerDownLeft", "mouthLowerDownRight",
    "mouthUpperUpLeft", "mouthUpperUpRight", "tongueOut",
)  # fmt: skip
