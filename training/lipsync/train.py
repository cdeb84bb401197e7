"""Train the audio -> viseme model on the project's own TTS audio (CPU, 1 thread, seeded).

    python -m training.lipsync.train              # synthesize (cached), train, write weights
    python -m training.lipsync.train --evaluate   # held-out figures of the committed weights

Data (export/tts/utterances.py): the 280 'train' sentences of emotion_sentences.json, each
spoken twice by Piper with varied length/noise scales and twice by espeak-ng formant
voices (training/lipsync/espeak.py, TRAIN_VOICES, varied rate and pitch); every pool
draws AUG_COPIES augmentations per utterance (pitch/tempo shift, gain, noise at 10-30 dB
SNR, band limits). Log-mel features are computed once per pool (no gradient through the fixed
front end); the network trains on random CROP-frame windows. Loss: cross-entropy on the
frame's viseme (label smoothing) + MSE on the mouth opening. Weights go to
avatar/animation/lipsync_weights.npz.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import torch

from evals.lipsync import Augment, Utterance, augment, frame_targets
from evals.sentences import sentences
from export.tts.utterances import load_or_synthesize
from networks.lipsync import WEIGHTS, LipsyncNet, parameter_count, save_weights
from training.lipsync import espeak

log = logging.getLogger(__name__)

SEED = 1234
VARIANTS = 2  # Piper renditions of each training sentence
ESPEAK_VARIANTS = 2  # espeak-ng renditions (voices, rates and pitches vary)
AUG_COPIES = 2  # augmented copies per utterance in each pool
POOLS = 3  # fresh augmentation draws over the run
STEPS = 2000
BATCH = 16
CROP = 200  # frames (2 s)
LR = 3e-3
OPENING_WEIGHT = 2.0
LABEL_SMOOTHING = 0.05


def make_pool(
    model: LipsyncNet, utts: list[Utterance], copies: int, rng: np.random.Generator
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Augmented clips -> (log-mel [M, T], labels int64 [T], opening float32 [T]) each."""
    pool = []
    for utt in utts:
        for _ in range(copies):
            audio, scale = augment(utt, Augment.draw(rng), rng)
            with torch.no_grad():
                feats = model.features(torch.from_numpy(audio)[None])[0]
            labels, opening = frame_targets(utt, feats.shape[1], scale)
            pool.append((feats, torch.from_numpy(labels), torch.from_numpy(opening)))
    return pool


def batch_of(pool, rng: np.random.Generator) -> tuple[torch.Tensor, ...]:
    """BATCH random CROP-frame windows: features [B, M, CROP], labels/opening [B, CROP]."""
    feats, labels, opening = [], [], []
    for k in rng.integers(0, len(pool), BATCH):
        f, y, o = pool[k]
        length = f.shape[1]
        if length <= CROP:  # short clip: pad with its own quietest frame and ignore labels
            pad = CROP - length
            f = torch.cat([f, f.min(dim=1, keepdim=True).values.expand(-1, pad)], 1)
            y = torch.cat([y, torch.full((pad,), -100, dtype=torch.int64)])
            o = torch.cat([o, torch.full((pad,), -1.0)])
            start = 0
        else:
            start = int(rng.integers(0, length - CROP + 1))
        feats.append(f[:, start : start + CROP])
        labels.append(y[start : start + CROP])
        opening.append(o[start : start + CROP])
    return torch.stack(feats), torch.stack(labels), torch.stack(opening)


def train(steps: int = STEPS) -> LipsyncNet:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED)
    started = time.perf_counter()
    utts = load_or_synthesize(sentences("train"), VARIANTS, varied=True)
    utts += espeak.load_or_speak(
        sentences("train") * ESPEAK_VARIANTS, espeak.TRAIN_VOICES, seed=SEED
    )
    log.info("%d training utterances, %.0f s of audio (%.0f s to load/synthesize)",
             len(utts), sum(u.duration for u in utts), time.perf_counter() - started)  # fmt: skip
    model = LipsyncNet()
    log.info("parameters: %d", parameter_count(model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, LR, total_steps=steps)
    ce = torch.nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=LABEL_SMOOTHING)
    per_pool = -(-steps // POOLS)
    pool: list = []
    for step in range(steps):
        if step % per_pool == 0:
            t = time.perf_counter()
            pool = make_pool(model, utts, AUG_COPIES, rng)
            log.info("pool of %d clips in %.1f s", len(pool), time.perf_counter() - t)
        model.train()
        feats, labels, opening = batch_of(pool, rng)
        logits, pre = model.classify(feats)
        mask = opening >= 0
        loss = ce(logits, labels) + OPENING_WEIGHT * torch.mean(
            (torch.sigmoid(pre)[mask] - opening[mask]) ** 2
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            accuracy = (logits.argmax(1) == labels)[labels >= 0].float().mean()
            log.info("step %4d  loss %.3f  batch frame accuracy %.3f  (%.0f s)",
                     step, loss.item(), accuracy.item(), time.perf_counter() - started)  # fmt: skip
    log.info("trained in %.1f s", time.perf_counter() - started)
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluate", action="store_true", help="held-out figures only")
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.evaluate:
        started = time.perf_counter()
        model = train(args.steps)
        path = save_weights(model)
        print(f"training time {time.perf_counter() - started:.0f} s (1 thread)")
        print(f"parameters {parameter_count(model)}, weights {path.stat().st_size / 1e6:.2f} MB")
    from training.lipsync.evaluate import evaluate

    evaluate(WEIGHTS)


if __name__ == "__main__":
    main()
