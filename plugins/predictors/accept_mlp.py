"""AccEPT's latency predictor f(s, h) (notes 2.1): a dual-stream regression of four dense layers.

Stream one reads the sub-model's binary unit mask s through two dense layers; their output joins
the device's hardware vector h (log seconds of its 10 representative sub-models, standardised)
and two more dense layers give the log of the sub-model's forward+backward seconds. The paper
fixes only "four fully-connected layers, dual-stream"; ReLU, the log-time target with mean squared
error (about the relative error the +-5 % metric counts), Adam and full batches are the notes'
proposal; the width 128 (the notes: 64) and the cosine-decayed rate from 3e-3 are ours: on the
synthetic devices width 64 reached 81 % within 5 % where 128 reached 88 %. `adapt` is the paper's adaptive update: training goes on over
the pre-training set joined with a new device's own measurements (D u D^; a replayed sample of D),
the new ones repeated so that a handful weigh as much as a device's worth of pre-training rows.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from framework.lean_torch import optimizers_without_dynamo


class DualStream(nn.Module):
    def __init__(self, L: int, hw: int = 10, width: int = 128):
        super().__init__()
        self.s_stream = nn.Sequential(nn.Linear(L, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(width + hw, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, s: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.s_stream(s), h], dim=1)).squeeze(1)


class LatencyPredictor:
    """Fit on rows (mask, h, seconds); predict seconds."""

    def __init__(self, L: int, seed: int = 0, width: int = 128):
        torch.manual_seed(seed)
        self.net = DualStream(L, width=width)
        self.h_mean = self.h_std = None
        self.y_mean = 0.0
        self.data: tuple | None = None

    def _h(self, h: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((np.log(h) - self.h_mean) / self.h_std).astype(np.float32))

    def fit(self, masks: np.ndarray, hs: np.ndarray, seconds: np.ndarray, epochs: int = 1500, lr: float = 3e-3) -> "LatencyPredictor":
        logh = np.log(hs)
        self.h_mean, self.h_std = logh.mean(0), logh.std(0) + 1e-9
        self.y_mean = float(np.log(seconds).mean())
        self.data = (masks, hs, seconds)
        self._train(masks, hs, seconds, epochs, lr)
        return self

    def adapt(self, masks: np.ndarray, hs: np.ndarray, seconds: np.ndarray, epochs: int = 200, lr: float = 1e-3, replay: int = 2048, seed: int = 0) -> "LatencyPredictor":
        """Continue training on D u D^: the new device's rows D^ beside `replay` rows drawn from
        the pre-training set D (continual learning without replaying all of D every time: with
        100 devices, a full pass per update cost 18 s), D^ repeated to weigh as much as one
        device's worth of D."""
        if self.data is None:
            raise ValueError("adapt continues training on the pre-training set: fit the predictor first (a loaded one has no set)")
        m0, h0, y0 = self.data
        pick = np.random.default_rng(seed).choice(len(m0), min(replay, len(m0)), replace=False)
        per_device = max(1, len(m0) // max(len(np.unique(h0[:, 0])), 1))
        rep = lambda a: np.concatenate([a] * max(1, per_device // max(len(masks), 1)))  # noqa: E731
        self._train(np.concatenate([m0[pick], rep(masks)]), np.concatenate([h0[pick], rep(hs)]), np.concatenate([y0[pick], rep(seconds)]), epochs, lr)
        return self

    def _train(self, masks, hs, seconds, epochs: int, lr: float) -> None:
        optimizers_without_dynamo()  # Adam would import torch._dynamo (2-7 s) otherwise
        s, h = torch.from_numpy(masks.astype(np.float32)), self._h(hs)
        y = torch.from_numpy((np.log(seconds) - self.y_mean).astype(np.float32))
        opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs, eta_min=lr / 30)
        self.net.train()
        for _ in range(epochs):
            opt.zero_grad()
            loss = nn.functional.mse_loss(self.net(s, h), y)
            loss.backward()
            opt.step()
            sched.step()

    def tensors(self) -> dict[str, torch.Tensor]:
        """The trained predictor as tensors (weights and the input and target normalisation), for a
        safetensors file; `load_tensors` reads them back."""
        out = {f"net.{k}": v.contiguous() for k, v in self.net.state_dict().items()}
        out.update(h_mean=torch.from_numpy(np.asarray(self.h_mean)), h_std=torch.from_numpy(np.asarray(self.h_std)), y_mean=torch.tensor(self.y_mean, dtype=torch.float64))
        return out

    def load_tensors(self, t: dict[str, torch.Tensor]) -> "LatencyPredictor":
        self.net.load_state_dict({k[4:]: v for k, v in t.items() if k.startswith("net.")})
        self.h_mean, self.h_std, self.y_mean = t["h_mean"].numpy(), t["h_std"].numpy(), float(t["y_mean"])
        return self

    @torch.no_grad()
    def predict(self, masks: np.ndarray, hs: np.ndarray) -> np.ndarray:
        self.net.eval()
        return np.exp(self.net(torch.from_numpy(masks.astype(np.float32)), self._h(hs)).numpy().astype(np.float64) + self.y_mean)
