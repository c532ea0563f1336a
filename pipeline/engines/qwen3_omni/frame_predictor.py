"""The code predictor's 15 steps of a codec frame as one step: captured whole on a GPU.

Each codec frame takes the talker LM's first code and then 15 forwards of the code predictor
(a small dense LM with a fresh cache per frame), each choosing one more code by top-k/top-p
sampling. Plainly that is 15 x 5 layers of small kernels and 15 host round trips per frame
(the Talker measured ~130 ms per frame on an H200, for 80 ms of speech). Here the whole loop,
sampling included, runs on the device from static buffers (the talker's last hidden state and
first code per row), so `StepGraphs` captures it as one graph per batch size. Sampling uses
the exponential race (argmax of p / Exp(1) draws from p), which needs no host sync; it draws
from the device's default generator, so frames are random but not reproducible per request
(the plain path, with its per-request seeded generators, stays for CPU tests that need that).
"""

from __future__ import annotations

from typing import Any

import torch

from .compiled_steps import compiled_layer_call
from .sampling import Sampling, sample_rows
from .slot_cache import SlotCache
from .slot_decoder import LayerCall, call_layer, run_layers
from .step_graphs import StepGraphs


class FramePredictor:
    def __init__(
        self,
        talker: Any,
        *,
        rows: int,
        sampling: Sampling,
        capture: bool | None = None,
        compile: bool = False,
    ) -> None:
        predictor = talker.code_predictor
        self.body = predictor.model
        self.heads = predictor.lm_head
        self.tables = predictor.get_input_embeddings()
        self.first_table = talker.get_input_embeddings()
        self.sampling = sampling
        self.codes = len(self.heads)  # codes the predictor adds to the first: 15
        config: Any = self.body.config
        parameter = next(self.body.parameters())
        device, dtype = parameter.device, parameter.dtype
        size = int(config.hidden_size)
        self.cache = SlotCache(
            layers=len(self.body.layers),
            rows=rows,
            kv_heads=int(config.num_key_value_heads),
            max_length=self.codes + 1,
            head_dim=int(getattr(config, "head_dim", None) or size // config.num_attention_heads),
            dtype=dtype,
            device=device,
        )
        self.hidden = torch.zeros(
            rows, 1, int(talker.config.text_config.hidden_size), dtype=dtype, device=device
        )
        self.first = torch.zeros(rows, dtype=torch.long, device=device)
        self.device = device
        self.layer_call: LayerCall = compiled_layer_call() if compile else call_layer
        self.graphs: StepGraphs[tuple[torch.Tensor, torch.Tensor]] = StepGraphs(
            self._frame, largest=rows, device=device, capture=capture
        )

    def _positions(self, batch: int, queries: int) -> torch.Tensor:
        offsets = torch.arange(queries, device=self.device)
        return self.cache.write_at[:batch, None] + offsets

    def _frame(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        write_at = self.cache.write_at[:batch]
        write_at.zero_()
        first = self.first_table(self.first[:batch]).unsqueeze(1)
        hidden = torch.cat((self.hidden[:batch], first), dim=1)
        total = first[:, 0]
        chosen = []
        for group in range(self.codes):
            queries = hidden.shape[1]
            positions = self._positions(batch, queries)
            out, _ = run_layers(
                self.body, hidden, positions, self.cache, layer_call=self.layer_call
            )
            code = sample_rows(self.heads[group](out[:, -1]), self.sampling)
            chosen.append(code)
            write_at += queries
            hidden = self.tables[group](code).unsqueeze(1)
            total = total + hidden[:, 0]  # the last code's embedding is only for this sum
        return torch.stack(chosen, dim=1), total

    def predict(
        self, last_hidden: torch.Tensor, first_codes: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[n, 1, hidden] talker states and each row's first code -> [n, 15] codes and [n,
        hidden], the sum of the frame's 16 code embeddings (the talker LM's next input, less
        the text). Both are the graph's buffers: copy them before the next call."""
        count = last_hidden.shape[0]
        self.hidden[:count].copy_(last_hidden)
        self.first[:count].copy_(torch.tensor(first_codes, device=self.device))
        codes, total = self.graphs.run(count)
        return codes[:count], total[:count]
