"""The audio -> viseme network: log-mel features inside the graph, dilated 1-D convolutions.

Input `audio` [batch, samples] float32, 16 kHz mono in [-1, 1]. Frames are centred STFT
frames every HOP samples (100 Hz): frames = samples // HOP + 1, frame i at i / 100 s.
Outputs `viseme_probs` [batch, frames, 15] (tables.VISEMES order, rows sum to 1) and
`mouth_open` [batch, frames] (0 closed .. ~1, the TTS path's mouth opening).

The STFT is a strided Conv1d with a fixed windowed-DFT basis and the mel filterbank a
fixed matrix, so the exported graph is Pad, Conv, Slice, Pow, Add, MatMul, Log and the
network's Conv/BatchNormalization/Relu/Softmax/Sigmoid (TensorRT-friendly, no STFT/FFT
op). The network sees +-RECEPTIVE_FRAMES frames on each side (+-0.33 s): it is not
causal, a streaming client needs that much look-ahead.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

SAMPLE_RATE = 16000
N_FFT = 512
WIN = 400  # 25 ms Hann window
HOP = 160  # 10 ms: 100 frames/s
N_MELS = 40
F_MIN, F_MAX = 40.0, 7600.0
CHANNELS = 128
DILATIONS = (1, 2, 4, 8, 16)
CLASSES = 15
RECEPTIVE_FRAMES = 2 + sum(DILATIONS)  # on each side
WEIGHTS = Path(__file__).resolve().parent.parent / "avatar/animation/lipsync_weights.npz"


def mel_filterbank() -> np.ndarray:
    """HTK-style triangular mel filters [N_MELS, N_FFT // 2 + 1], unit peak."""

    def mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def hz(m):
        return 700.0 * (10 ** (np.asarray(m) / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(F_MIN), mel(F_MAX), N_MELS + 2))
    freqs = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:, None] - edges[1:-1, None])
    return np.clip(np.minimum(lower, upper), 0.0, None).astype(np.float32)


def dft_basis() -> np.ndarray:
    """Windowed DFT kernels [2 * (N_FFT // 2 + 1), 1, N_FFT]: cosines, then sines."""
    window = np.zeros(N_FFT)
    left = (N_FFT - WIN) // 2
    window[left : left + WIN] = np.hanning(WIN + 1)[:-1]
    n = np.arange(N_FFT)
    k = np.arange(N_FFT // 2 + 1)[:, None]
    angle = 2 * np.pi * k * n / N_FFT
    basis = np.concatenate([np.cos(angle), np.sin(angle)]) * window
    return basis[:, None, :].astype(np.float32)


class LogMel(nn.Module):
    """audio [B, N] -> log-mel [B, N_MELS, N // HOP + 1] (centred frames, zero padding)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("basis", torch.from_numpy(dft_basis()), persistent=False)
        self.register_buffer("mel", torch.from_numpy(mel_filterbank()), persistent=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        x = nn.functional.pad(audio[:, None, :], (N_FFT // 2, N_FFT // 2))
        spec = nn.functional.conv1d(x, self.basis, stride=HOP)  # [B, 2F, T]
        half = spec.shape[1] // 2
        power = spec[:, :half] ** 2 + spec[:, half:] ** 2  # [B, F, T]
        return torch.log(torch.matmul(self.mel, power) + 1e-6)  # [B, M, T]


class Block(nn.Module):
    """Residual dilated conv: x + 1x1(ReLU(BN(conv_k3_dilated(x)))), [B, C, T] -> same."""

    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 3, padding=dilation, dilation=dilation)
        self.norm = nn.BatchNorm1d(channels)
        self.mix = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mix(torch.relu(self.norm(self.conv(x))))


class LipsyncNet(nn.Module):
    """audio [B, N] -> (viseme_probs [B, T, 15], mouth_open [B, T]), T = N // HOP + 1."""

    def __init__(self) -> None:
        super().__init__()
        self.features = LogMel()
        self.input_norm = nn.BatchNorm1d(N_MELS)
        self.conv_in = nn.Conv1d(N_MELS, CHANNELS, 5, padding=2)
        self.blocks = nn.Sequential(*(Block(CHANNELS, d) for d in DILATIONS))
        self.out_norm = nn.BatchNorm1d(CHANNELS)
        self.visemes = nn.Conv1d(CHANNELS, CLASSES, 1)
        self.opening = nn.Conv1d(CHANNELS, 1, 1)

    def classify(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-mel [B, M, T] -> viseme logits [B, 15, T], opening pre-activation [B, T]."""
        x = self.input_norm(feats)
        x = torch.relu(self.out_norm(self.blocks(torch.relu(self.conv_in(x)))))
        return self.visemes(x), self.opening(x)[:, 0]

    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, opening = self.classify(self.features(audio))
        return torch.softmax(logits.transpose(1, 2), dim=-1), torch.sigmoid(opening)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save_weights(model: LipsyncNet, path: Path = WEIGHTS) -> Path:
    """State dict (parameters and BatchNorm statistics) as float32 arrays in an .npz."""
    arrays = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    arrays = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in arrays.items()}
    np.savez_compressed(path, **arrays)
    return Path(path)


def load_model(path: Path = WEIGHTS) -> LipsyncNet:
    """The committed network in eval mode (raises if the file does not match the code)."""
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"{path}: no lipsync weights; run `python -m training.lipsync.train`"
        )
    model = LipsyncNet()
    with np.load(path) as data:
        state = {k: torch.from_numpy(np.array(data[k])) for k in data.files}
    model.load_state_dict(state, strict=True)
    return model.eval()
