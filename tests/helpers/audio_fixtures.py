"""Audio test fixtures: wav bytes of a clip, and a transformers ClapModel's weights made random
enough that every parameter matters (the CLAP parity, fused-CLAP engine and audio main-job
tests)."""

import io
import wave

import numpy as np


def wav_bytes(x, rate: int) -> bytes:
  """A mono 16-bit PCM wav file of ``x`` (T,) floats in [-1, 1] at ``rate`` Hz."""
  buf = io.BytesIO()
  with wave.open(buf, "wb") as w:
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(rate)
    w.writeframes(np.round(np.asarray(x) * 32767).astype("<i2").tobytes())
  return buf.getvalue()


def randomise_clap(model, torch) -> None:
  """In place, under ``torch.no_grad``: norms, biases and position-bias tables moved by 0.1
  N(0, 1); batch-norm statistics of dB-like scale for the mel batch norm, near (0, 1)
  elsewhere. Seed torch first."""
  with torch.no_grad():
    for n, p in model.named_parameters():
      if "norm" in n.lower() or n.endswith("bias") or n.endswith("bias_table"):
        p.add_(0.1 * torch.randn_like(p))
    for n, b in model.named_buffers():
      mel = n.startswith("audio_model.audio_encoder.batch_norm")
      if n.endswith("running_mean"):
        b.copy_(-40 + 5 * torch.randn_like(b) if mel else 0.3 * torch.randn_like(b))
      elif n.endswith("running_var"):
        b.copy_(100 + 300 * torch.rand_like(b) if mel else 0.5 + torch.rand_like(b))
